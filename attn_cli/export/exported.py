"""A CTranslate2 model directory written by `attn export`, searched with CTranslate2's Translator.

`ExportedModel.search` decodes a batch of source ids as attn's own searches do, so the rest of the
translation path (long inputs, batching, n-best, output formats) is shared: the same output limits
per sentence (a * source length + b tokens), padding and BOS never emitted, empty translations
allowed, and hypotheses ranked with attn's GNMT length penalty. CTranslate2's own penalty
(log P / length^alpha) is a different formula, so its beam is asked for raw log-probabilities
(`length_penalty=0`) and all of its finished hypotheses, which are then ranked here. Its beam
stops once beam_size hypotheses have finished, attn's once no live one can beat them: on a
trained model the two agree (docs/decoding.md).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from itertools import groupby
from pathlib import Path
from typing import Any

import numpy as np
import torch
import yaml

from attn_cli.config import Config, ConfigError, DecodeConfig, config_from_dict
from attn_cli.data.tokenizer import Tokenizers
from attn_cli.decoding.hypothesis import Hypothesis
from attn_cli.export.convert import CONFIG_FILE, TOKENIZER_DIR, ExportError, import_ctranslate2, position_rows
from attn_cli.vocab import BOS_ID, EOS_ID, PAD_ID


@dataclass
class ExportedModel:
    config: Config
    tokenizers: Tokenizers
    translator: Any  # ctranslate2.Translator
    directory: Path
    ctranslate2: Any  # the module
    open_translator: Any  # () -> a new ctranslate2.Translator of this directory
    adds_source_eos: bool = True  # CTranslate2 ends each source with EOS itself (exports before it did not)
    seeded: bool = False

    def search(self, src: torch.Tensor, options: DecodeConfig) -> list[list[Hypothesis]]:
        """The configured search over one batch (B, S) of source ids, each ending in EOS."""
        sources = [row[row != PAD_ID].tolist() for row in src]
        limits = [self._limit(len(ids) - 1, options) for ids in sources]  # the EOS is not counted
        results: list[list[Hypothesis]] = [[] for _ in sources]
        # CTranslate2 takes one length limit per call: sentences that share one go together.
        order = sorted(range(len(sources)), key=lambda row: limits[row])
        for limit, rows in groupby(order, key=lambda row: limits[row]):
            rows = list(rows)
            # CTranslate2 appends the EOS the ids end in itself, unless the export predates that.
            given = [sources[row][:-1] if self.adds_source_eos else sources[row] for row in rows]
            batch = [self.tokenizers.source.id_to_piece(ids) for ids in given]
            for row, found in zip(rows, self._translate(batch, limit, options)):
                results[row] = found
        return results

    def _limit(self, source_length: int, options: DecodeConfig) -> int:
        # Capped where the exported position table ends (a learned one ends where attn's does; a
        # sinusoidal one, endless in attn, was written out to a fixed length), one row kept for the EOS.
        limit = int(options.max_len_a * source_length) + options.max_len_b
        return min(limit, position_rows(self.config) - 1)

    def _translate(self, batch: list[list[str]], limit: int, options: DecodeConfig) -> list[list[Hypothesis]]:
        target = self.tokenizers.target
        never = [[piece] for piece in target.id_to_piece([PAD_ID, BOS_ID])]
        searching = dict(beam_size=options.beam_size, num_hypotheses=options.beam_size, length_penalty=0.0)
        if options.sample:
            searching = dict(
                beam_size=1,
                num_hypotheses=options.n_best,
                sampling_topk=options.top_k,
                sampling_topp=options.top_p,
                sampling_temperature=options.temperature,
            )
            if options.seed is not None and not self.seeded:
                # Each Translator's sampling threads draw from generators seeded when it is made.
                self.ctranslate2.set_random_seed(options.seed)
                self.translator, self.seeded = self.open_translator(), True
        elif options.beam_size == 1:
            searching = dict(beam_size=1, num_hypotheses=1, length_penalty=0.0)
        # A hypothesis that reaches the limit is one attn ends there with a forced EOS: CTranslate2
        # stops it without one, so the EOS's log-probability is added, to rank as in attn. And attn
        # lets a translation be empty (EOS first), where CTranslate2's default minimum is one token.
        results = self.translator.translate_batch(
            batch,
            max_decoding_length=limit,
            min_decoding_length=0,
            max_input_length=0,
            return_scores=True,
            suppress_sequences=never,
            no_repeat_ngram_size=options.no_repeat_ngram,
            **searching,
        )
        found = []
        for source, result in zip(batch, results):
            at_limit = [pieces for pieces in result.hypotheses if len(pieces) >= limit]
            forced_eos = iter(self._eos_log_probs(source, at_limit, limit))
            hypotheses = []
            for pieces, log_prob in zip(result.hypotheses, result.scores):
                if len(pieces) >= limit:
                    log_prob += next(forced_eos)
                ids = [target.piece_to_id(piece) for piece in pieces]
                hypotheses.append(Hypothesis.scored(ids, log_prob, len(ids) + 1, options.length_penalty))
            hypotheses.sort(key=lambda h: h.score, reverse=True)
            found.append(hypotheses if options.sample else hypotheses[: options.n_best])
        return found

    def _eos_log_probs(self, source: list[str], prefixes: list[list[str]], limit: int) -> list[float]:
        """log P(EOS) after each prefix, from the distribution attn draws from: padding and BOS
        taken out, the rest renormalised."""
        if not prefixes:
            return []
        results = self.translator.translate_batch(
            [source] * len(prefixes),
            target_prefix=prefixes,
            beam_size=1,
            max_decoding_length=limit + 1,
            max_input_length=0,
            return_logits_vocab=True,
        )
        found = []
        for result in results:
            logits = np.array(result.logits[0][-1], dtype=np.float64)  # the step after the prefix
            logits[[PAD_ID, BOS_ID]] = -np.inf
            top = logits.max()
            found.append(float(logits[EOS_ID] - top - np.log(np.exp(logits - top).sum())))
        return found


def is_exported(path: Path) -> bool:
    return (path / CONFIG_FILE).is_file() and (path / "model.bin").is_file()


def load_exported(directory: Path, device: str = "cpu", threads: int = 0) -> ExportedModel:
    """The model `attn export` wrote to `directory`, on "cpu" or "cuda[:N]"."""
    ctranslate2 = import_ctranslate2()
    if not is_exported(directory):
        raise ExportError(
            f"{directory} is not a model `attn export` wrote (no {CONFIG_FILE} and model.bin); "
            f"make one with `attn export --run RUN --output {directory}`"
        )
    try:
        config = config_from_dict(yaml.safe_load((directory / CONFIG_FILE).read_text(encoding="utf-8")))
    except (ConfigError, yaml.YAMLError) as error:
        raise ExportError(f"{directory / CONFIG_FILE} is damaged: {str(error).splitlines()[0]}") from None
    tokenizers = Tokenizers.load(directory / TOKENIZER_DIR)
    adds_source_eos = _adds_source_eos(directory)
    kind, _, index = device.partition(":")

    def open_translator():
        return ctranslate2.Translator(
            str(directory), device=kind, device_index=int(index or 0), intra_threads=threads, inter_threads=1
        )

    try:
        translator = open_translator()
    except (RuntimeError, ValueError) as error:
        raise ExportError(f"CTranslate2 cannot load {directory}: {str(error).splitlines()[0]}") from None
    return ExportedModel(config, tokenizers, translator, directory, ctranslate2, open_translator, adds_source_eos)


def _adds_source_eos(directory: Path) -> bool:
    """Whether CTranslate2 ends each source with EOS itself, as exports since `add_source_eos` do;
    an older export is given the EOS with the source."""
    try:
        return bool(json.loads((directory / "config.json").read_text(encoding="utf-8")).get("add_source_eos"))
    except (OSError, ValueError):
        return False  # CTranslate2 reads the same file, and says what is wrong with it
