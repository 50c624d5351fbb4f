"""What goes into a translation and what comes out of it, one record per sentence.

A `Source` is one input sentence with everything that belongs to it (its text, the prefix its
translation begins with, the glossary terms it must use, whether its attention is wanted). The
readers build it once (input lines, both HTTP APIs, eval), and it travels whole: a new per-sentence
option is a new field here, filled by the readers and read where it is used, not a parameter
through every layer. A `Translation` is what one source gives: its candidates, best first, and
structured notes; `to_dict` is the one JSON shape that `attn translate --format jsonl` and the
server's /v1 share.

Imports nothing heavy, so that a CTranslate2 engine translates without torch.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Optional

from attn_cli.decoding.glossary import Term


@dataclass(frozen=True)
class Source:
    """One sentence to translate and what it asks of its translation."""

    text: str
    prefix: str = ""  # target text the translation must begin with ("" for none)
    terms: tuple[Term, ...] = ()  # glossary terms it must use where their source side occurs
    attention: bool = False  # also take the attention of its best translation (one checkpoint's model)
    target: Optional[str] = None  # the language to translate into (a model of several); None: its first


@dataclass(frozen=True)
class Part:
    """What the model decodes as one input: a whole sentence, or one part of a long one."""

    ids: tuple[int, ...]  # source ids the model reads (source prefix included), without the EOS
    prefix: tuple[int, ...] = ()  # target ids its output is forced to begin with (a first part's only)
    terms: tuple[Term, ...] = ()  # the source's terms that occur in this part
    target: str = ""  # the language its output is written in ("": the model's only one)


@dataclass(frozen=True)
class Note:
    """Something the user should know about one translation: what, in words, and a kind to match on."""

    kind: str  # "split" or "truncated" (a long input), "clauses" (decode.split_clauses), "unmet_terms"
    message: str
    warning: bool = True  # told on stderr by `attn translate`; False: only in the JSON (what was asked for)


@dataclass(frozen=True)
class SourceParts:
    """A source as the model reads it: its parts (none for an empty line), and how a long one was cut."""

    source: Source
    parts: tuple[Part, ...]
    notes: tuple[Note, ...] = ()


@dataclass(frozen=True)
class Candidate:
    """One translation of a whole source: the same rank of each of its parts' outputs, joined."""

    text: str
    score: float  # the parts' summed scores (length-normalised log-probabilities)
    confidence: float  # geometric mean of the chosen tokens' probabilities (decoding/hypothesis.py)
    tokens: list[str]  # target pieces, the parts' in order


@dataclass
class Translation:
    source: Source
    candidates: list[Candidate]  # the n-best list, best first
    notes: list[Note] = field(default_factory=list)
    terms: list[str] = field(default_factory=list)  # the source sides of the glossary terms that applied
    unmet_terms: list[str] = field(default_factory=list)  # of them, those the best candidate lacks
    # (AttentionMaps, source pieces, target pieces) of the first part's best output, when asked for
    attention: Optional[Any] = None

    @property
    def text(self) -> str:
        """The best translation."""
        return self.candidates[0].text if self.candidates else ""

    def to_dict(self) -> dict:
        """The translation as JSON: the best candidate's text, score and confidence, the n-best list
        with each candidate's pieces, the terms that applied and those not met, and the notes."""
        best = self.candidates[0]
        record: dict[str, Any] = {"source": self.source.text}
        if self.source.target is not None:
            record["target"] = self.source.target
        if self.source.prefix:
            record["prefix"] = self.source.prefix
        record |= {
            "translation": best.text,
            "score": round(best.score, 4),
            "confidence": round(best.confidence, 6),
            "n_best": [
                {
                    "translation": c.text,
                    "score": round(c.score, 4),
                    "confidence": round(c.confidence, 6),
                    "tokens": c.tokens,
                }
                for c in self.candidates
            ],
        }
        if self.terms:  # a glossary applied
            record["terms"] = self.terms
            record["unmet_terms"] = self.unmet_terms
        record["notes"] = [{"kind": note.kind, "message": note.message} for note in self.notes]
        return record
