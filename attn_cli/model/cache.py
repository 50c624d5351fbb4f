"""The incremental decoding cache.

Each decoder layer owns a `LayerCache`: its self-attention keys and values grow by one position
per step, and its cross-attention keys and values are projected from the encoder output once per
source sentence and reused at every step. Only the cache knows how to grow and how to select
batch rows (dropping finished sentences, or reordering beams).
"""

from __future__ import annotations

from typing import Callable, Optional

import torch

KeysValues = tuple[torch.Tensor, torch.Tensor]


class LayerCache:
    """One decoder layer's cache.

    Self-attention keys and values live in one preallocated buffer (rows, capacity, 2 * D), each
    position holding its keys and then its values, as the fused projection's last 2 * D columns
    lay them out: a step copies one slice where `torch.cat` would copy the whole history, and
    attention reads the first `length` positions as views split into heads. Selecting rows is a
    single `index_select` into a spare buffer, after which the two swap.
    """

    def __init__(self, hypotheses: int = 1) -> None:
        self.hypotheses = hypotheses  # decoder rows per source row: b*g .. b*g+g-1 decode source b
        self.length = 0  # positions cached so far
        self._history: Optional[torch.Tensor] = None  # (B, capacity, 2 * D): keys, then values
        self._spare: Optional[torch.Tensor] = None  # the target of the next row selection
        self.cross_keys: Optional[torch.Tensor] = None  # (sources, heads, S, d_head)
        self.cross_values: Optional[torch.Tensor] = None

    def append_self(self, keys_values: torch.Tensor) -> torch.Tensor:
        """Add this step's (B, T, 2 * D) keys and values; returns all so far, (B, length, 2 * D)."""
        steps = keys_values.shape[1]
        if self._history is None or self.length + steps > self._history.shape[1]:
            self._grow(keys_values, self.length + steps)
        self._history[:, self.length : self.length + steps] = keys_values
        self.length += steps
        return self._history[:, : self.length]

    def self_keys_values(self) -> Optional[torch.Tensor]:
        """The self-attention keys and values cached so far, (B, length, 2 * D); None before any."""
        return None if self._history is None else self._history[:, : self.length]

    def _grow(self, like: torch.Tensor, needed: int) -> None:
        batch, _, width = like.shape
        buffer = like.new_empty((batch, max(32, 2 * needed), width))
        if self._history is not None:
            buffer[:, : self.length] = self._history[:, : self.length]
        self._history, self._spare = buffer, None

    def cross_keys_values(self, project: Callable[[], KeysValues]) -> KeysValues:
        """The cross-attention keys and values, projected by `project` at the first step only."""
        if self.cross_keys is None:
            self.cross_keys, self.cross_values = project()
        return self.cross_keys, self.cross_values

    def select(self, rows: torch.Tensor, source_rows: Optional[torch.Tensor]) -> None:
        """Keep these self-attention rows in this order, and these source rows (None: all)."""
        if self._history is not None:
            shape = (rows.shape[0], *self._history.shape[1:])
            spare = (
                self._spare
                if self._spare is not None and self._spare.shape == shape
                else self._history.new_empty(shape)
            )
            with torch.no_grad():  # the cache serves inference; `out=` cannot record gradients
                torch.index_select(self._history[:, : self.length], 0, rows, out=spare[:, : self.length])
            self._history, self._spare = spare, self._history
        if self.cross_keys is not None and source_rows is not None:
            self.cross_keys = self.cross_keys.index_select(0, source_rows)
            self.cross_values = self.cross_values.index_select(0, source_rows)


class KVCache:
    """The cache of a whole decoder: one `LayerCache` per layer and the number of steps taken."""

    def __init__(self, num_layers: int, hypotheses: int = 1) -> None:
        """`hypotheses`: the decoder rows of each source (a beam's k), which share its
        cross-attention keys and values."""
        self.layers = [LayerCache(hypotheses) for _ in range(num_layers)]
        self.steps = 0  # target positions already decoded, so the next one is at this position

    def select(self, rows: torch.Tensor, source_rows: Optional[torch.Tensor] = None) -> None:
        """Keep only these hypothesis rows, in this order: beams reorder by their origin, finished
        sentences leave. The cross-attention keys and values hold one row per source sentence and
        change only when `source_rows` says which sources stay (None keeps them all)."""
        for layer in self.layers:
            layer.select(rows, source_rows)
