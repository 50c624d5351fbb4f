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
    def __init__(self) -> None:
        self.self_keys: Optional[torch.Tensor] = None  # (B, heads, steps so far, d_head)
        self.self_values: Optional[torch.Tensor] = None
        self.cross_keys: Optional[torch.Tensor] = None  # (B, heads, S, d_head)
        self.cross_values: Optional[torch.Tensor] = None

    def append_self(self, keys: torch.Tensor, values: torch.Tensor) -> KeysValues:
        if self.self_keys is None:
            self.self_keys, self.self_values = keys, values
        else:
            self.self_keys = torch.cat([self.self_keys, keys], dim=2)
            self.self_values = torch.cat([self.self_values, values], dim=2)
        return self.self_keys, self.self_values

    def cross_keys_values(self, project: Callable[[], KeysValues]) -> KeysValues:
        if self.cross_keys is None:
            self.cross_keys, self.cross_values = project()
        return self.cross_keys, self.cross_values

    def select(self, rows: torch.Tensor, source_rows: torch.Tensor) -> None:
        if self.self_keys is not None:
            self.self_keys = self.self_keys.index_select(0, rows)
            self.self_values = self.self_values.index_select(0, rows)
        if self.cross_keys is not None and source_rows is not None:
            self.cross_keys = self.cross_keys.index_select(0, source_rows)
            self.cross_values = self.cross_values.index_select(0, source_rows)


class KVCache:
    """The cache of a whole decoder: one `LayerCache` per layer and the number of steps taken."""

    def __init__(self, num_layers: int) -> None:
        self.layers = [LayerCache() for _ in range(num_layers)]
        self.steps = 0  # target positions already decoded, so the next one is at this position

    def select(self, rows: torch.Tensor, source_rows: Optional[torch.Tensor] = None) -> None:
        """Keep only these hypothesis rows, in this order: beams reorder by their origin, finished
        sentences leave. The cross-attention keys and values hold one row per source sentence and
        change only when `source_rows` says which sources stay (None keeps them all)."""
        for layer in self.layers:
            layer.select(rows, source_rows)
