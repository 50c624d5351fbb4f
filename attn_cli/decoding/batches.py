"""Parts decoded in batches: sorted by length and grouped within a token budget, so that a batch
holds little padding, each batch searched by an engine's configured search. Imports nothing heavy."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Optional

from attn_cli.data.batching import Example, token_batches

if TYPE_CHECKING:
    from attn_cli.decoding.engine import Searcher
    from attn_cli.decoding.glossary import TokenTerm
    from attn_cli.decoding.hypothesis import Hypothesis
    from attn_cli.decoding.records import Part

OnBatch = Callable[[int, int], None]  # (parts decoded, parts to decode), told after each batch


@dataclass
class Progress:
    """`on_batch` told of the parts decoded so far, over every search of one translation call."""

    on_batch: Optional[OnBatch]
    total: int
    done: int = 0

    def advance(self, count: int) -> None:
        self.done += count
        if self.on_batch is not None:
            self.on_batch(self.done, self.total)


def decode_parts(
    parts: Sequence[Part],
    search: Searcher,
    max_tokens: int,
    progress: Progress,
    terms: Optional[Sequence[Sequence[TokenTerm]]] = None,
) -> list[list[Hypothesis]]:
    """Each part's hypotheses, decoded in length-sorted batches of at most `max_tokens` source
    tokens; with `terms` (each part's, as token alternatives), by the constrained search."""
    outputs: list[list[Hypothesis]] = [[] for _ in parts]
    examples = [Example(index, part.ids, []) for index, part in enumerate(parts)]
    for positions in token_batches(examples, max_tokens, shuffle=False):
        rows = positions.tolist()
        batch = [parts[row] for row in rows]
        found = search(batch) if terms is None else search(batch, [terms[row] for row in rows])
        for row, hypotheses in zip(rows, found):
            outputs[row] = hypotheses
        progress.advance(len(rows))
    return outputs
