"""Several corpora drawn at their weights, anew each epoch.

Each corpus of data.corpora has a weight: the copies of its training pairs an epoch draws. The whole
part of a weight is that many copies of every pair; the fraction is that share of the pairs, drawn
without replacement. So 3 is three copies of each pair, 0.5 half of the pairs (another half each
epoch), and 1.5 every pair once and half of them twice.

The draw is a function of (train.seed, epoch, corpus) alone: every process of a distributed run, and
a resumed run, draws the same epoch. The tokenizer's sample follows the same rule (`weighted_stream`),
so that a corpus drawn at 0.1 teaches the vocabulary a tenth of what it would at 1.
"""

from __future__ import annotations

from typing import Iterable, Iterator, Sequence, TypeVar

import numpy as np

from attn_cli.data.batching import Example

T = TypeVar("T")

_WEIGHT_STREAM = 0x57454947  # keeps the weight draw apart from every other use of (seed, epoch)


def copies(count: int, weight: float, seed: int, epoch: int, corpus: int) -> np.ndarray:
    """How many times an epoch draws each of a corpus's `count` pairs (uint8: weights stay <= 100)."""
    whole = int(weight)
    drawn = np.full(count, whole, dtype=np.uint8)
    extra = int(round((weight - whole) * count))
    if extra:
        rng = np.random.default_rng([seed, epoch, corpus, _WEIGHT_STREAM])
        drawn[rng.choice(count, size=extra, replace=False)] += 1
    return drawn


def weighted_positions(sizes: Sequence[int], weights: Sequence[float], seed: int, epoch: int) -> np.ndarray:
    """The positions an epoch draws from pairs stored corpus after corpus (`sizes` pairs each), a
    position once per copy, in stored order."""
    parts, start = [], 0
    for corpus, (size, weight) in enumerate(zip(sizes, weights)):
        parts.append(
            np.repeat(np.arange(start, start + size, dtype=np.int64), copies(size, weight, seed, epoch, corpus))
        )
        start += size
    return np.concatenate(parts) if parts else np.zeros(0, dtype=np.int64)


def weighted_stream(
    items: Iterable[tuple[int, T]], sizes: Sequence[int], weights: Sequence[float], seed: int, epoch: int = 1
) -> Iterator[T]:
    """`items`, (corpus, item) in corpus order with `sizes` items per corpus, each yielded as many
    times as `epoch`'s draw gives it: the tokenizer's sample follows the weights training uses."""
    drawn = {corpus: copies(size, weights[corpus], seed, epoch, corpus) for corpus, size in enumerate(sizes)}
    position = dict.fromkeys(drawn, 0)
    for corpus, item in items:
        times = int(drawn[corpus][position[corpus]])
        position[corpus] += 1
        for _ in range(times):
            yield item


class DrawnPairs:
    """One epoch's draw from the prepared pairs: positions into them, indexed like them, so that
    joining, batching and the trainer treat both alike."""

    def __init__(self, base, positions: np.ndarray):
        self.base, self.positions = base, positions
        self.src_lengths = base.src_lengths[positions]
        self.tgt_lengths = base.tgt_lengths[positions]

    def __len__(self) -> int:
        return len(self.positions)

    def __getitem__(self, i: int) -> Example:
        found = self.base[int(self.positions[i])]
        return Example(i, found.src, found.tgt)

    def token_count(self, positions: np.ndarray) -> int:
        positions = np.asarray(positions, dtype=np.int64)
        return int(self.src_lengths[positions].sum() + self.tgt_lengths[positions].sum())


def draw_epoch(base, sizes: Sequence[int], weights: Sequence[float], seed: int, epoch: int) -> DrawnPairs:
    """The pairs of `epoch` drawn from `base` (the prepared pairs, corpus after corpus) at `weights`."""
    return DrawnPairs(base, weighted_positions(sizes, weights, seed, epoch))
