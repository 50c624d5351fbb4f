"""The CTranslate2 engine: a model directory written by `attn export`, searched with CTranslate2's
Translator, and the layout of that directory, which `attn export` writes and this engine reads.

The searcher decodes a batch of parts as attn's own searches do, so the rest of the translation path
(long inputs, batching, n-best, output formats) is shared: the same output bounds per sentence
(at most a * source length + b tokens, and within the training pairs' lengths when the export kept
them), padding and BOS never emitted, empty translations allowed, and hypotheses ranked with attn's
GNMT length penalty. CTranslate2's own penalty (log P / length^alpha)
is a different formula, so its beam is asked for raw log-probabilities (`length_penalty=0`) and all
of its finished hypotheses, which are then ranked here. Its beam stops once beam_size hypotheses
have finished, attn's once no live one can beat them: on a trained model the two agree
(docs/decoding.md). It forces no prefix, places no terms, gives no attention, and keeps attn's
output rules only as far as CTranslate2's own options reach (`Capabilities`): a sentence whose
output loops (decode.no_loops) is decoded again with CTranslate2's `no_repeat_ngram_size`.

Imports neither torch nor the model: a command that decodes with an export starts in a fraction of
the time a checkpoint takes.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Sequence
from dataclasses import dataclass
from itertools import groupby
from pathlib import Path
from typing import Any, Optional

import numpy as np
import yaml

from attn_cli.config import DEVICE_PATTERN, Config, ConfigError, DecodeConfig, config_from_dict
from attn_cli.data.lengths import LengthModel
from attn_cli.data.tokenizer import Tokenizers
from attn_cli.decoding.engine import Capabilities, Searcher, SearchStopped, StopCheck
from attn_cli.decoding.glossary import TokenTerm
from attn_cli.decoding.hypothesis import Hypothesis
from attn_cli.decoding.loops import LoopVocabulary, token_loop
from attn_cli.decoding.records import Part
from attn_cli.errors import UserError
from attn_cli.vocab import BOS_ID, EOS_ID, PAD_ID

CONFIG_FILE = "attn.yaml"  # the run's config, beside CTranslate2's model.bin
LENGTHS_FILE = "lengths.json"  # the training pairs' lengths (data/lengths.py), when the checkpoint kept them
# decode.no_loops, as far as CTranslate2 allows: a looping output is decoded again with no token
# bigram twice, which leaves no room for a third copy of any span. Stricter than the rule (a bigram
# may well come twice in a sentence), so only the sentences that looped are decoded again.
RETRY_NO_REPEAT_NGRAM = 2
TOKENIZER_DIR = "tokenizer"
# Sinusoidal positions have no end in attn; CTranslate2 needs a table, and this many rows is far
# beyond what a sentence takes (a longer input is split before it reaches the model).
SINUSOIDAL_ROWS = 1024

CAPABILITIES = Capabilities(
    "CTranslate2", "ctranslate2", prefix=False, terms=False, attention=False, output_rules=False, sampling=True
)


class ExportError(UserError):
    pass


def import_ctranslate2():
    try:
        import ctranslate2
    except ImportError:
        raise ExportError(
            'CTranslate2 is not installed; install it with `pip install "attn-cli[ct2]"` '
            '(from a checkout: pip install -e ".[ct2]")'
        ) from None
    return ctranslate2


def position_rows(config: Config) -> int:
    """How many positions the exported table holds: a learned table's own, or sinusoidal rows enough."""
    if config.model.positions == "learned":
        return config.model.max_positions
    return max(SINUSOIDAL_ROWS, config.model.max_positions)


@dataclass
class CTranslate2Engine:
    config: Config
    tokenizers: Tokenizers
    translator: Any  # ctranslate2.Translator
    directory: Path
    ctranslate2: Any  # the module
    open_translator: Any  # () -> a new ctranslate2.Translator of this directory
    adds_source_eos: bool = True  # CTranslate2 ends each source with EOS itself (exports before it did not)
    seeded: bool = False
    capabilities: Capabilities = CAPABILITIES
    lengths: Optional[LengthModel] = None  # the training pairs' lengths, when the export kept them
    _loop_vocabulary: Optional[LoopVocabulary] = None  # what decode.no_loops needs of the target ids

    @property
    def paths(self) -> list[Path]:
        return [self.directory]

    @property
    def max_source_tokens(self) -> int:
        return self.config.model.max_sequence_tokens

    @property
    def max_target_tokens(self) -> Optional[int]:
        return position_rows(self.config) - 1  # one row kept for the EOS

    def searcher(self, options: DecodeConfig, stop: Optional[StopCheck] = None) -> Searcher:
        def search(
            parts: Sequence[Part], terms: Optional[Sequence[Sequence[TokenTerm]]] = None
        ) -> list[list[Hypothesis]]:
            if stop is not None and stop():  # CTranslate2's own search cannot be stopped once begun
                raise SearchStopped("the search was asked to stop")
            if terms is not None:
                raise ValueError("CTranslate2 has no constrained search; check the engine's refusals first")
            if any(part.prefix for part in parts):  # never dropped without a word
                raise ValueError("CTranslate2 does not force a prefix; check the engine's refusals first")
            return self.search([list(part.ids) for part in parts], options)

        return search

    def attention(self, part: Part, tokens: Sequence[int]):
        raise ValueError("CTranslate2 gives no attention weights; check the engine's refusals first")

    def search(self, sources: list[list[int]], options: DecodeConfig) -> list[list[Hypothesis]]:
        """The configured search over source ids (without EOS), each source's hypotheses best first.

        CTranslate2 takes one length floor and limit per call, where attn's own search has one per
        sentence: the batch goes in whole with the lowest floor and the highest limit, and a sentence
        whose output falls outside its own bounds is decoded again with them, with the others that
        share them. For greedy search that is exactly each sentence's own decoding (an output that
        ends within its bounds never met them); a beam may rank otherwise in rare cases."""
        bounds = [self._bounds(len(ids), options) for ids in sources]
        # CTranslate2 appends the EOS itself, unless the export predates that.
        batch = [self.tokenizers.source.id_to_piece(ids if self.adds_source_eos else [*ids, EOS_ID]) for ids in sources]
        floor, limit = min((f for f, _ in bounds), default=0), max((m for _, m in bounds), default=0)
        results = self._translate(batch, floor, limit, options)
        outside = [row for row, found in enumerate(results) if not self._within(found, bounds[row])]
        self._again(results, outside, batch, bounds, options)
        if options.no_loops and not options.sample:
            if self._loop_vocabulary is None:
                self._loop_vocabulary = LoopVocabulary.of(self.tokenizers.target.piece_texts())
            looping = [
                row for row, found in enumerate(results) if found and token_loop(found[0].tokens, self._loop_vocabulary)
            ]
            # Decoded again with no token bigram twice.
            stricter = dataclasses.replace(options, no_repeat_ngram=RETRY_NO_REPEAT_NGRAM)
            self._again(results, looping, batch, bounds, stricter)
        return results

    def _again(self, results, rows: list[int], batch, bounds, options: DecodeConfig) -> None:
        """Decode `rows` of the batch again, each with its own bounds (one call per floor and limit)."""
        for (floor, limit), group in groupby(sorted(rows, key=lambda row: bounds[row]), key=lambda row: bounds[row]):
            group = list(group)
            for row, found in zip(group, self._translate([batch[row] for row in group], floor, limit, options)):
                results[row] = found

    @staticmethod
    def _within(found: list[Hypothesis], bounds: tuple[int, int]) -> bool:
        """Whether every hypothesis kept lies within (floor, limit) output tokens."""
        floor, limit = bounds
        return all(floor <= len(hypothesis.tokens) <= limit for hypothesis in found)

    def _bounds(self, source_length: int, options: DecodeConfig) -> tuple[int, int]:
        """(floor, limit) of an output's tokens, as attn's own search sets them (decoding/search.py)."""
        limit = int(options.max_len_a * source_length) + options.max_len_b
        floor = 0
        if options.learned_lengths and self.lengths is not None:
            shortest, longest = self.lengths.bounds([source_length])
            floor, limit = int(shortest[0]), min(limit, int(longest[0]))
        # Capped where the exported position table ends (a learned one ends where attn's does; a
        # sinusoidal one, endless in attn, was written out to a fixed length), one row kept for the EOS.
        limit = min(limit, position_rows(self.config) - 1)
        return min(floor, limit), limit

    def _translate(
        self, batch: list[list[str]], floor: int, limit: int, options: DecodeConfig
    ) -> list[list[Hypothesis]]:
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
        # lets a translation be empty (EOS first) unless its floor says otherwise, where CTranslate2's
        # default minimum is one token.
        results = self.translator.translate_batch(
            batch,
            max_decoding_length=limit,
            min_decoding_length=floor,
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


def load_exported(directory: Path, device: str = "cpu", threads: int = 0) -> CTranslate2Engine:
    """The model `attn export` wrote to `directory`, on "auto", "cpu" or "cuda[:N]" (a bad name is
    reported as --device's)."""
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
    kind, _, index = _device(device, ctranslate2).partition(":")

    def open_translator():
        return ctranslate2.Translator(
            str(directory), device=kind, device_index=int(index or 0), intra_threads=threads, inter_threads=1
        )

    try:
        translator = open_translator()
    except (RuntimeError, ValueError) as error:
        raise ExportError(f"CTranslate2 cannot load {directory}: {str(error).splitlines()[0]}") from None
    engine = CTranslate2Engine(config, tokenizers, translator, directory, ctranslate2, open_translator, adds_source_eos)
    engine.lengths = _lengths(directory)
    return engine


def _lengths(directory: Path) -> Optional[LengthModel]:
    """The training pairs' lengths the export kept; None for an export of a checkpoint without them."""
    path = directory / LENGTHS_FILE
    if not path.is_file():
        return None
    try:
        return LengthModel.from_counts(np.array(json.loads(path.read_text(encoding="utf-8"))["counts"]))
    except (ValueError, KeyError, TypeError) as error:
        raise ExportError(f"{path} is damaged: {str(error).splitlines()[0]}; export the model again") from None


def _adds_source_eos(directory: Path) -> bool:
    """Whether CTranslate2 ends each source with EOS itself, as exports since `add_source_eos` do;
    an older export is given the EOS with the source."""
    try:
        return bool(json.loads((directory / "config.json").read_text(encoding="utf-8")).get("add_source_eos"))
    except (OSError, ValueError):
        return False  # CTranslate2 reads the same file, and says what is wrong with it


def _device(name: str, ctranslate2) -> str:
    """CTranslate2's device for a --device setting, the GPUs counted by CTranslate2 (not torch)."""
    if not DEVICE_PATTERN.fullmatch(name):
        raise ConfigError(f"{name!r} is not a device; use auto, cpu, cuda or cuda:N", "--device")
    gpus = ctranslate2.get_cuda_device_count()
    if name == "auto":
        return "cuda" if gpus else "cpu"
    if name.startswith("cuda") and int(name.partition(":")[2] or 0) >= gpus:
        raise ConfigError(f"{name} but {gpus} CUDA GPUs are visible; use auto or cpu", "--device")
    return name
