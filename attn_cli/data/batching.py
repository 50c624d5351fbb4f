"""Tokenized examples, length filtering and token-budget batching.

`token_batches` and `collate` turn tokenized examples into padded tensors with as little padding as
a length-bucketed batcher can manage.
"""

from __future__ import annotations

import random
from collections.abc import Sequence
from dataclasses import dataclass

import torch

from attn_cli.vocab import BOS_ID, EOS_ID, PAD_ID

@dataclass(frozen=True)
class Example:
    index: int  # position in the original list, so outputs can be put back in order
    src: list[int]  # token ids, no BOS/EOS
    tgt: list[int]  # token ids, no BOS/EOS; empty for source-only decoding input


def filter_by_length(examples: list[Example], max_source_tokens: int, max_target_tokens: int,
                     max_length_ratio: float) -> tuple[list[Example], int]:
    """Training examples within the length limits and ratio; returns them and how many were dropped."""
    def keep(example: Example) -> bool:
        src_len, tgt_len = len(example.src), len(example.tgt)
        if not (1 <= src_len <= max_source_tokens and 1 <= tgt_len <= max_target_tokens):
            return False
        return max(src_len, tgt_len) / min(src_len, tgt_len) <= max_length_ratio

    kept = [example for example in examples if keep(example)]
    return kept, len(examples) - len(kept)


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
        tensor[i, :len(row)] = torch.tensor(row, dtype=torch.long)
    return tensor


def collate(examples: list[Example]) -> Batch:
    """Pad a list of examples into one batch; the source gets EOS, the target BOS (in) and EOS (out)."""
    if not examples:
        raise ValueError("collate needs at least one example")
    return Batch(src=_padded([e.src + [EOS_ID] for e in examples]),
                 tgt_in=_padded([[BOS_ID] + e.tgt for e in examples]),
                 tgt_out=_padded([e.tgt + [EOS_ID] for e in examples]),
                 indices=[e.index for e in examples])


def token_batches(examples: Sequence[Example], max_tokens: int, shuffle: bool, seed: int = 0,
                  epoch: int = 0) -> list[list[int]]:
    """Positions into `examples`, grouped into length-bucketed batches of at most `max_tokens`.

    A batch's cost is its padded size on the longer side: rows * max(longest src + 1, longest tgt + 1).
    An example over budget on its own still forms a batch of one. With `shuffle`, ties in length are
    broken and batches are ordered by a generator seeded from (seed, epoch): repeatable, yet
    different every epoch.
    """
    src_lengths, tgt_lengths = _lengths(examples)
    rng = random.Random(seed * 1000003 + epoch)
    tie_break = [rng.random() for _ in range(len(src_lengths))] if shuffle else list(range(len(src_lengths)))
    order = sorted(range(len(src_lengths)), key=lambda i: (src_lengths[i], tgt_lengths[i], tie_break[i]))
    batches = _cut_by_budget(src_lengths, tgt_lengths, order, max_tokens)
    if shuffle:
        rng.shuffle(batches)
    return batches


def _lengths(examples: Sequence[Example]) -> tuple[list[int], list[int]]:
    """Each example's source and target length, EOS or BOS included; from the length arrays of
    memory-mapped pairs (attn_cli/data/prepared.py) without reading their tokens."""
    if hasattr(examples, "src_lengths"):
        return (examples.src_lengths + 1).tolist(), (examples.tgt_lengths + 1).tolist()
    return [len(e.src) + 1 for e in examples], [len(e.tgt) + 1 for e in examples]


def _cut_by_budget(src_lengths: list[int], tgt_lengths: list[int], order: list[int], max_tokens: int) -> list[list[int]]:
    """Consecutive runs of `order` whose padded size stays within `max_tokens`."""
    batches: list[list[int]] = []
    batch: list[int] = []
    longest = 0
    for position in order:
        length = max(src_lengths[position], tgt_lengths[position])
        if batch and (len(batch) + 1) * max(longest, length) > max_tokens:
            batches.append(batch)
            batch, longest = [], 0
        batch.append(position)
        longest = max(longest, length)
    if batch:
        batches.append(batch)
    return batches
