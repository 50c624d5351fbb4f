"""Scores by source length, and the defects that grow with it: `attn eval --by-length`.

Sentences are bucketed by the number of words (whitespace-separated) of their source. Per bucket:
BLEU and chrF, the length ratio (hypothesis characters over reference characters), the stutter rate
(outputs in which a unit of 1 to 4 characters repeats three times or more in a row, e.g. 叔叔叔叔
or 一座一座一座, but not digits as in 10000: decoding/stutter.py), against the same rate in the
references, since "哈哈哈" is sometimes right, the count of outputs with a loop (a span of 3 or more
characters three times back to back, as in 她就说她就说她就说: decoding/loops.py) against the
references' count, and the count of U+FFFD, the character a byte sequence that is not valid UTF-8
decodes to.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

from attn_cli.decoding.loops import loops
from attn_cli.decoding.scoring import score_translations
from attn_cli.decoding.stutter import stutters

# Upper bounds, in source words, of the buckets; the last bucket is everything longer.
BUCKET_BOUNDS = (8, 15)
REPLACEMENT_CHARACTER = "\ufffd"


@dataclass
class BucketScores:
    name: str  # e.g. "<= 8", "9-15", "> 15"
    pairs: int
    bleu: float
    chrf: float
    length_ratio: float  # hypothesis characters / reference characters
    stutter_rate: float  # share of hypotheses that stutter
    reference_stutter_rate: float
    loops: int  # hypotheses with a loop
    reference_loops: int
    replacement_characters: int  # U+FFFD in the hypotheses

    def as_dict(self) -> dict:
        return dict(self.__dict__)


def bucket_name(index: int) -> str:
    if index == 0:
        return f"<= {BUCKET_BOUNDS[0]}"
    if index == len(BUCKET_BOUNDS):
        return f"> {BUCKET_BOUNDS[-1]}"
    return f"{BUCKET_BOUNDS[index - 1] + 1}-{BUCKET_BOUNDS[index]}"


def bucket_of(source: str) -> int:
    words = len(source.split())
    return next((index for index, bound in enumerate(BUCKET_BOUNDS) if words <= bound), len(BUCKET_BOUNDS))


def scores_by_length(
    sources: Sequence[str], hypotheses: Sequence[str], references: Sequence[str], target_language: str
) -> list[BucketScores]:
    """One row per bucket that holds sentences, then one for all of them."""
    buckets: dict[int, list[int]] = {}
    for row, source in enumerate(sources):
        buckets.setdefault(bucket_of(source), []).append(row)
    rows = [
        _scores(bucket_name(index), [hypotheses[r] for r in members], [references[r] for r in members], target_language)
        for index, members in sorted(buckets.items())
    ]
    return rows + [_scores("all", list(hypotheses), list(references), target_language)]


def _scores(name: str, hypotheses: list[str], references: list[str], target_language: str) -> BucketScores:
    bleu, chrf = score_translations(hypotheses, references, target_language)
    reference_characters = sum(len(r) for r in references)
    return BucketScores(
        name,
        len(hypotheses),
        bleu.score,
        chrf.score,
        sum(len(h) for h in hypotheses) / reference_characters if reference_characters else float("nan"),
        sum(map(stutters, hypotheses)) / len(hypotheses),
        sum(map(stutters, references)) / len(references),
        sum(map(loops, hypotheses)),
        sum(map(loops, references)),
        sum(h.count(REPLACEMENT_CHARACTER) for h in hypotheses),
    )


def format_table(rows: Sequence[BucketScores]) -> str:
    """A Markdown table: what `attn eval --by-length` prints."""
    lines = [
        "| source words | pairs | BLEU | chrF | length ratio | stutter (references) | loops (references) | U+FFFD |",
        "|---|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for row in rows:
        lines.append(
            f"| {row.name} | {row.pairs:,} | {row.bleu:.2f} | {row.chrf:.2f} | {row.length_ratio:.2f} | "
            f"{row.stutter_rate:.1%} ({row.reference_stutter_rate:.1%}) | {row.loops} ({row.reference_loops}) | "
            f"{row.replacement_characters} |"
        )
    return "\n".join(lines)
