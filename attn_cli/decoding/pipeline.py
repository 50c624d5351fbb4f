"""From sources to translations, in stages, with any engine:

1. split: each source encoded into the parts the model decodes (`parts.py`);
2. decode: every part, in length-sorted token-budget batches, by the engine's configured search;
3. terms: the parts whose outputs lack a glossary term searched again, constrained (`terms_pass.py`);
4. assemble: each source's candidates from its parts' outputs, with notes, terms met and unmet,
   and attention when the source asks for it.

Training's validation BLEU, `attn translate`, `attn eval` and `attn serve` all come through here, so
they all decode the same way. A server runs stage 1 as a request arrives and the others in its
model worker, several requests' parts decoded together. Imports nothing heavy: the engine brings
torch, or not.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Optional

from attn_cli import languages
from attn_cli.decoding.batches import OnBatch, Progress, decode_parts
from attn_cli.decoding.glossary import holds_terms
from attn_cli.decoding.hypothesis import Hypothesis, confidence
from attn_cli.decoding.parts import split_sources
from attn_cli.decoding.records import Candidate, Note, Part, Source, SourceParts, Translation
from attn_cli.decoding.terms_pass import search_with_terms

if TYPE_CHECKING:
    from attn_cli.config import DecodeConfig
    from attn_cli.decoding.engine import Engine, StopCheck


def translate(
    engine: Engine, sources: Sequence[Source], options: DecodeConfig, on_batch: Optional[OnBatch] = None
) -> list[Translation]:
    """Each source's translation, in input order. An empty (or all-whitespace) source translates to
    empty candidates. What the engine refuses is the caller's to check first (`decoding.engine.refusals`)."""
    return translate_prepared(engine, split_sources(engine, sources, options), options, on_batch)


def translate_prepared(
    engine: Engine,
    prepared: Sequence[SourceParts],
    options: DecodeConfig,
    on_batch: Optional[OnBatch] = None,
    stop: Optional[StopCheck] = None,
) -> list[Translation]:
    """Stages 2 to 4 for sources already split into parts (stage 1, `split_sources`); `stop` is
    asked between search steps (a server's worker: nobody waits for the result any more)."""
    return assemble(engine, prepared, decode(engine, prepared, options, on_batch, stop).outputs, options)


@dataclass
class Decoded:
    """Every part's hypotheses, best first, in the order of the sources' parts."""

    first: list[list[Hypothesis]]  # of the search without terms: what the sources give with no glossary
    outputs: list[list[Hypothesis]]  # after the terms pass


def decode(
    engine: Engine,
    prepared: Sequence[SourceParts],
    options: DecodeConfig,
    on_batch: Optional[OnBatch] = None,
    stop: Optional[StopCheck] = None,
) -> Decoded:
    """Stages 2 and 3: decode every part of `prepared`, then search again with their terms the parts
    whose outputs lack some. `on_batch` counts a part with terms twice until the first search says
    whether it needs another."""
    parts = [part for source in prepared for part in source.parts]
    return decode_parts_with_terms(engine, parts, options, on_batch, stop)


def decode_parts_with_terms(
    engine: Engine,
    parts: Sequence[Part],
    options: DecodeConfig,
    on_batch: Optional[OnBatch] = None,
    stop: Optional[StopCheck] = None,
) -> Decoded:
    """Stages 2 and 3 for parts of any sources (a server's worker decodes a long request's parts in
    turns, and assembles the request once its last part is in)."""
    progress = Progress(on_batch, len(parts) + sum(1 for part in parts if part.terms))
    search = engine.searcher(options, stop)
    first = decode_parts(parts, search, options.max_tokens, progress)
    return Decoded(first, search_with_terms(engine, parts, first, search, options, progress))


def assemble(
    engine: Engine, prepared: Sequence[SourceParts], outputs: Sequence[list[Hypothesis]], options: DecodeConfig
) -> list[Translation]:
    """Stage 4: each source's translation from its parts' outputs (`outputs` in the order of the
    sources' parts): the i-th candidate joins the i-th best output of each part."""
    translations, start = [], 0
    for source in prepared:
        language = engine.config.data.direction_into(source.source.target).target
        joiner = languages.joiner(language)  # between the parts of a split input
        mine = list(outputs[start : start + len(source.parts)])
        start += len(source.parts)
        translation = Translation(source.source, _candidates(engine, mine, joiner, options.n_best), list(source.notes))
        terms = list(dict.fromkeys(term for part in source.parts for term in part.terms))
        translation.terms = [term.source for term in terms]
        translation.unmet_terms = [t.source for t in terms if not holds_terms(translation.text, [t], language)]
        if translation.unmet_terms:
            named = ", ".join(repr(term) for term in translation.unmet_terms)
            translation.notes.append(
                Note(
                    "unmet_terms",
                    f"glossary terms not met ({named}): they do not fit within the output limit (--max-len-a, "
                    f"--max-len-b), an output rule forbids them, or the target vocabulary cannot write them",
                )
            )
        if source.source.attention and mine and mine[0]:
            translation.attention = engine.attention(source.parts[0], mine[0][0].tokens)
        translations.append(translation)
    return translations


def _candidates(engine: Engine, outputs: list[list[Hypothesis]], joiner: str, n_best: int) -> list[Candidate]:
    """The candidates of one source from its parts' hypotheses; an empty source (no parts) gets
    `n_best` empty ones, so that n-best output keeps n lines per input."""
    if not outputs:
        return [Candidate("", 0.0, 1.0, []) for _ in range(n_best)]
    target = engine.tokenizers.target
    found = []
    for rank in range(min(len(hypotheses) for hypotheses in outputs)):
        chosen = [hypotheses[rank] for hypotheses in outputs]
        found.append(
            Candidate(
                joiner.join(target.decode([h.tokens for h in chosen])),
                sum(h.score for h in chosen),
                confidence(chosen),
                [piece for h in chosen for piece in target.id_to_piece(h.tokens)],
            )
        )
    return found
