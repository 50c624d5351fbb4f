"""Glossaries: the terms a translation must use, which of them apply to a sentence, and how many an
output met (the exact-match term accuracy of the WMT terminology tasks).

A glossary file is TSV, one term a line: the source term, then its target term, and optionally
more targets, each an alternative (any one of them satisfies the term); a source term on several
lines gathers their targets. Blank lines and lines that begin with # are skipped.

A term applies to a sentence when its source side occurs in it, case aside, on word boundaries in a
language written with spaces (anywhere in one without). Overlapping occurrences are resolved
longest first, then leftmost: "machine learning" wins over "machine" where both occur, and a term
counts once per sentence however often it occurs. A target side is met when it occurs in the
output by the same rule, in the target language.
"""

from __future__ import annotations

import functools
import re
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Sequence

from attn_cli import languages
from attn_cli.errors import UserError
from attn_cli.vocab import UNK_ID

if TYPE_CHECKING:
    from attn_cli.data.tokenizer import Tokenizer


class GlossaryError(UserError, ValueError):
    """A glossary file that cannot be read; the message names the file and line."""


@dataclass(frozen=True)
class Term:
    source: str
    targets: tuple[str, ...]  # alternatives: any one satisfies the term


TokenTerm = tuple[
    tuple[int, ...], ...
]  # a term for a search: its alternatives, each a non-empty sequence of target ids


def read_glossary(path: str | Path) -> list[Term]:
    path = Path(path)
    try:  # lines end at \n alone, as input files are read (a U+2028 inside a term is not a line end)
        lines = [line.removesuffix("\r") for line in path.read_text(encoding="utf-8-sig").split("\n")]
    except (OSError, UnicodeDecodeError) as error:
        raise GlossaryError(f"cannot read the glossary {path}: {error}") from None
    rows = []
    for number, line in enumerate(lines, 1):
        if not line.strip() or line.lstrip().startswith("#"):
            continue
        fields = [field.strip() for field in line.split("\t")]
        if len(fields) < 2 or not all(fields):
            raise GlossaryError(
                f"{path}:{number}: {line!r} is not SOURCE<TAB>TARGET[<TAB>TARGET...] with no empty field; "
                f"write one term a line, its fields separated by tabs"
            )
        rows.append(fields)
    return _gathered(rows)


def glossary_from_json(value: object, where: str) -> list[Term]:
    """A glossary given inline, as JSON: [[source, target, more targets...], ...] (a JSONL line's or
    a request's "glossary"); `where` names it in an error."""
    fix = 'give "glossary" as [["source term", "target term"], ...], more targets after the first as alternatives'
    if not isinstance(value, list):
        raise GlossaryError(f"{where}: not a list; {fix}")
    for number, entry in enumerate(value):
        if not (
            isinstance(entry, list)
            and len(entry) >= 2
            and all(isinstance(field, str) and field.strip() for field in entry)
        ):
            raise GlossaryError(f"{where}[{number}]: {entry!r} is not a list of two or more non-empty strings; {fix}")
    return _gathered([[field.strip() for field in entry] for entry in value])


def _gathered(rows: Sequence[Sequence[str]]) -> list[Term]:
    """Terms from [source, target, ...] rows: the targets of one source (case aside) gathered."""
    targets: dict[str, list[str]] = {}  # by source term, case aside, in the order first seen
    spelled: dict[str, str] = {}
    for fields in rows:
        key = fields[0].casefold()
        spelled.setdefault(key, fields[0])
        known = targets.setdefault(key, [])
        known.extend(target for target in fields[1:] if target not in known)
    return [Term(spelled[key], tuple(found)) for key, found in targets.items()]


def combined(general: Sequence[Term], particular: Sequence[Term]) -> list[Term]:
    """`general` terms (a --glossary file) with `particular` ones (a line's own): for a source term
    in both, the particular targets replace the general ones."""
    replaced = {term.source.casefold() for term in particular}
    return [term for term in general if term.source.casefold() not in replaced] + list(particular)


def token_alternatives(term: Term, tokenizer: Tokenizer, target_language: str) -> TokenTerm:
    """The token sequences that write the term's target side, for a search to place: each target as
    the tokenizer encodes it alone (a word that begins the output or follows a space) and, in a
    language written without spaces, also as it is written inside a sentence, with no mark of a
    word start (the longest pieces that do not begin a word, bytes where none fits). A target with
    a character the vocabulary cannot write is left out."""
    found: list[tuple[int, ...]] = []
    unspaced = languages.is_unspaced(target_language)
    for target, pieces in zip(term.targets, tokenizer.encode_pieces(list(term.targets))):
        forms = [tuple(tokenizer.piece_to_id(piece) for piece in pieces)]
        if unspaced:
            forms.append(_inside_a_word(target, tokenizer))
        found += [ids for ids in forms if ids and UNK_ID not in ids and ids not in found]
    return tuple(found)


def _inside_a_word(text: str, tokenizer: Tokenizer) -> tuple[int, ...]:
    """`text` in pieces that do not begin a word, longest first; a character no such piece holds
    in its byte pieces, or <unk> when the tokenizer has none."""
    pieces = _inner_pieces(tokenizer)
    longest = max(map(len, pieces), default=1)
    ids, at = [], 0
    while at < len(text):
        size = next((n for n in range(min(longest, len(text) - at), 0, -1) if text[at : at + n] in pieces), 0)
        if size:
            ids.append(pieces[text[at : at + size]])
            at += size
            continue
        ids += [tokenizer.piece_to_id(f"<0x{byte:02X}>") for byte in text[at].encode("utf-8")]
        at += 1
    return tuple(ids)


@functools.lru_cache(maxsize=8)
def _inner_pieces(tokenizer: Tokenizer) -> dict[str, int]:
    """The id of each piece that does not begin a word, by its text (built once per tokenizer)."""
    return {text: i for i, text in enumerate(tokenizer.piece_texts()) if text and not text.startswith(" ")}


@functools.lru_cache(maxsize=8)
def word_continuations(tokenizer: Tokenizer, target_language: str) -> frozenset[int]:
    """In a language written with spaces, the pieces that would glue onto the word before them
    (no word-start mark, a letter or digit first): none may follow a term, so that "cat" is not
    met by "cats". None in a language written without spaces."""
    if languages.is_unspaced(target_language):
        return frozenset()
    return frozenset(i for i, text in enumerate(tokenizer.piece_texts()) if text and text[0].isalnum())


def _spans(text: str, phrase: str, language: str) -> list[tuple[int, int]]:
    """Where `phrase` occurs in `text`, case aside; on word boundaries where words are spaced."""
    escaped = re.escape(phrase.casefold())
    pattern = escaped if languages.is_unspaced(language) else rf"(?<!\w){escaped}(?!\w)"
    return [match.span() for match in re.finditer(pattern, text.casefold())]


def occurs(text: str, phrase: str, language: str) -> bool:
    return bool(_spans(text, phrase, language))


def holds_terms(text: str, terms: Sequence[Term], language: str) -> bool:
    """Whether `text` holds one target of each of `terms`."""
    return all(any(occurs(text, target, language) for target in term.targets) for term in terms)


def applicable_terms(sentence: str, terms: Sequence[Term], source_language: str) -> list[Term]:
    """The terms whose source side occurs in `sentence`, overlaps resolved longest first, then
    leftmost; in the order they occur."""
    candidates = [(start, end, term) for term in terms for start, end in _spans(sentence, term.source, source_language)]
    candidates.sort(key=lambda c: (-(c[1] - c[0]), c[0]))
    taken: list[tuple[int, int]] = []
    chosen: dict[str, tuple[int, Term]] = {}
    for start, end, term in candidates:
        if any(start < other_end and other_start < end for other_start, other_end in taken):
            continue
        taken.append((start, end))
        chosen.setdefault(term.source, (start, term))
    return [term for _, term in sorted(chosen.values(), key=lambda item: item[0])]


@dataclass(frozen=True)
class TermAccuracy:
    applied: int  # terms that applied, summed over sentences
    met: int  # of them, those whose target (one of the alternatives) the output holds
    sentences_with_terms: int
    sentences: int

    @property
    def share(self) -> float:
        return self.met / self.applied if self.applied else 1.0

    def __str__(self) -> str:
        return (
            f"term accuracy = {100 * self.share:.2f}%  ({self.met:,} of {self.applied:,} terms met, "
            f"in {self.sentences_with_terms:,} of {self.sentences:,} sentences)"
        )


def term_accuracy(
    sources: Sequence[str],
    outputs: Sequence[str],
    terms: Sequence[Term],
    source_language: str,
    target_language: str,
) -> TermAccuracy:
    applied = met = with_terms = 0
    for source, output in zip(sources, outputs):
        found = applicable_terms(source, terms, source_language)
        applied += len(found)
        with_terms += bool(found)
        met += sum(any(occurs(output, target, target_language) for target in term.targets) for term in found)
    return TermAccuracy(applied, met, with_terms, len(sources))
