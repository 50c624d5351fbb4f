"""Corpus-level BLEU and chrF with sacreBLEU, reported with their signatures."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

from sacrebleu.metrics import BLEU, CHRF

from attn_cli.languages import bleu_tokenizer


@dataclass(frozen=True)
class Score:
    name: str
    score: float
    signature: str

    def __str__(self) -> str:
        return f"{self.name} = {self.score:.2f}  ({self.signature})"


def score_translations(hypotheses: Sequence[str], references: Sequence[str], target_language: str) -> list[Score]:
    if len(hypotheses) != len(references):
        raise ValueError(
            f"{len(hypotheses)} hypotheses but {len(references)} references; they must pair up line by line"
        )
    bleu = BLEU(tokenize=bleu_tokenizer(target_language))
    chrf = CHRF()
    refs = [list(references)]
    bleu_score = bleu.corpus_score(list(hypotheses), refs)
    chrf_score = chrf.corpus_score(list(hypotheses), refs)
    return [
        Score("BLEU", bleu_score.score, str(bleu.get_signature())),
        Score("chrF", chrf_score.score, str(chrf.get_signature())),
    ]
