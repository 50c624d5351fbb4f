"""Typed, validated configuration loaded from YAML.

Every section is a frozen dataclass. `load_config` reads a YAML file, applies `--set key=value`
overrides and builds the dataclasses, checking types and values before any work starts. Every
error names the full YAML path of the offending key and says how to fix it.
"""

from __future__ import annotations

import contextlib
import dataclasses
import difflib
import math
import re
import string
import types
import typing
from collections.abc import Mapping
from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path
from typing import Any, Literal, NoReturn, Optional, Union

import yaml

from attn_cli.languages import Direction, primary_subtag, target_tag, unwritten_target

DEVICE_PATTERN = re.compile(r"auto|cpu|cuda(:\d+)?")


class ConfigError(ValueError):
    """A configuration problem: `problem` says what is wrong and how to fix it, `key` names the
    setting at fault (a dotted YAML key such as "decode.n_best", or the command-line option that set
    it, such as "--device" or "--set 'x'"; None for a problem of a whole file), and `config_file` is
    the file the setting came from, when one did. str() reads "config_file: key: problem".

    A problem that names another setting writes it as a `$placeholder`, which reads as its own name
    ("$beam_size" as "beam_size"), and `mentions` maps each placeholder to that setting's dotted key.
    The key and the mentions are kept apart from the text so that a reader can call them its own
    way (the command line calls them by its flags) without rewriting the message.
    """

    def __init__(
        self,
        problem: str,
        key: Optional[str] = None,
        *,
        mentions: Optional[Mapping[str, str]] = None,
        config_file: Optional[str | Path] = None,
    ):
        self.problem, self.key, self.config_file = problem, key, config_file
        self.mentions = dict(mentions or {})
        super().__init__(self.describe())

    def describe(self, names: Optional[Mapping[str, Optional[str]]] = None) -> str:
        """The message, with each key called what `names` maps it to (a key missing from `names`
        keeps its dotted name, a placeholder its own name; a key named None leaves its prefix out)."""
        names = names or {}
        problem = self.problem
        if self.mentions:  # safe_substitute: a "$" that is no placeholder is left as it is
            problem = string.Template(problem).safe_substitute(
                {placeholder: names.get(key, placeholder) for placeholder, key in self.mentions.items()}
            )
        name = names.get(self.key, self.key) if self.key is not None else None
        where = f"{self.config_file}: " if self.config_file is not None else ""
        return f"{where}{name}: {problem}" if name is not None else f"{where}{problem}"

    def in_file(self, config_file: str | Path) -> "ConfigError":
        """This problem, as found in `config_file`."""
        return ConfigError(self.problem, self.key, mentions=self.mentions, config_file=config_file)


def _fail(key: str, problem: str) -> NoReturn:
    raise ConfigError(problem, key or None)  # "" is the top level: the whole file


LARGEST_WHOLE_NUMBER = 2**63 - 1  # what torch and the C libraries below it take as a whole number


def _check_numbers(section: Any, path: str) -> None:
    """Every number of a config section, before its own ranges: whole numbers that fit the 64 bits
    they become, and floats that are numbers (YAML's .nan and .inf are not)."""
    for item in dataclasses.fields(section):
        value = getattr(section, item.name)
        for position, number in enumerate(value if isinstance(value, tuple) else (value,)):
            key = f"{path}.{item.name}" + (f"[{position}]" if isinstance(value, tuple) else "")
            if isinstance(number, bool):
                continue
            if isinstance(number, int) and abs(number) > LARGEST_WHOLE_NUMBER:
                _fail(key, f"{number} is out of range; whole numbers here go up to {LARGEST_WHOLE_NUMBER:,}")
            if isinstance(number, float) and not math.isfinite(number):
                _fail(key, f"{number} is not a usable number; give a finite one")


def _at_most(key: str, value: Optional[int | float], limit: int | float, why: str) -> None:
    if value is not None and value > limit:
        _fail(key, f"{value:,} is more than {limit:,}, the largest attn takes: {why}")


MIN_TEMPERATURE, MAX_TEMPERATURE = 0.01, 100.0  # sampling's range: the logits divided by it stay finite

# Upper limits of sizes that would otherwise end in an allocator's traceback, a library's, or the
# out-of-memory killer; each far beyond what a translation model uses.
MAX_VOCABULARY = 1_000_000
MAX_LAYERS = 1024
MAX_POSITIONS = 1_048_576
MAX_THREADS = 1024
MAX_BEAM = 1024
MAX_LENGTH_FACTOR = 100.0
MAX_EXTRA_TOKENS = 100_000

MAX_SEED = 2**32 - 1  # what every generator attn seeds takes, whatever it derives from it per process


def derived_seed(seed: int, stream: int) -> int:
    """The seed of one stream drawn from a configured seed (an epoch's batch order, one process's
    dropout masks): different streams of one seed get different seeds, the same stream the same."""
    return seed * 1000003 + stream


def _check_seed(key: str, seed: Optional[int]) -> None:
    if seed is not None and not 0 <= seed <= MAX_SEED:
        _fail(key, f"{seed} is out of range; a seed is a whole number from 0 to {MAX_SEED:,}")


def _check_piece(key: str, piece: Optional[str], example: str) -> None:
    """A text that becomes one piece of the vocabulary: not empty, no spaces."""
    if piece is not None and (not piece or any(c.isspace() for c in piece)):
        _fail(key, f"{piece!r} must be one piece, without spaces, such as {example}; or leave it out")


BUILTIN_PREFIX = "builtin:"  # a corpus path that names a corpus shipped with attn: builtin:tatoeba-cmn-eng


@dataclass(frozen=True)
class CorpusConfig:
    """Where parallel sentences come from. Which fields matter depends on `format`."""

    format: Literal["tsv", "jsonl", "text", "tmx", "hf"] = "tsv"
    path: Optional[str] = None  # tsv, jsonl, tmx; a saved dataset directory for hf (load_from_disk)
    src_path: Optional[str] = None  # text: one sentence per line, aligned with tgt_path
    tgt_path: Optional[str] = None
    src_column: int = 0  # tsv: zero-based column numbers; other columns are ignored
    tgt_column: int = 1
    src_field: str = "en"  # jsonl and hf: field names; "translation.en" reaches into a dict
    tgt_field: str = "zh"
    hf_name: Optional[str] = None  # hf: a hub name, or a builder such as "json" with data_files
    hf_config: Optional[str] = None
    hf_split: str = "train"
    hf_data_files: Union[str, tuple[str, ...], None] = None  # one file, or a list of files
    hf_revision: Optional[str] = None  # a branch, tag or commit of the dataset's repository
    # Read the rows as they arrive instead of downloading and converting the whole dataset first
    # (each pass over the corpus reads it again); for datasets on the hub or data files.
    hf_streaming: bool = False
    # In a .zip: the member to read (tsv, jsonl, tmx); format text takes the members of src_path and
    # tgt_path that end in .SRC_LANG and .TGT_LANG, as OPUS's Moses downloads name them.
    member: Optional[str] = None
    # A score per pair (Bicleaner, OpusFilter, LASER): its column (tsv) or field (jsonl); the pairs
    # scored below min_score are removed, counted as data.filters' removals are.
    score_column: Optional[int] = None
    score_field: Optional[str] = None
    min_score: Optional[float] = None

    def validate(self, path: str) -> None:
        _check_numbers(self, path)
        if self.score_column is not None and self.format != "tsv":
            _fail(f"{path}.score_column", f"is for format 'tsv'; a {self.format} corpus's score is score_field (jsonl)")
        if self.score_field is not None and self.format != "jsonl":
            _fail(f"{path}.score_field", f"is for format 'jsonl'; a {self.format} corpus's score is score_column (tsv)")
        if self.score_column is not None and self.score_column in (self.src_column, self.tgt_column):
            _fail(
                f"{path}.score_column", f"{self.score_column} is the source or target column; name the score's column"
            )
        if self.min_score is not None and self.score_column is None and self.score_field is None:
            _fail(
                f"{path}.min_score",
                "needs the scores: set score_column (tsv, a column number) or score_field (jsonl, a field name)",
            )
        if self.format in ("tsv", "jsonl", "tmx") and not self.path:
            _fail(f"{path}.path", f"format {self.format!r} needs a file path, e.g. path: data/corpus.{self.format}")
        if self.format == "text" and not (self.src_path and self.tgt_path):
            _fail(path, "format 'text' needs both src_path and tgt_path (two aligned files, one sentence per line)")
        if self.format == "hf" and not (self.hf_name or self.path):
            _fail(
                path,
                "format 'hf' needs hf_name (a hub dataset or a builder like 'json') "
                "or path (a dataset saved with save_to_disk)",
            )
        if self.hf_streaming and (self.format != "hf" or self.path):
            _fail(
                f"{path}.hf_streaming",
                "streams a dataset named by hf_name (format: hf); a dataset saved with save_to_disk is read "
                "from its files already",
            )
        if self.format == "tsv":
            for key in ("src_column", "tgt_column"):
                if getattr(self, key) < 0:
                    _fail(f"{path}.{key}", f"{getattr(self, key)} is negative; columns count from 0")
            if self.src_column == self.tgt_column:
                _fail(
                    f"{path}.tgt_column",
                    f"{self.tgt_column} equals src_column; source and target must be different columns",
                )


MAX_CORPUS_WEIGHT = 100.0  # copies of a corpus per epoch; more would drown every other corpus


@dataclass(frozen=True)
class TrainingCorpus(CorpusConfig):
    """One corpus of data.corpora: where its pairs come from (the keys of a corpus), how much of it
    each epoch draws, and the tag its sources carry."""

    name: Optional[str] = None  # what logs and statistics call it; its file's (or dataset's) name when absent
    # Pairs drawn per epoch, as a multiple of its training pairs: 0.5 draws half of them, 3 three
    # copies; a fraction is drawn anew each epoch from train.seed and the epoch.
    weight: float = 1.0
    tag: Optional[str] = None  # a piece put before each of its sources, such as "<bt>"; a piece of its own
    split: bool = True  # validation and test pairs are carved off it too (unless given as their own corpora)
    src_lang: Optional[str] = None  # its languages, when not data.src_lang and data.tgt_lang
    tgt_lang: Optional[str] = None
    reverse: bool = False  # also train the other direction on its pairs (en-zh pairs teach zh-en too)

    @property
    def label(self) -> str:
        """The corpus's name in logs and statistics."""
        if self.name:
            return self.name
        where = self.path or self.src_path or self.hf_name or "corpus"
        return where.removeprefix(BUILTIN_PREFIX).rstrip("/").rsplit("/", 1)[-1]

    def validate(self, path: str) -> None:
        super().validate(path)
        if not 0 <= self.weight <= MAX_CORPUS_WEIGHT:
            _fail(
                f"{path}.weight",
                f"{self.weight} must be between 0 and {MAX_CORPUS_WEIGHT:g}: the copies of the corpus each "
                f"epoch draws (0.5 = half of its pairs, 3 = three copies)",
            )
        _check_piece(f"{path}.tag", self.tag, "'<bt>'")
        for key in ("src_lang", "tgt_lang"):
            _check_language(f"{path}.{key}", getattr(self, key))


@dataclass(frozen=True)
class DirectedCorpus:
    """A training corpus read in one direction: a corpus with `reverse: true` gives two, the second
    with each pair's sides swapped. Weights, tags and the per-corpus counts of training are theirs."""

    corpus: TrainingCorpus
    index: int  # the corpus's place in data.training_corpora
    direction: Direction
    reversed: bool  # its pairs' sides swapped
    label: str  # what logs and statistics call it

    @property
    def weight(self) -> float:
        return self.corpus.weight

    @property
    def tag(self) -> Optional[str]:
        return self.corpus.tag


def _check_language(key: str, code: Optional[str]) -> None:
    if code is not None and not re.fullmatch(r"[A-Za-z]{2,3}([-_][A-Za-z0-9]{2,8})*", code):
        _fail(key, f"{code!r} is not a language code; give one such as en, zh or zh-Hans")


@dataclass(frozen=True)
class FiltersConfig:
    """Cleaning of the training corpus (attn_cli/data/filters.py), as its pairs are read, before the
    split. Every rule is off by default (false or null keeps what the corpus holds); docs/
    configuration.md gives a set for noisy data."""

    duplicates: Literal["pair", "source", "off"] = "off"  # keep the first of pairs (or sources) seen twice
    held_out: bool = False  # drop training pairs whose source is a source of data.valid_corpus or data.test_corpus
    copies: bool = False  # source and target the same text (case and spaces aside)
    max_characters: Optional[int] = None  # a side longer than this
    max_character_ratio: Optional[float] = None  # one side this many times longer than the other, in characters
    markup: bool = False  # HTML or XML tags and entities (&amp; &#160;) left in the text
    max_repeats: Optional[int] = None  # one character repeated back to back more than this
    control_characters: bool = False  # characters that are no text (C0/C1 controls but tab)
    min_script_share: Optional[float] = None  # words in the script of the side's language, for languages with one
    language_id: bool = False  # py3langid: each side in its language (pip install py3langid)

    def validate(self, path: str) -> None:
        _check_numbers(self, path)
        for key in ("max_characters", "max_repeats"):
            if getattr(self, key) is not None and getattr(self, key) < 1:
                _fail(f"{path}.{key}", f"{getattr(self, key)} must be >= 1, or null for no limit")
        if self.max_character_ratio is not None and self.max_character_ratio < 1:
            _fail(f"{path}.max_character_ratio", f"{self.max_character_ratio} must be >= 1, or null for no limit")
        if self.min_script_share is not None and not 0 <= self.min_script_share <= 1:
            _fail(f"{path}.min_script_share", f"{self.min_script_share} must be between 0 and 1, or null")


@dataclass(frozen=True)
class DataConfig:
    corpus: CorpusConfig = field(default_factory=CorpusConfig)  # one corpus; or several as corpora
    corpora: tuple[TrainingCorpus, ...] = ()  # several corpora, each with a weight and a tag
    valid_corpus: Optional[CorpusConfig] = None  # when absent, valid and test are split off the corpus
    test_corpus: Optional[CorpusConfig] = None
    src_lang: str = "en"
    tgt_lang: str = "zh"
    valid_size: int = 500
    test_size: int = 1000
    split_seed: int = 1
    max_pairs: Optional[int] = None  # read at most this many pairs (after shuffling), for smoke runs
    max_source_tokens: int = 128
    max_target_tokens: int = 128
    max_length_ratio: float = 4.0  # drop training pairs whose token lengths differ more than this
    strict: bool = False  # malformed lines are an error instead of being skipped and reported
    filters: FiltersConfig = field(default_factory=FiltersConfig)
    cache_dir: Optional[str] = None  # where the tokenized training data is kept; null: RUN/data/prepared

    @property
    def languages(self) -> Direction:
        """The languages of data.corpus, and of a corpus of data.corpora that names none."""
        return Direction(self.src_lang, self.tgt_lang)

    @property
    def training_corpora(self) -> tuple[TrainingCorpus, ...]:
        """The corpora training reads: data.corpora, or data.corpus as one corpus of weight 1."""
        if self.corpora:
            return self.corpora
        return (
            TrainingCorpus(**{item.name: getattr(self.corpus, item.name) for item in dataclasses.fields(CorpusConfig)}),
        )

    def languages_of(self, corpus: CorpusConfig) -> Direction:
        """A corpus's languages, as its pairs are written: its own src_lang and tgt_lang, else data's."""
        return Direction(
            getattr(corpus, "src_lang", None) or self.src_lang, getattr(corpus, "tgt_lang", None) or self.tgt_lang
        )

    @property
    def directed_corpora(self) -> tuple[DirectedCorpus, ...]:
        """The training corpora in each direction they are read: one per corpus, two for one with
        `reverse: true` (the pairs as written, then swapped)."""
        found = []
        for index, corpus in enumerate(self.training_corpora):
            languages = self.languages_of(corpus)
            for reversed_ in (False, True) if corpus.reverse else (False,):
                direction = languages.reversed if reversed_ else languages
                label = f"{corpus.label} {direction}" if corpus.reverse else corpus.label
                found.append(DirectedCorpus(corpus, index, direction, reversed_, label))
        return tuple(found)

    @property
    def directions(self) -> tuple[Direction, ...]:
        """Every direction the model learns, each once, in the order of the corpora."""
        found = []
        for corpus in self.training_corpora:
            languages = self.languages_of(corpus)
            found += [languages, languages.reversed] if corpus.reverse else [languages]
        return tuple(dict.fromkeys(found))

    def direction_into(self, target: Optional[str]) -> Direction:
        """The direction a source asking for `target` is translated in: the model's direction into
        that language (zh-Hans finds zh), or its first one when `target` is None. A language the
        model does not write is refused, naming those it does."""
        if target is None:
            return self.directions[0]
        for match in (lambda code: code == target, lambda code: primary_subtag(code) == primary_subtag(target)):
            for direction in self.directions:
                if match(direction.target):
                    return direction
        raise ConfigError(unwritten_target(self.target_languages, target), "target")

    @property
    def target_languages(self) -> tuple[str, ...]:
        """The languages the model translates into, each once, in the order of its directions."""
        return tuple(dict.fromkeys(direction.target for direction in self.directions))

    @property
    def target_tags(self) -> dict[str, str]:
        """The piece that asks for each target language ({"en": ">>en<<", "zh": ">>zh<<"}), put
        before every source; none when the model has one target language."""
        targets = self.target_languages
        return {target: target_tag(target) for target in targets} if len(targets) > 1 else {}

    @property
    def weighted(self) -> bool:
        """Whether an epoch draws other than each training pair once."""
        return any(corpus.weight != 1 for corpus in self.training_corpora)

    @property
    def tags(self) -> tuple[str, ...]:
        """The corpora's tags, each once, in the order of the corpora."""
        return tuple(dict.fromkeys(corpus.tag for corpus in self.training_corpora if corpus.tag))

    def validate(self, path: str) -> None:
        _check_seed(f"{path}.split_seed", self.split_seed)  # before the general check: its own range is narrower
        _check_numbers(self, path)
        if self.corpora:
            if self.corpus != CorpusConfig():
                _fail(
                    f"{path}.corpus",
                    "give data.corpus (one corpus) or data.corpora (several), not both; "
                    "move data.corpus into the list of data.corpora",
                )
            self._validate_corpora(f"{path}.corpora")
        else:
            self.corpus.validate(f"{path}.corpus")
        self.filters.validate(f"{path}.filters")
        for key in ("valid_corpus", "test_corpus"):
            if getattr(self, key) is not None:
                getattr(self, key).validate(f"{path}.{key}")
        for key in ("valid_size", "test_size"):
            if getattr(self, key) < 0:
                _fail(f"{path}.{key}", f"{getattr(self, key)} must be >= 0")
        for key in ("max_source_tokens", "max_target_tokens"):
            if getattr(self, key) < 1:
                _fail(f"{path}.{key}", f"{getattr(self, key)} must be >= 1")
        if self.max_pairs is not None and self.max_pairs < 1:
            _fail(f"{path}.max_pairs", f"{self.max_pairs} must be >= 1, or null for the whole corpus")
        if self.max_length_ratio < 1:
            _fail(f"{path}.max_length_ratio", f"{self.max_length_ratio} must be >= 1")

    def _validate_corpora(self, path: str) -> None:
        for position, corpus in enumerate(self.corpora):
            corpus.validate(f"{path}[{position}]")
        labels = [corpus.label for corpus in self.corpora]
        for position, label in enumerate(labels):
            if label in labels[:position]:
                _fail(
                    f"{path}[{position}].name",
                    f"two corpora are called {label!r}; give each a name of its own (name: general)",
                )
        if not any(corpus.weight > 0 for corpus in self.corpora):
            _fail(f"{path}", "every corpus has weight 0: training would draw no pairs; give one a weight above 0")
        if not (self.valid_corpus and self.test_corpus) and not any(corpus.split for corpus in self.corpora):
            _fail(
                f"{path}",
                "every corpus has split: false, so validation and test pairs have nowhere to come from; "
                "set split: true on one, or give data.valid_corpus and data.test_corpus",
            )


@dataclass(frozen=True)
class TokenizerConfig:
    model_type: Literal["unigram", "bpe"] = "unigram"
    vocab_size: int = 8000
    joint: bool = True  # one vocabulary for both languages; separate models when false
    character_coverage: float = 0.9995  # below 1.0 so rare Chinese characters fall back to bytes
    byte_fallback: bool = True  # no input is ever unencodable
    # SentencePiece's usual nmt_nfkc would turn Chinese full-width punctuation (，？！：) into ASCII
    # in every output, and the references keep it; identity leaves text as it is.
    normalization: Literal["identity", "nfkc", "nmt_nfkc"] = "identity"
    max_training_sentences: int = 2_000_000
    # A piece put before every source sentence: the target language of a multi-target model
    # (">>cmn_Hans<<" for OPUS-MT's English-Chinese). A tokenizer trained here gets it as a piece.
    source_prefix: Optional[str] = None
    threads: Optional[int] = None  # SentencePiece training's threads; null: every core of the machine

    def validate(self, path: str) -> None:
        _check_numbers(self, path)
        if self.threads is not None and not 1 <= self.threads <= MAX_THREADS:
            _fail(f"{path}.threads", f"{self.threads} must be between 1 and {MAX_THREADS}, or null for every core")
        _check_piece(f"{path}.source_prefix", self.source_prefix, "'>>cmn_Hans<<'")
        if self.vocab_size < 300:
            _fail(
                f"{path}.vocab_size",
                f"{self.vocab_size} is too small; byte fallback alone needs 256 + 4 pieces, use >= 300",
            )
        _at_most(
            f"{path}.vocab_size",
            self.vocab_size,
            MAX_VOCABULARY,
            "SentencePiece's limit, and far more than translation needs",
        )
        if self.max_training_sentences < 1:
            _fail(f"{path}.max_training_sentences", f"{self.max_training_sentences} must be >= 1")
        if not 0.98 <= self.character_coverage <= 1.0:
            _fail(
                f"{path}.character_coverage",
                f"{self.character_coverage} must be in [0.98, 1.0] (SentencePiece takes no less); 0.9995 suits Chinese",
            )


@dataclass(frozen=True)
class ModelConfig:
    d_model: int = 256
    num_heads: int = 4
    ffn_dim: int = 1024
    encoder_layers: int = 3
    decoder_layers: int = 3
    dropout: float = 0.1
    attention_dropout: float = 0.0
    # sinusoidal | learned (added to the embeddings) | relative (T5 bias) | rotary (in self-attention)
    positions: Literal["sinusoidal", "learned", "relative", "rotary"] = "sinusoidal"
    max_positions: int = 256
    # positions: sinusoidal only: sin and cos of each frequency side by side, or all sines, then all cosines (Marian)
    sinusoid_layout: Literal["interleaved", "halves"] = "interleaved"
    norm: Literal["pre", "post"] = "pre"
    activation: Literal["relu", "gelu", "silu"] = "relu"  # the feed-forward's; silu (swish) is Marian's
    share_embeddings: bool = True  # needs a joint vocabulary
    output_bias: bool = False  # a trained bias per target token added to the logits, as Marian has

    def validate(self, path: str) -> None:
        _check_numbers(self, path)
        for key in ("d_model", "num_heads", "ffn_dim", "encoder_layers", "decoder_layers", "max_positions"):
            if getattr(self, key) < 1:
                _fail(f"{path}.{key}", f"{getattr(self, key)} must be >= 1")
        for key in ("encoder_layers", "decoder_layers"):
            _at_most(
                f"{path}.{key}", getattr(self, key), MAX_LAYERS, "deeper stacks do not train without other changes"
            )
        _at_most(
            f"{path}.max_positions",
            self.max_positions,
            MAX_POSITIONS,
            "attention over longer sequences does not fit in memory",
        )
        if self.d_model % self.num_heads:
            _fail(f"{path}.num_heads", f"{self.num_heads} must divide {path}.d_model={self.d_model}")
        if self.positions == "rotary" and (self.d_model // self.num_heads) % 2:
            _fail(
                f"{path}.positions",
                f"rotary positions turn pairs of features: d_model / num_heads = "
                f"{self.d_model // self.num_heads} must be even; change {path}.num_heads or {path}.d_model",
            )
        for key in ("dropout", "attention_dropout"):
            if not 0.0 <= getattr(self, key) < 1.0:
                _fail(f"{path}.{key}", f"{getattr(self, key)} must be in [0, 1)")
        if self.sinusoid_layout != "interleaved" and self.positions != "sinusoidal":
            _fail(
                f"{path}.sinusoid_layout",
                f"{self.sinusoid_layout} orders sinusoidal positions, and {path}.positions is {self.positions}; "
                f"set {path}.positions: sinusoidal or leave {path}.sinusoid_layout out",
            )

    @property
    def max_sequence_tokens(self) -> int:
        """The most tokens of a source or output, its EOS or BOS aside (which takes one position), that
        the model takes in one piece: a longer input is split or truncated (decode.long_inputs)."""
        return self.max_positions - 1

    @property
    def position_limit(self) -> Optional[int]:
        """The most tokens of a sequence the model can embed at all: learned positions end at
        max_sequence_tokens; the other schemes have no end (None)."""
        return self.max_sequence_tokens if self.positions == "learned" else None


@dataclass(frozen=True)
class JoinConfig:
    rate: float = 0.0  # share of the training pairs joined into longer ones each epoch; 0 joins none
    max_pairs: int = 3  # most pairs in one joined pair (each joined pair has 2..max_pairs, drawn at random)
    max_tokens: Optional[int] = None  # longest joined side in tokens; null: data.max_source_tokens / max_target_tokens

    def validate(self, path: str) -> None:
        _check_numbers(self, path)
        if not 0.0 <= self.rate <= 1.0:
            _fail(f"{path}.rate", f"{self.rate} must be in [0, 1] (0 joins no pairs)")
        if self.max_pairs < 2:
            _fail(f"{path}.max_pairs", f"{self.max_pairs} must be >= 2: a joined pair is made of two pairs or more")
        if self.max_tokens is not None and self.max_tokens < 1:
            _fail(f"{path}.max_tokens", f"{self.max_tokens} must be >= 1, or null for the data section's limits")


@dataclass(frozen=True)
class CasingConfig:
    upper: float = 0.0  # share of the training pairs upper-cased, both sides, each epoch
    title: float = 0.0  # share title-cased (each word's first letter a capital), both sides

    def validate(self, path: str) -> None:
        _check_numbers(self, path)
        for key in ("upper", "title"):
            if not 0.0 <= getattr(self, key) <= 1.0:
                _fail(f"{path}.{key}", f"{getattr(self, key)} must be in [0, 1] (0 recases no pairs)")
        if self.upper + self.title > 1.0:
            total = self.upper + self.title
            _fail(f"{path}.title", f"upper + title is {total:g}; together they are a share of the pairs, at most 1")


@dataclass(frozen=True)
class EarlyStoppingConfig:
    metric: Literal["bleu", "loss"] = "bleu"  # validation BLEU (higher is better) or loss (lower is better)
    patience: int = 5  # validations in a row without improvement before training stops

    def validate(self, path: str) -> None:
        _check_numbers(self, path)
        if self.patience < 1:
            _fail(f"{path}.patience", f"{self.patience} must be >= 1")


@dataclass(frozen=True)
class TrainConfig:
    device: str = "auto"  # auto | cpu | cuda | cuda:N
    precision: Literal["fp32", "bf16", "fp16", "auto"] = "fp32"  # auto: bf16 where fast, fp16 on older GPUs, else fp32
    seed: int = 1
    threads: Optional[int] = None  # CPU threads for torch; null keeps torch's default
    max_tokens: int = 4096  # token budget of one batch (source or target, whichever is longer, incl. padding)
    accumulate: int = 1  # batches per update: the effective batch is max_tokens x accumulate
    max_epochs: int = 100
    max_steps: Optional[int] = None
    max_minutes: Optional[float] = None  # wall-clock budget of the training loop
    lr: float = 7e-4
    warmup_steps: int = 1000
    betas: tuple[float, float] = (0.9, 0.98)
    weight_decay: float = 0.0
    clip_norm: float = 1.0
    label_smoothing: float = 0.1
    valid_every: int = 1000  # steps between validations (and checkpoints)
    join: JoinConfig = field(default_factory=JoinConfig)  # training pairs joined into longer ones (data/joining.py)
    casing: CasingConfig = field(default_factory=CasingConfig)  # pairs upper- or title-cased (data/casing.py)
    early_stopping: Optional[EarlyStoppingConfig] = None  # e.g. {metric: bleu, patience: 5}; null trains to the budget
    keep_last: int = 0  # also keep this many step-numbered checkpoints (for `attn average`); 0 keeps none
    valid_bleu: bool = True
    log_every: int = 10
    max_nonfinite_steps: int = 20  # this many updates in a row skipped for a non-finite loss or gradients stop the run
    compile: bool = False  # torch.compile the training forward; checkpoints and decoding use the plain module
    gradient_checkpointing: bool = False  # recompute each layer in backward: less memory, about a third more compute
    init_from: Optional[str] = (
        None  # a checkpoint, or a run directory (its best.pt): a new run starts from its weights and tokenizer
    )

    def validate(self, path: str) -> None:
        if not DEVICE_PATTERN.fullmatch(self.device):
            _fail(f"{path}.device", f"{self.device!r} is not a device; use auto, cpu, cuda or cuda:N")
        _check_seed(f"{path}.seed", self.seed)  # before the general check: its own range is narrower
        _check_numbers(self, path)
        for key in (
            "max_tokens",
            "accumulate",
            "max_epochs",
            "warmup_steps",
            "valid_every",
            "log_every",
            "max_nonfinite_steps",
        ):
            if getattr(self, key) < 1:
                _fail(f"{path}.{key}", f"{getattr(self, key)} must be >= 1")
        if self.max_steps is not None and self.max_steps < 1:
            _fail(f"{path}.max_steps", f"{self.max_steps} must be >= 1, or null for no limit")
        if self.max_minutes is not None and self.max_minutes <= 0:
            _fail(f"{path}.max_minutes", f"{self.max_minutes} must be > 0, or null for no limit")
        self.join.validate(f"{path}.join")
        self.casing.validate(f"{path}.casing")
        if self.early_stopping is not None:
            self.early_stopping.validate(f"{path}.early_stopping")
            if self.early_stopping.metric == "bleu" and not self.valid_bleu:
                _fail(
                    f"{path}.early_stopping.metric",
                    f"'bleu' needs {path}.valid_bleu: true; use metric: loss, or turn valid_bleu on",
                )
        if self.keep_last < 0:
            _fail(f"{path}.keep_last", f"{self.keep_last} must be >= 0 (0 keeps no step checkpoints)")
        if self.threads is not None and self.threads < 1:
            _fail(f"{path}.threads", f"{self.threads} must be >= 1, or null")
        _at_most(f"{path}.threads", self.threads, MAX_THREADS, "more threads than cores only slow training down")
        if self.weight_decay < 0:
            _fail(f"{path}.weight_decay", f"{self.weight_decay} must be >= 0")
        if self.lr <= 0:
            _fail(f"{path}.lr", f"{self.lr} must be > 0")
        if not 0.0 <= self.label_smoothing < 1.0:
            _fail(f"{path}.label_smoothing", f"{self.label_smoothing} must be in [0, 1)")
        if self.clip_norm < 0:
            _fail(f"{path}.clip_norm", f"{self.clip_norm} must be >= 0 (0 turns clipping off)")
        if not all(0.0 <= b < 1.0 for b in self.betas):
            _fail(f"{path}.betas", f"{list(self.betas)} must be two numbers in [0, 1)")


@dataclass(frozen=True)
class DecodeConfig:
    beam_size: int = 5  # 1 = greedy decoding
    length_penalty: float = 0.6  # GNMT alpha: scores are log P / ((5 + length) / 6) ** alpha; 0 = off
    n_best: int = 1  # translations per input (at most beam_size; with sample, the samples drawn)
    max_len_a: float = 1.5  # output may have up to a * source_length + b tokens
    max_len_b: int = 10
    max_tokens: int = 8000  # token budget of one decoding batch (source tokens, padding included)
    sample: bool = False  # sample the next token instead of searching (back-translation, diverse outputs)
    temperature: float = 1.0  # with sample: < 1 sharpens the distribution, > 1 flattens it
    top_k: int = 0  # with sample: only the k most likely tokens (0 = all)
    top_p: float = 1.0  # with sample: only the smallest set of tokens whose probability reaches p
    seed: Optional[int] = None  # with sample: a seed makes the samples repeatable
    long_inputs: Literal["split", "truncate"] = "split"  # inputs beyond model.max_positions
    no_repeat_ngram: int = 0  # > 0: no token n-gram of this size twice in one output (curbs stutter); 0 = off
    no_stutter: bool = False  # no unit of 1-4 characters three times in a row (叔叔叔, 一座一座一座) in an output
    no_loops: bool = True  # no span of up to 16 tokens three times back to back (她就说她就说她就说) in an output
    learned_lengths: bool = True  # each output between the shortest and longest the training pairs make plausible
    split_clauses: bool = True  # a source longer than the training sources translated clause by clause

    def validate(self, path: str) -> None:
        _check_seed(f"{path}.seed", self.seed)  # before the general check: its own range is narrower
        _check_numbers(self, path)
        if self.max_len_a < 0 or self.max_len_b < 1:
            raise ConfigError(
                f"$max_len_a={self.max_len_a} must be >= 0 and $max_len_b={self.max_len_b} >= 1",
                path,
                mentions={"max_len_a": f"{path}.max_len_a", "max_len_b": f"{path}.max_len_b"},
            )
        for key in ("beam_size", "n_best", "max_tokens"):
            if getattr(self, key) < 1:
                _fail(f"{path}.{key}", f"{getattr(self, key)} must be >= 1")
        _at_most(
            f"{path}.max_len_a", self.max_len_a, MAX_LENGTH_FACTOR, "no translation is that much longer than its source"
        )
        _at_most(
            f"{path}.max_len_b",
            self.max_len_b,
            MAX_EXTRA_TOKENS,
            "no translation needs that many tokens beyond its source's length",
        )
        for key in ("beam_size", "n_best"):
            _at_most(
                f"{path}.{key}", getattr(self, key), MAX_BEAM, "each one multiplies the memory and time of decoding"
            )
        if self.length_penalty < 0:
            _fail(f"{path}.length_penalty", f"{self.length_penalty} must be >= 0 (0 turns it off)")
        if self.no_repeat_ngram < 0:
            _fail(f"{path}.no_repeat_ngram", f"{self.no_repeat_ngram} must be >= 0 (0 turns it off)")
        _at_most(f"{path}.no_repeat_ngram", self.no_repeat_ngram, MAX_EXTRA_TOKENS, "no output is that long")
        if not self.sample and self.n_best > self.beam_size:
            raise ConfigError(
                f"{self.n_best} is more than $beam_size={self.beam_size}; a beam of k keeps at most "
                f"k translations, so raise $beam_size",
                f"{path}.n_best",
                mentions={"beam_size": f"{path}.beam_size"},
            )
        if not MIN_TEMPERATURE <= self.temperature <= MAX_TEMPERATURE:
            # Beyond these, dividing the logits overflows to inf or NaN: use beam_size 1 for the
            # most likely token, and a high temperature for tokens drawn almost alike.
            _fail(
                f"{path}.temperature",
                f"{self.temperature} must be between {MIN_TEMPERATURE} and {MAX_TEMPERATURE:g} (for the most likely "
                f"token, decode without sampling)",
            )
        if self.top_k < 0:
            _fail(f"{path}.top_k", f"{self.top_k} must be >= 0 (0 keeps every token)")
        if not 0.0 < self.top_p <= 1.0:
            _fail(f"{path}.top_p", f"{self.top_p} must be in (0, 1]")


@dataclass(frozen=True)
class Config:
    run_dir: str = "runs/en-zh"
    data: DataConfig = field(default_factory=DataConfig)
    tokenizer: TokenizerConfig = field(default_factory=TokenizerConfig)
    model: ModelConfig = field(default_factory=ModelConfig)
    train: TrainConfig = field(default_factory=TrainConfig)
    decode: DecodeConfig = field(default_factory=DecodeConfig)

    def validate(self, path: str = "") -> None:
        self.data.validate("data")
        self.tokenizer.validate("tokenizer")
        self.model.validate("model")
        self.train.validate("train")
        self.decode.validate("decode")
        if self.data.target_tags and self.tokenizer.source_prefix is not None:
            _fail(
                "tokenizer.source_prefix",
                f"the corpora have {len(self.data.target_tags)} target languages, so each source gets its target's "
                f"tag ({', '.join(self.data.target_tags.values())}); leave source_prefix out (it is one fixed tag, "
                f"for a model imported with one)",
            )
        if self.model.share_embeddings and not self.tokenizer.joint:
            _fail("model.share_embeddings", "true needs tokenizer.joint=true; set one of them differently")
        limit, longest = self.model.position_limit, max(self.longest_training_sides())
        if limit is not None and longest > limit:
            # A source gets EOS and a decoder input gets BOS: one position more than the tokens.
            _fail(
                "model.max_positions",
                f"{self.model.max_positions} is shorter than the longest sentence "
                f"data.max_*_tokens (or train.join.max_tokens) + 1 = {longest + 1}; raise it or lower the limits",
            )

    def longest_training_sides(self) -> tuple[int, int]:
        """The most tokens (without EOS or BOS) a training example's source and target can have: the
        data section's limits, or train.join.max_tokens where pairs are joined into longer ones."""
        data, join = self.data, self.train.join
        if join.rate == 0 or join.max_tokens is None:
            return data.max_source_tokens, data.max_target_tokens
        return join.max_tokens, join.max_tokens


# ---------------------------------------------------------------------------------------------
# Building dataclasses from plain YAML values, with the YAML path in every error.


def _type_name(tp: Any) -> str:
    if typing.get_origin(tp) is Literal:
        return " | ".join(repr(a) for a in typing.get_args(tp))
    return getattr(tp, "__name__", str(tp))


def _convert(value: Any, tp: Any, path: str) -> Any:
    origin = typing.get_origin(tp)
    if origin in (Union, types.UnionType):
        args = typing.get_args(tp)
        if value is None and type(None) in args:
            return None
        inner = [a for a in args if a is not type(None)]
        if len(inner) > 1:  # one value or a list of them: the list form for a list
            listed = isinstance(value, (list, tuple))
            for candidate in inner:
                if (typing.get_origin(candidate) is tuple) == listed:
                    return _convert(value, candidate, path)
            _fail(
                path, f"{value!r} must be {' or a list of '.join(_type_name(a) for a in inner if a is str)} or a list"
            )
        return _convert(value, inner[0], path)
    if origin is Literal:
        choices = typing.get_args(tp)
        if value not in choices:
            _fail(path, f"{value!r} is not one of {', '.join(repr(c) for c in choices)}")
        return value
    if origin is tuple:
        args = typing.get_args(tp)
        if len(args) == 2 and args[1] is Ellipsis:  # a list of any length
            if not isinstance(value, (list, tuple)):
                _fail(path, f"{value!r} must be a list")
            return tuple(_convert(v, args[0], f"{path}[{i}]") for i, v in enumerate(value))
        if not isinstance(value, (list, tuple)) or len(value) != len(args):
            _fail(path, f"{value!r} must be a list of {len(args)} values")
        return tuple(_convert(v, a, f"{path}[{i}]") for i, (v, a) in enumerate(zip(value, args)))
    if dataclasses.is_dataclass(tp):
        return _build(tp, value, path)
    if tp is bool:
        if not isinstance(value, bool):
            _fail(path, f"{value!r} must be true or false")
        return value
    if tp is int:
        if isinstance(value, bool) or not isinstance(value, int):
            _fail(path, f"{value!r} must be a whole number")
        return value
    if tp is float:
        if isinstance(value, str):  # YAML 1.1 reads 7e-4 (no dot) as a string
            try:
                return float(value)
            except ValueError:
                pass
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            _fail(path, f"{value!r} must be a number")
        return float(value)
    if tp is str:
        if not isinstance(value, str):
            _fail(path, f"{value!r} must be a string")
        return value
    raise TypeError(f"unsupported config type {tp} at {path}")


def _build(cls: type, values: Any, path: str) -> Any:
    if values is None:
        values = {}
    if not isinstance(values, dict):
        _fail(path, f"must be a mapping of keys to values, not {values!r}")
    hints = typing.get_type_hints(cls)
    known = {f.name for f in dataclasses.fields(cls)}
    for key in values:
        if key not in known:
            where = f"{path}.{key}" if path else str(key)
            close = difflib.get_close_matches(str(key), known, n=1)
            hint = f"; did you mean {close[0]!r}?" if close else f"; known keys: {', '.join(sorted(known))}"
            _fail(where, f"unknown key{hint}")
    kwargs = {}
    for key, value in values.items():
        kwargs[key] = _convert(value, hints[key], f"{path}.{key}" if path else key)
    return cls(**kwargs)


def config_from_dict(values: dict) -> Config:
    config = _build(Config, values, "")
    config.validate()
    return config


def config_to_dict(config: Config) -> dict:
    def plain(value: Any) -> Any:
        if isinstance(value, tuple):
            return [plain(v) for v in value]
        if isinstance(value, dict):
            return {k: plain(v) for k, v in value.items()}
        return value

    return plain(dataclasses.asdict(config))


def apply_override(values: dict, override: str) -> None:
    """Apply one `section.key=value` override in place; the value is parsed as YAML."""
    if "=" not in override:
        raise ConfigError("expected section.key=value, e.g. --set train.max_steps=100", f"--set {override!r}")
    dotted, raw = override.split("=", 1)
    keys = dotted.strip().split(".")
    node = values
    for key in keys[:-1]:
        child = node.get(key)
        if child is None:
            child = node[key] = {}
        if not isinstance(child, dict):
            raise ConfigError(f"{key} is not a section", f"--set {override!r}")
        node = child
    try:
        node[keys[-1]] = yaml.safe_load(raw) if raw.strip() else None
    except yaml.YAMLError:
        raise ConfigError("the value is not valid YAML; quote it or fix the brackets", f"--set {override!r}") from None


def _check_languages_given(values: dict, config: Config) -> None:
    """A corpus other than the built-in English-Chinese one names its languages: left to the en/zh
    defaults, a German-English model would be scored with the Chinese BLEU tokenizer, and joined
    German pairs glued without spaces, with no word said."""
    others = [
        corpus
        for corpus in config.data.training_corpora
        if not (corpus.format == "tsv" and (corpus.path or "").startswith(BUILTIN_PREFIX))
        and not (corpus.src_lang and corpus.tgt_lang)
    ]
    if not others:
        return
    given = values.get("data") if isinstance(values.get("data"), dict) else {}
    missing = [key for key in ("src_lang", "tgt_lang") if key not in given]
    if missing:
        corpus = others[0]
        where = corpus.path or corpus.src_path or corpus.hf_name
        _fail(
            f"data.{missing[0]}",
            f"the corpus ({where}) is not the built-in English-Chinese one, so say its languages: set "
            f"data.src_lang and data.tgt_lang (e.g. src_lang: de, tgt_lang: en); they choose the BLEU "
            f"tokenizer, how sentences are joined and split, and which TMX variants are read",
        )


def load_config(path: str | Path | None, overrides: list[str] | tuple[str, ...] = ()) -> Config:
    """Read a YAML config (or the defaults when path is None), apply overrides, validate."""
    values: dict = {}
    if path is not None:
        path = find_config(path)
        values = _read_yaml(path)
        if not isinstance(values, dict):
            raise ConfigError("the top level must be a mapping of sections", config_file=path)
    for override in overrides:
        apply_override(values, override)
    try:
        config = config_from_dict(values)
        _check_languages_given(values, config)
        return config
    except ConfigError as error:
        if path is None:
            raise
        raise error.in_file(path) from None


def _read_yaml(path: Path) -> Any:
    """The YAML values in the file at `path`, or a one-line error saying where it went wrong."""
    try:
        return yaml.safe_load(path.read_text(encoding="utf-8")) or {}
    except UnicodeDecodeError as error:
        raise ConfigError(
            f"not UTF-8 text (byte {error.start}); a config is a YAML text file", config_file=path
        ) from None
    except OSError as error:
        raise ConfigError(f"cannot read it: {error.strerror or error}", config_file=path) from None
    except yaml.YAMLError as error:
        mark = getattr(error, "problem_mark", None)
        where = f" at line {mark.line + 1}, column {mark.column + 1}" if mark is not None else ""
        problem = getattr(error, "problem", None) or str(error).splitlines()[0]
        raise ConfigError(f"not valid YAML{where}: {problem}", config_file=path) from None


def config_to_yaml(config: Config) -> str:
    """The text of a config file that loads as `config`."""
    return yaml.safe_dump(config_to_dict(config), sort_keys=False, allow_unicode=True)


DEFAULT_CONFIG = Path("en-zh.yaml")  # what `attn train` reads without --config: the built-in one


def builtin_configs() -> dict[str, Path]:
    """The configs that ship inside attn, by file name (a copy of each is in the repository's configs/)."""
    directory = Path(str(resources.files("attn_cli"))) / "configs"
    return {path.name: path for path in sorted(directory.glob("*.yaml"))}


def find_config(path: str | Path) -> Path:
    """`path` when it is a file; otherwise the built-in config of that name (`tiny.yaml` or `tiny`)."""
    path = Path(path)
    if path.is_file():
        return path
    builtin = builtin_configs()
    if len(path.parts) == 1:  # a bare name, not a path into some directory
        for name in (path.name, f"{path.name}.yaml"):
            if name in builtin:
                return builtin[name]
    raise ConfigError(
        f"config file not found: {path}; the built-in configs are {', '.join(builtin)} "
        "(attn train --config tiny.yaml), or give the path of your own YAML file"
    )


def default_run_dir() -> Path:
    """The run of the default config, so `attn translate` works right after `attn train`."""
    with contextlib.suppress(ConfigError):
        return Path(load_config(DEFAULT_CONFIG).run_dir)
    return Path("runs/en-zh")
