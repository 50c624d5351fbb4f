"""The decoding options a caller may set for one job, declared once: `attn translate` and `attn eval`
make their flags from this table, and a server takes the same names as request fields.

Each option is a setting of the config's `decode` section (`DecodeConfig`), named by its key; what
is not given keeps the checkpoint's value. `override_decode` applies what was given and validates
the result as the config section, so a bad value is refused by the same rule wherever it comes from;
`flag_names` lets the command line call each key by its flag ("--beam", not decode.beam_size).
Imports nothing heavy, so that a command's --help answers at once.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Optional

from attn_cli.config import DecodeConfig


@dataclass(frozen=True)
class DecodeOption:
    key: str  # the DecodeConfig field it sets
    flag: str  # its command-line flag; a boolean's is "--on/--off"
    help: str
    short: Optional[str] = None  # a one-letter alias, e.g. "-b"
    minimum: Optional[float] = None  # the smallest value the flag parser takes

    @property
    def flags(self) -> tuple[str, ...]:
        return (self.flag, self.short) if self.short else (self.flag,)

    @property
    def name(self) -> str:
        """The flag as an error message names it: the positive one of a boolean pair."""
        return self.flag.split("/")[0]


DECODE_OPTIONS = (
    DecodeOption("beam_size", "--beam", "Beam size; 1 is greedy decoding (config: decode.beam_size).", "-b", 1),
    DecodeOption(
        "n_best", "--n-best", "Translations per input (at most --beam; with --sample, the number of samples).", "-n", 1
    ),
    DecodeOption("length_penalty", "--length-penalty", "GNMT length penalty alpha; 0 turns it off."),
    DecodeOption("max_len_a", "--max-len-a", "Output limit a * source length + b: the a."),
    DecodeOption("max_len_b", "--max-len-b", "Output limit a * source length + b: the b."),
    DecodeOption("max_tokens", "--batch-size", "Token budget of one decoding batch (source tokens).", minimum=1),
    DecodeOption("sample", "--sample/--no-sample", "Sample each next token instead of searching."),
    DecodeOption("temperature", "--temperature", "With --sample: <1 sharper, >1 flatter."),
    DecodeOption("top_k", "--top-k", "With --sample: only the k most likely tokens (0 = all)."),
    DecodeOption("top_p", "--top-p", "With --sample: the smallest set of tokens with probability >= p."),
    DecodeOption("seed", "--seed", "With --sample: a seed for repeatable samples."),
    DecodeOption(
        "no_repeat_ngram",
        "--no-repeat-ngram",
        "Forbid any token n-gram of this size twice in one output, e.g. 3 (curbs stutter); 0 turns it off "
        "(config: decode.no_repeat_ngram).",
        minimum=0,
    ),
    DecodeOption(
        "no_stutter",
        "--no-stutter/--allow-stutter",
        "Forbid a unit of 1-4 characters three times in a row in an output (叔叔叔, 一座一座一座; digits and "
        "spaces may repeat) (config: decode.no_stutter).",
    ),
    DecodeOption(
        "no_loops",
        "--no-loops/--allow-loops",
        "Forbid a span of up to 16 tokens three times back to back in an output (她就说她就说她就说) "
        "(config: decode.no_loops).",
    ),
    DecodeOption(
        "learned_lengths",
        "--learned-lengths/--fixed-lengths",
        "Keep each output between the shortest and longest that the training pairs make plausible for "
        "its source's length, within --max-len-a/--max-len-b (config: decode.learned_lengths).",
    ),
    DecodeOption(
        "split_clauses",
        "--split-clauses/--whole-sentences",
        "Translate a source longer than the training sources clause by clause (at commas, semicolons "
        "and conjunctions) and join the parts (config: decode.split_clauses).",
    ),
)
OPTIONS_BY_KEY = {option.key: option for option in DECODE_OPTIONS}
_DECODE_FIELDS = {item.name for item in dataclasses.fields(DecodeConfig)}
assert set(OPTIONS_BY_KEY) <= _DECODE_FIELDS, "every decoding option is a decode setting"


def override_decode(decode: DecodeConfig, given: Mapping[str, Any]) -> DecodeConfig:
    """`decode` with the options that were given (None keeps the config's value), validated as the
    config's `decode` section: a ConfigError names the decode.* key at fault."""
    unknown = set(given) - set(OPTIONS_BY_KEY)
    if unknown:
        raise ValueError(f"not decoding options: {', '.join(sorted(unknown))}")
    options = dataclasses.replace(decode, **{key: value for key, value in given.items() if value is not None})
    options.validate("decode")
    return options


def flag_names() -> dict[str, Optional[str]]:
    """How the command line names each decode setting in an error: its flag."""
    return {"decode": None, **{f"decode.{option.key}": option.name for option in DECODE_OPTIONS}}


def field_names() -> dict[str, Optional[str]]:
    """How a server's request names each decode setting in an error: its field, the option's key."""
    return {"decode": None, **{f"decode.{option.key}": option.key for option in DECODE_OPTIONS}}
