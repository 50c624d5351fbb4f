"""Tokenized examples, length filtering and token-budget batching.

`token_batches` groups tokenized examples into batches with as little padding as a length-bucketed
batcher can manage, planned from their lengths alone; `collate.py` turns a batch into padded
tensors. Imports NumPy, not torch: decoding with CTranslate2 batches through here too.
"""

from __future__ import annotations

import random
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from attn_cli.config import derived_seed


@dataclass(frozen=True)
class Example:
    index: int  # position in the original list, so outputs can be put back in order
    src: list[int]  # token ids, no BOS/EOS
    tgt: list[int]  # token ids, no BOS/EOS; empty for source-only decoding input


def within_length_limits(
    src_lengths: np.ndarray,
    tgt_lengths: np.ndarray,
    max_source_tokens: int,
    max_target_tokens: int,
    max_length_ratio: float,
) -> np.ndarray:
    """Which pairs (token counts without EOS) a training set keeps: both sides within their limits
    and neither more than `max_length_ratio` times as long as the other."""
    src, tgt = np.asarray(src_lengths, dtype=np.int64), np.asarray(tgt_lengths, dtype=np.int64)
    in_range = (src >= 1) & (src <= max_source_tokens) & (tgt >= 1) & (tgt <= max_target_tokens)
    ratio = np.maximum(src, tgt) / np.maximum(np.minimum(src, tgt), 1)
    return in_range & (ratio <= max_length_ratio)


def filter_by_length(
    examples: list[Example], max_source_tokens: int, max_target_tokens: int, max_length_ratio: float
) -> tuple[list[Example], int]:
    """Training examples within the length limits and ratio; returns them and how many were dropped."""
    keep = within_length_limits(
        [len(e.src) for e in examples],
        [len(e.tgt) for e in examples],
        max_source_tokens,
        max_target_tokens,
        max_length_ratio,
    )
    kept = [example for example, kept in zip(examples, keep.tolist()) if kept]
    return kept, len(examples) - len(kept)


def token_batches(
    examples: Sequence[Example], max_tokens: int, shuffle: bool, seed: int = 0, epoch: int = 0
) -> list[np.ndarray]:
    """Positions into `examples`, grouped into length-bucketed batches of at most `max_tokens`.

    A batch's cost is its padded size on the longer side: rows * max(longest src + 1, longest tgt + 1).
    An example over budget on its own still forms a batch of one. With `shuffle`, ties in length are
    broken and batches are ordered by a generator seeded from (seed, epoch): repeatable, yet
    different every epoch. Planned with NumPy from the lengths alone, each batch an array of
    positions, so that an epoch of millions of pairs costs a few bytes per pair.
    """
    src_lengths, tgt_lengths = _lengths(examples)
    count = len(src_lengths)
    if not count:
        return []
    rng = random.Random(derived_seed(seed, epoch))
    tie_break = np.fromiter((rng.random() for _ in range(count)), np.float64, count) if shuffle else np.arange(count)
    order = np.lexsort((tie_break, tgt_lengths, src_lengths))  # by source length, then target length, then tie
    batches = np.split(order, _cut_points(np.maximum(src_lengths, tgt_lengths)[order], max_tokens))
    if shuffle:
        rng.shuffle(batches)
    return batches


def _lengths(examples: Sequence[Example]) -> tuple[np.ndarray, np.ndarray]:
    """Each example's source and target length, EOS or BOS included; from the length arrays of
    memory-mapped pairs (attn_cli/data/prepared.py) without reading their tokens."""
    if hasattr(examples, "src_lengths"):
        return examples.src_lengths + 1, examples.tgt_lengths + 1
    return (
        np.fromiter((len(e.src) + 1 for e in examples), np.int64, len(examples)),
        np.fromiter((len(e.tgt) + 1 for e in examples), np.int64, len(examples)),
    )


def _cut_points(longest_sides: np.ndarray, max_tokens: int) -> list[int]:
    """Where the sorted examples split into runs whose padded size stays within `max_tokens`:
    a run grows until one more example would take it over."""
    cuts: list[int] = []
    size = longest = 0
    chunk = 1 << 16  # Python ints a chunk at a time, not millions at once
    for start in range(0, len(longest_sides), chunk):
        for index, length in enumerate(longest_sides[start : start + chunk].tolist(), start):
            if size and (size + 1) * max(longest, length) > max_tokens:
                cuts.append(index)
                size = longest = 0
            size += 1
            longest = max(longest, length)
    return cuts
