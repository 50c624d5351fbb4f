"""Cleaning a training corpus: the rules that drop a pair, and the count of what each dropped.

Two kinds of rule, both applied before the split, so that the split, the tokenizer and the prepared
data all see the same pairs:

- rules on one pair (`PairRules`): a copy, a side too long, sides of very different lengths, markup,
  a character repeated on and on, control characters, a side not in its language's script, a side
  that a language identifier places elsewhere. attn_cli/data/split.py applies them once, on its
  first pass over the corpus, and later passes read the role that pass left (a byte per pair).
- rules across pairs (duplicates, pairs whose source is held out for validation or test), which
  attn_cli/data/split.py applies on the 8-byte keys it already keeps per pair.

`Removals` counts what each rule dropped, with a few examples, for `attn prepare` and `attn train`.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Callable, Optional

from attn_cli import languages as language_names
from attn_cli.config import FiltersConfig

Pair = tuple[str, str]

# The script each language is written in, as a character class: what min_script_share counts.
# Languages missing here (or written in several scripts) are not checked.
_HAN = "\u3400-\u4dbf\u4e00-\u9fff\uf900-\ufaff"
_LATIN = "A-Za-z\u00c0-\u024f\u1e00-\u1eff"
_SCRIPTS = {
    "zh": _HAN,
    "ja": _HAN + "\u3040-\u30ff",
    "ko": "\uac00-\ud7af\u1100-\u11ff" + _HAN,
    "ru": "\u0400-\u04ff",
    "uk": "\u0400-\u04ff",
    "bg": "\u0400-\u04ff",
    "el": "\u0370-\u03ff\u1f00-\u1fff",
    "ar": "\u0600-\u06ff\u0750-\u077f",
    "fa": "\u0600-\u06ff\u0750-\u077f",
    "he": "\u0590-\u05ff",
    "hi": "\u0900-\u097f",
    "th": "\u0e00-\u0e7f",
}
for _code in "en de fr es it pt nl sv da no nb fi pl cs sk sl hr ro hu tr id ms vi ca et lv lt eu ga cy sq is".split():
    _SCRIPTS[_code] = _LATIN

_IDEOGRAPHIC = _HAN + "\u3040-\u30ff\uac00-\ud7af"  # Han, kana, Hangul: a character is a word
_WORDS = re.compile(f"[{_IDEOGRAPHIC}]|(?:(?![{_IDEOGRAPHIC}])[^\\W\\d_])+")  # runs of letters, ideographs one by one
_TAG = re.compile(r"</?[A-Za-z][A-Za-z0-9:-]*(\s[^<>]*)?/?>|&(#\d+|#x[0-9A-Fa-f]+|[A-Za-z]+);")
_CONTROL = re.compile(r"[\x00-\x08\x0b-\x1f\x7f-\x9f]")
_SPACES = re.compile(r"\s+")


@dataclass
class Removals:
    """What the rules dropped from a corpus: a count per rule, and the first few pairs with their line."""

    kept_examples: int = 20  # what `--show-removed N` can show; the log shows 3
    counts: dict[str, int] = field(default_factory=dict)
    examples: dict[str, list[tuple[int, Optional[Pair]]]] = field(default_factory=dict)  # (line, pair or None)

    def add(self, rule: str, line: int, pair: Pair) -> None:
        self.counts[rule] = self.counts.get(rule, 0) + 1
        shown = self.examples.setdefault(rule, [])
        if len(shown) < self.kept_examples:
            shown.append((line, pair))

    def add_lines(self, rule: str, lines: list[int], count: int) -> None:
        """`count` pairs dropped by a rule across pairs, the first at `lines` (their text not kept)."""
        if count:
            self.counts[rule] = self.counts.get(rule, 0) + count
            shown = self.examples.setdefault(rule, [])
            shown.extend((line, None) for line in lines[: self.kept_examples - len(shown)])

    @classmethod
    def merged(cls, parts: list["Removals"]) -> "Removals":
        """The removals of several corpora as one: counts added, examples of the first ones."""
        merged = cls(kept_examples=max([part.kept_examples for part in parts], default=3))
        for part in parts:
            for rule, count in part.counts.items():
                merged.counts[rule] = merged.counts.get(rule, 0) + count
                shown = merged.examples.setdefault(rule, [])
                shown.extend(part.examples.get(rule, [])[: merged.kept_examples - len(shown)])
        return merged

    @property
    def total(self) -> int:
        return sum(self.counts.values())

    def summary(self, read: int) -> str:
        """One line: "filters removed 1,204 of 29,668 pairs: duplicates 1,002, copies 12, ..."."""
        if not self.counts:
            return f"filters removed none of {read:,} pairs"
        each = ", ".join(f"{rule} {count:,}" for rule, count in sorted(self.counts.items(), key=lambda x: -x[1]))
        return f"filters removed {self.total:,} of {read:,} pairs: {each}"


class PairRules:
    """The rules on one pair that `config` turns on, for a corpus of these languages."""

    def __init__(self, config: FiltersConfig, languages: tuple[str, str]):
        self.rules: list[tuple[str, Callable[[str, str], bool]]] = []  # (name, drops the pair)
        add = self.rules.append
        if config.control_characters:
            add(("control characters", lambda s, t: bool(_CONTROL.search(s) or _CONTROL.search(t))))
        if config.markup:
            add(("markup", lambda s, t: bool(_TAG.search(s) or _TAG.search(t))))
        if config.copies:
            add(("copies", lambda s, t: _SPACES.sub("", s).casefold() == _SPACES.sub("", t).casefold()))
        if config.max_characters is not None:
            most = config.max_characters
            add(("too long", lambda s, t: len(s) > most or len(t) > most))
        if config.max_character_ratio is not None:
            ratio = config.max_character_ratio
            add(("length ratio", lambda s, t: max(len(s), len(t)) > ratio * max(1, min(len(s), len(t)))))
        if config.max_repeats is not None:
            repeated = re.compile(r"(.)\1{%d,}" % config.max_repeats)
            add(("repeated character", lambda s, t: bool(repeated.search(s) or repeated.search(t))))
        if config.min_script_share is not None:
            shares = [_script_share(code) for code in languages]
            least = config.min_script_share
            if any(shares):
                add(("script", lambda s, t: any(share and share(text) < least for share, text in zip(shares, (s, t)))))
        if config.language_id:
            add(("language", _language_rule(languages)))

    def first_broken(self, source: str, target: str) -> Optional[str]:
        """The name of the first rule the pair breaks, None when it breaks none."""
        for name, drops in self.rules:
            if drops(source, target):
                return name
        return None


def _script_share(language: str) -> Optional[Callable[[str], float]]:
    """The share of a text's words written in the language's script (1.0 for a text without
    letters), or None for a language this does not know the script of. A word is a run of letters,
    and each Han, kana or Hangul character one word of its own: so a Chinese sentence that names
    "Twitter" is mostly Chinese, as a reader sees it."""
    primary = language_names.primary_subtag(language)
    script = _SCRIPTS.get(primary)
    if script is None:
        return None
    in_script = re.compile(f"[{script}]" if primary in ("zh", "ja", "ko") else f"[{script}]+")

    def share(text: str) -> float:
        words = len(_WORDS.findall(text))
        return len(in_script.findall(text)) / words if words else 1.0

    return share


def _language_rule(languages: tuple[str, str]) -> Callable[[str, str], bool]:
    """Drops a pair when py3langid, restricted to the two languages and a few common others, places
    either side elsewhere."""
    try:
        from py3langid.langid import MODEL_FILE, LanguageIdentifier
    except ImportError:
        from attn_cli.errors import UserError

        raise UserError(
            "data.filters.language_id needs py3langid (pip install py3langid), which ships its model"
        ) from None
    identifier = LanguageIdentifier.from_model_file(MODEL_FILE, norm_probs=True)
    wanted = [language_names.primary_subtag(code) for code in languages]
    identifier.set_languages(sorted({*wanted, "en", "zh", "de", "fr", "es", "ru", "ja", "pt", "it", "ar"}))

    def drops(source: str, target: str) -> bool:
        return any(identifier.classify(text)[0] != code for text, code in zip((source, target), wanted))

    return drops


def languages_disagree(pairs: list[Pair], languages: tuple[str, str]) -> Optional[str]:
    """A warning when most of `pairs` are not written in the scripts of data.src_lang and
    data.tgt_lang (Han characters in a `de` target, or the sides swapped); None when they agree or
    the scripts are unknown."""
    if not pairs:
        return None
    shares = [_script_share(code) for code in languages]

    def median_fit(side: int, text_side: int) -> Optional[float]:
        """The median share of the texts on `text_side` in the script of `side`'s language."""
        share = shares[side]
        return None if share is None else sorted(share(pair[text_side]) for pair in pairs)[len(pairs) // 2]

    fits = [median_fit(side, side) for side in (0, 1)]
    wrong = [side for side, fit in enumerate(fits) if fit is not None and fit < 0.5]
    if not wrong:
        return None
    names = ("data.src_lang", "data.tgt_lang")
    crossed = [median_fit(side, 1 - side) for side in (0, 1)]
    if all(fit is not None and fit >= 0.5 for fit in crossed):
        return (
            f"the corpus's sides look swapped: its sources are written like {languages[1]} and its targets like "
            f"{languages[0]}; check {names[0]} and {names[1]}, or the corpus's columns (src_column, tgt_column)"
        )
    side = wrong[0]
    return (
        f"most {('sources', 'targets')[side]} are not written in the script of {names[side]}={languages[side]}; "
        f"set {names[0]} and {names[1]} to the corpus's languages"
    )
