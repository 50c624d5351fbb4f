"""The incremental decoding cache.

Each decoder layer owns a `LayerCache`: its self-attention keys and values grow by one position
per step, and its cross-attention keys and values are projected from the encoder output once per
source sentence and reused at every step (with the query and output projections folded into them
when a sentence or two is decoded at a time). Only the cache knows how to grow and how to select
batch rows (dropping finished sentences, or reordering beams).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Callable, Optional

import torch

if TYPE_CHECKING:
    from attn_cli.model.attention import FoldedCrossAttention

KeysValues = tuple[torch.Tensor, torch.Tensor]


class LayerCache:
    """One decoder layer's cache.

    Self-attention keys and values live in one preallocated buffer (rows, capacity, 2 * D), each
    position holding its keys and then its values, as the fused projection's last 2 * D columns
    lay them out: a step copies one slice where `torch.cat` would copy the whole history, and
    attention reads the first `length` positions as views split into heads. Reordering rows for
    beams is a single `index_select` into a spare buffer, after which the two swap; each row's
    history is one contiguous block. Against separate (rows, heads, capacity, d_head) buffers for
    keys and values, a step writes one contiguous slice instead of two strided ones: the writes
    and attention alone, 32 steps of 6 base-size layers, took 26 ms instead of 32 at 32 rows and
    131 ms instead of 166 at 160 (0.2 ms more at 1 row), about 1% and 3% of whole searches, which
    alternating runs of both versions did not tell apart from the noise.
    """

    def __init__(self) -> None:
        self.length = 0  # positions cached so far
        self._history: Optional[torch.Tensor] = None  # (B, capacity, 2 * D): keys, then values
        self._spare: Optional[torch.Tensor] = None  # the reordering target
        self.cross_keys: Optional[torch.Tensor] = None  # (sources, heads, S, d_head)
        self.cross_values: Optional[torch.Tensor] = None
        # Made from the cross keys and values when a sentence or two is decoded (`MultiHeadAttention.fold`).
        self.folded_cross: Optional["FoldedCrossAttention"] = None

    def append_self(self, keys_values: torch.Tensor) -> torch.Tensor:
        """Add this step's (B, T, 2 * D) keys and values; returns all so far, (B, length, 2 * D)."""
        steps = keys_values.shape[1]
        if self._history is None or self.length + steps > self._history.shape[1]:
            self._grow(keys_values, self.length + steps)
        self._history[:, self.length : self.length + steps] = keys_values
        self.length += steps
        return self._history[:, : self.length]

    def _grow(self, like: torch.Tensor, needed: int) -> None:
        batch, _, width = like.shape
        buffer = like.new_empty((batch, max(32, 2 * needed), width))
        if self._history is not None:
            buffer[:, : self.length] = self._history[:, : self.length]
        self._history, self._spare = buffer, None

    def cross_keys_values(self, project: Callable[[], KeysValues]) -> KeysValues:
        if self.cross_keys is None:
            self.cross_keys, self.cross_values = project()
        return self.cross_keys, self.cross_values

    def cross_folded(self, fold: Callable[[], "FoldedCrossAttention"]) -> "FoldedCrossAttention":
        if self.folded_cross is None:
            self.folded_cross = fold()
        return self.folded_cross

    @property
    def rows(self) -> Optional[int]:
        """Rows of self-attention keys and values held; None before the first step."""
        return None if self._history is None else self._history.shape[0]

    def select(self, rows: torch.Tensor, source_rows: Optional[torch.Tensor],
               moved: Optional[torch.Tensor] = None) -> None:
        """Keep these rows in this order. `moved`, when given, lists the rows i with rows[i] != i
        (the row count unchanged): only those are copied, in place."""
        if self._history is not None and moved is not None:
            if moved.numel():
                history = self._history[:, : self.length]
                # index_select copies the origins out first, so a row may be both (a swap).
                with torch.no_grad():
                    history.index_copy_(0, moved, history.index_select(0, rows[moved]))
        elif self._history is not None:
            shape = (rows.shape[0], *self._history.shape[1:])
            spare = self._spare if self._spare is not None and self._spare.shape == shape else self._history.new_empty(shape)
            with torch.no_grad():  # the cache serves inference; `out=` cannot record gradients
                torch.index_select(self._history[:, : self.length], 0, rows, out=spare[:, : self.length])
            self._history, self._spare = spare, self._history
        if self.cross_keys is not None and source_rows is not None:
            self.cross_keys = self.cross_keys.index_select(0, source_rows)
            self.cross_values = self.cross_values.index_select(0, source_rows)
        if self.folded_cross is not None and source_rows is not None:
            self.folded_cross = self.folded_cross.select(source_rows)


class KVCache:
    """The cache of a whole decoder: one `LayerCache` per layer and the number of steps taken."""

    def __init__(self, num_layers: int) -> None:
        self.layers = [LayerCache() for _ in range(num_layers)]
        self.steps = 0  # target positions already decoded, so the next one is at this position

    def select(self, rows: torch.Tensor, source_rows: Optional[torch.Tensor] = None) -> None:
        """Keep only these hypothesis rows, in this order: beams reorder by their origin, finished
        sentences leave. The cross-attention keys and values hold one row per source sentence and
        change only when `source_rows` says which sources stay (None keeps them all).

        While no row leaves and at most half of them move, only the rows that move are copied, in
        place; otherwise each layer copies all rows once into a spare buffer. Beam search puts the
        best hypothesis from each origin back in its origin's row, so how many stay depends on
        how many hypotheses have distinct origins: in `bench_decode.py`'s forced-length search
        with random weights 97% of the rows stay at every step (beam 5, batch 32: 1.14-1.17x
        faster); the trained en-zh model translating the test set kept 55-58%, which made beam 5
        1.06x faster on 600 sentences in batches of 8,000 tokens and 1.02x one sentence at a time.
        """
        moved = None
        if rows.numel() == self.layers[0].rows:
            moved = (rows != torch.arange(rows.numel(), device=rows.device)).nonzero().squeeze(1)
            if 2 * moved.numel() > rows.numel():  # copying the moved rows out and back costs more
                moved = None
        for layer in self.layers:
            layer.select(rows, source_rows, moved)
