"""The first stage of a translation: each source encoded into the parts a model decodes.

A source of more tokens than the model takes is split at sentence or clause boundaries (or
truncated, as `decode.long_inputs` says); with `decode.split_clauses`, a source longer than the
model's training sources is cut into clauses too, for a model tends to lose its place in an input
longer than any it learned from. Each part has the source prefix a multi-target model needs; the
target prefix forces the first part's output, and each part carries the glossary terms whose source
side occurs in it. Imports nothing heavy.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Optional

from attn_cli.decoding.glossary import applicable_terms
from attn_cli.decoding.records import Note, Part, Source, SourceParts
from attn_cli.errors import UserError
from attn_cli.languages import conjunctions, is_unspaced

if TYPE_CHECKING:
    from attn_cli.config import DecodeConfig
    from attn_cli.data.tokenizer import Tokenizer
    from attn_cli.decoding.engine import Engine

# Where a long input may be cut: after a piece that ends a sentence or a clause.
_BOUNDARY_ENDINGS = tuple(".!?;:,。！？；：，")
SHORTEST_CLAUSE = 4  # tokens: a shorter part is a phrase torn from its clause, not a clause


def split_sources(engine: Engine, sources: Sequence[Source], options: DecodeConfig) -> list[SourceParts]:
    """Each source as the parts `engine` decodes. A UserError names a prefix too long to output."""
    tokenizers = engine.tokenizers
    prefixes = encode_prefixes([source.prefix for source in sources], tokenizers.target, engine.max_target_tokens)
    # A long input is cut without its lead (the source prefix, a corpus tag typed before it), and
    # every part gets the lead: a multi-target model needs its prefix at the start of each source.
    directions = [engine.config.data.direction_into(source.target) for source in sources]
    leads = [
        tokenizers.source_lead(source.text.strip(), direction.target if tokenizers.multi_target else None)
        for source, direction in zip(sources, directions)
    ]
    plain = tokenizers.source.encode([rest for _, rest in leads])
    longest_clause = engine.lengths.longest_usual_source if options.split_clauses and engine.lengths else None
    found = []
    for source, direction, (lead, _), ids, prefix in zip(sources, directions, leads, plain, prefixes):
        language = direction.source
        room = engine.max_source_tokens - len(lead)
        pieces = fit_to_length(ids, room, options.long_inputs, tokenizers.source.id_to_piece)
        fitted = len(pieces)
        if longest_clause is not None:
            pieces = [
                clause
                for piece in pieces
                for clause in clauses(piece, longest_clause, tokenizers.source.id_to_piece(piece), language)
            ]
        whole = len(pieces) == 1 and len(pieces[0]) == len(ids)
        parts = []
        for number, piece in enumerate(pieces):
            if not piece:  # an empty line: nothing to decode
                continue
            prefixed = [*lead, *piece]
            terms: tuple = ()
            if source.terms:
                text = source.text if whole else tokenizers.source.decode([piece])[0]
                terms = tuple(applicable_terms(text, source.terms, language))
            parts.append(Part(tuple(prefixed), tuple(prefix) if number == 0 else (), terms, direction.target))
        notes = _cut_notes(len(lead) + len(ids) if ids else 0, parts, fitted)
        found.append(SourceParts(source, tuple(parts), notes))
    return found


def _cut_notes(tokens: int, parts: list[Part], fitted: int) -> tuple[Note, ...]:
    """What was done to an input of `tokens` tokens that the model does not take whole (`fitted`:
    the parts it was cut into to fit), or that was translated clause by clause."""
    if len(parts) > max(fitted, 1):
        words = f"{tokens} tokens is longer than the training sources; translated in {len(parts)} clauses"
        return (Note("clauses", words, warning=False),)
    if len(parts) > 1:
        return (Note("split", f"{tokens} tokens is more than the model takes; translated in {len(parts)} parts"),)
    if parts and len(parts[0].ids) < tokens:
        return (
            Note(
                "truncated", f"{tokens} tokens is more than the model takes; truncated to the first {len(parts[0].ids)}"
            ),
        )
    return ()


def fit_to_length(ids: list[int], limit: int, mode: str, pieces: Callable[[list[int]], list[str]]) -> list[list[int]]:
    """An input of more than `limit` tokens, cut to fit: truncated, or split into parts at the last
    sentence or clause boundary of each window (at the window's end when it has none in its second half)."""
    if len(ids) <= limit:
        return [ids]
    if mode == "truncate":
        return [ids[:limit]]
    boundaries = {i + 1 for i, piece in enumerate(pieces(ids)) if piece.rstrip().endswith(_BOUNDARY_ENDINGS)}
    parts, start = [], 0
    while len(ids) - start > limit:
        # max(1, ...): with limit 1, a boundary at `start` itself would cut an empty part, forever.
        cut = max((b for b in boundaries if start + max(1, limit // 2) <= b <= start + limit), default=start + limit)
        parts.append(ids[start:cut])
        start = cut
    parts.append(ids[start:])
    return parts


def clauses(ids: list[int], longest: int, pieces: Sequence[str], language: str) -> list[list[int]]:
    """`ids` (whose pieces are `pieces`) cut into clauses of at most `longest` tokens where it can be:
    in two at the boundary nearest its middle, and each half again while it is too long. A boundary
    follows a punctuation mark that ends a clause or a sentence, or, where there is none, comes
    before a coordinating conjunction of the language (languages.py); no part is shorter than
    `SHORTEST_CLAUSE`. A source with nowhere to cut stays whole."""
    if len(ids) <= longest:
        return [ids]
    fits = range(SHORTEST_CLAUSE, len(ids) - SHORTEST_CLAUSE + 1)
    marked = [i + 1 for i, piece in enumerate(pieces) if i + 1 in fits and piece.rstrip().endswith(_BOUNDARY_ENDINGS)]
    if not marked:
        words = conjunctions(language)
        starts_word = is_unspaced(language)  # an unspaced language's pieces carry no word-start mark
        marked = [
            i
            for i, piece in enumerate(pieces)
            if i in fits and piece.lstrip("▁").lower() in words and (starts_word or piece.startswith("▁"))
        ]
    if not marked:
        return [ids]
    cut = min(marked, key=lambda b: (abs(2 * b - len(ids)), b))
    return [
        *clauses(ids[:cut], longest, pieces[:cut], language),
        *clauses(ids[cut:], longest, pieces[cut:], language),
    ]


def encode_prefixes(prefixes: Sequence[str], target: Tokenizer, most: Optional[int]) -> list[list[int]]:
    """The target ids of each prefix (no EOS: the output goes on after it); a prefix must leave the
    decoder a position to end in: at most `most` tokens (None: no end)."""
    if not any(prefix.strip() for prefix in prefixes):
        return [[] for _ in prefixes]
    ids = target.encode([prefix.strip() for prefix in prefixes])
    for prefix, prefix_ids in zip(prefixes, ids):
        if most is not None and len(prefix_ids) > most:  # the output begins with the prefix
            shown = prefix if len(prefix) <= 40 else prefix[:40] + "…"
            raise UserError(
                f"the prefix {shown!r} is {len(prefix_ids)} target tokens, more than the {most} "
                f"the model can output; shorten it"
            )
    return ids
