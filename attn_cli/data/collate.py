"""Tokenized examples as padded tensors: the batches training steps and searches take."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from attn_cli.data.batching import Example
from attn_cli.vocab import BOS_ID, EOS_ID, PAD_ID


@dataclass
class Batch:
    src: torch.Tensor  # (B, S) long: source ids + EOS, right-padded with PAD_ID
    tgt_in: torch.Tensor  # (B, T) long: BOS + target ids, right-padded (teacher forcing input)
    tgt_out: torch.Tensor  # (B, T) long: target ids + EOS, right-padded (labels)
    indices: list[int]  # Example.index of each row

    def to(self, device: torch.device | str) -> "Batch":
        return Batch(self.src.to(device), self.tgt_in.to(device), self.tgt_out.to(device), self.indices)

    def without_labels(self) -> "Batch":
        """The same inputs with every label ignored: a forward and backward that count for nothing."""
        return Batch(self.src, self.tgt_in, torch.full_like(self.tgt_out, PAD_ID), self.indices)

    @property
    def num_target_tokens(self) -> int:
        return int((self.tgt_out != PAD_ID).sum())

    @property
    def num_source_tokens(self) -> int:
        return int((self.src != PAD_ID).sum())


def _padded(rows: list[list[int]]) -> torch.Tensor:
    tensor = torch.full((len(rows), max(len(row) for row in rows)), PAD_ID, dtype=torch.long)
    for i, row in enumerate(rows):
        tensor[i, : len(row)] = torch.tensor(row, dtype=torch.long)
    return tensor


def padded_sources(rows: list[list[int]]) -> torch.Tensor:
    """(B, S) source ids, each row ending in EOS, right-padded: what a search takes."""
    return _padded([row + [EOS_ID] for row in rows])


def collate(examples: list[Example]) -> Batch:
    """Pad a list of examples into one batch; the source gets EOS, the target BOS (in) and EOS (out)."""
    if not examples:
        raise ValueError("collate needs at least one example")
    return Batch(
        src=_padded([e.src + [EOS_ID] for e in examples]),
        tgt_in=_padded([[BOS_ID] + e.tgt for e in examples]),
        tgt_out=_padded([e.tgt + [EOS_ID] for e in examples]),
        indices=[e.index for e in examples],
    )
