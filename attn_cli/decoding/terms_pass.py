"""The glossary's pass: the parts whose outputs lack one of their terms, searched again, constrained
to write them (decoding/constrained.py).

Every part is searched as without a glossary first (the pipeline's decode stage), so an output that
already holds its terms stays as it was, and the slower constrained search runs only where it
changes something. A part whose terms cannot be placed keeps its first outputs; the assembled
translation names the terms it lacks. Imports nothing heavy.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

from attn_cli.decoding.batches import Progress, decode_parts
from attn_cli.decoding.glossary import Term, holds_terms, token_alternatives

if TYPE_CHECKING:
    from attn_cli.config import DecodeConfig
    from attn_cli.data.tokenizer import Tokenizer
    from attn_cli.decoding.engine import Engine, Searcher
    from attn_cli.decoding.hypothesis import Hypothesis
    from attn_cli.decoding.records import Part


def search_with_terms(
    engine: Engine,
    parts: Sequence[Part],
    first: Sequence[list[Hypothesis]],
    search: Searcher,
    options: DecodeConfig,
    progress: Progress,
) -> list[list[Hypothesis]]:
    """Each part's outputs after the glossary's pass: `first` (each part's from the search without
    terms) where they hold the part's terms, the two searches' outputs merged where they did not."""
    target = engine.tokenizers.target
    language = [part.target or engine.config.data.tgt_lang for part in parts]  # each output's language
    outputs = list(first)
    again = [
        index
        for index, part in enumerate(parts)
        if part.terms
        and not all(holds_terms(text, part.terms, language[index]) for text in _texts(first[index], target))
    ]
    progress.total = len(parts) + len(again)
    if not again:
        return outputs
    # A term the target vocabulary cannot write is left to the check that names unmet terms.
    token_terms = [
        [found for term in parts[index].terms if (found := token_alternatives(term, target, language[index]))]
        for index in again
    ]
    found = decode_parts([parts[index] for index in again], search, options.max_tokens, progress, token_terms)
    for index, hypotheses in zip(again, found):
        outputs[index] = _with_terms_first(
            first[index], hypotheses, parts[index].terms, target, language[index], options.n_best
        )
    return outputs


def _with_terms_first(
    first: list[Hypothesis],
    again: list[Hypothesis],
    terms: Sequence[Term],
    target: Tokenizer,
    language: str,
    n_best: int,
) -> list[Hypothesis]:
    """A part's n-best from its two searches: the first search's best when it holds every term
    (a best translation that follows the glossary stays the best), then every other output that
    holds them, best score first, then, only to fill the list, the outputs that lack some."""
    unique = {tuple(h.tokens): h for h in [*again, *first]}  # an output both found: the first search's
    ranked = sorted(unique.values(), key=lambda h: h.score, reverse=True)
    holds = [holds_terms(text, terms, language) for text in _texts(ranked, target)]
    holding = [h for h, ok in zip(ranked, holds) if ok]
    lacking = [h for h, ok in zip(ranked, holds) if not ok]
    if first and any(h is first[0] for h in holding):
        holding = [first[0], *(h for h in holding if h is not first[0])]
    return (holding + lacking)[:n_best]


def _texts(hypotheses: Sequence[Hypothesis], target: Tokenizer) -> list[str]:
    return target.decode([h.tokens for h in hypotheses])
