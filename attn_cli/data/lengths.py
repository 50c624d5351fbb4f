"""How long a translation of a source of n tokens is, learned from the training pairs: the counts
of (source length, target length) in tokens, kept in every checkpoint.

A search asks it for the shortest and the longest output a source's length makes plausible, from
the target/source length ratios of the training pairs whose sources are about as long (`bounds`).
This replaces a fixed `a * n + b` limit that is far too loose for short sources and knows nothing
of the language pair, and gives the search a floor too: a model lost in a long input tends either
to stop after its first clause or to run on. Sources longer than any the model trained on take
the ratios of the longest ones it saw. `longest_usual_source` is where a source stops looking like
the training data, which is where translating clause by clause may pay (decoding/parts.py).
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass
from typing import Optional

import numpy as np

LONGEST_COUNTED = 512  # lengths past this are counted as this: the table stays small for any corpus
NEIGHBOURS = 200  # the fewest pairs a source length's ratios are read from; nearby lengths join in until then
RATIO_RANGE = (0.005, 0.995)  # the share of ratios below the floor and below the ceiling
SLACK = 2  # tokens beyond the ceiling (and below the floor): a short source's ratio is coarse
USUAL_SOURCE = 0.99  # the share of training sources at most `longest_usual_source` tokens long


@dataclass(frozen=True)
class LengthModel:
    """counts[s, t]: training pairs of s source and t target tokens (without EOS)."""

    counts: np.ndarray  # (S + 1, T + 1) int64

    @classmethod
    def fit(cls, source_lengths: np.ndarray, target_lengths: np.ndarray) -> "LengthModel":
        sources = np.minimum(np.asarray(source_lengths, dtype=np.int64), LONGEST_COUNTED)
        targets = np.minimum(np.asarray(target_lengths, dtype=np.int64), LONGEST_COUNTED)
        if not len(sources):
            raise ValueError("a length model needs at least one pair")
        counts = np.zeros((int(sources.max()) + 1, int(targets.max()) + 1), dtype=np.int64)
        np.add.at(counts, (sources, targets), 1)
        return cls(counts)

    @classmethod
    def from_counts(cls, counts: Optional[np.ndarray]) -> Optional["LengthModel"]:
        """The model a checkpoint or an export holds; None for one written without it (an import, an older run)."""
        if counts is None:
            return None
        counts = np.asarray(counts, dtype=np.int64)
        if counts.ndim != 2 or counts.min() < 0 or not counts.sum():
            raise ValueError("the length table must be a 2-D table of counts with at least one pair")
        return cls(counts)

    @property
    def longest_usual_source(self) -> int:
        """The source length in tokens that `USUAL_SOURCE` of the training sources do not exceed."""
        per_length = self.counts.sum(axis=1)
        share = np.cumsum(per_length) / per_length.sum()
        return int(np.searchsorted(share, USUAL_SOURCE))

    def bounds(self, source_lengths: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """(shortest, longest) plausible output lengths in tokens (without EOS) for each of
        `source_lengths`, token counts (without EOS)."""
        floors, ceilings = self._tables
        source_lengths = np.asarray(source_lengths, dtype=np.int64)
        at = np.minimum(source_lengths, len(floors) - 1)
        lengths = np.maximum(source_lengths, 1)
        shortest = np.floor(lengths * floors[at]).astype(np.int64) - SLACK
        longest = np.ceil(lengths * ceilings[at]).astype(np.int64) + SLACK
        return np.maximum(shortest, 0), longest

    @functools.cached_property
    def _tables(self) -> tuple[np.ndarray, np.ndarray]:
        """Per source length 0 .. S (the longest counted, standing for any longer): the ratio floor
        and ceiling, read from that length's pairs and its neighbours' until there are `NEIGHBOURS`."""
        per_length = self.counts.sum(axis=1)
        floors, ceilings = [], []
        for length in range(len(per_length)):
            low = high = length
            while per_length[low : high + 1].sum() < NEIGHBOURS and (low > 0 or high < len(per_length) - 1):
                low, high = max(low - 1, 0), min(high + 1, len(per_length) - 1)
            floor, ceiling = _ratio_quantiles(self.counts[low : high + 1], low)
            floors.append(floor)
            ceilings.append(ceiling)
        return np.array(floors), np.array(ceilings)


def _ratio_quantiles(counts: np.ndarray, first_source_length: int) -> tuple[float, float]:
    """The `RATIO_RANGE` quantiles of target/source length among the pairs counted in `counts`,
    whose row i holds sources of first_source_length + i tokens (an empty source counts as one)."""
    sources = np.maximum(np.arange(first_source_length, first_source_length + len(counts)), 1)
    ratios = (np.arange(counts.shape[1])[None, :] / sources[:, None]).ravel()
    weights = counts.ravel()
    order = np.argsort(ratios, kind="stable")
    ratios, share = ratios[order], np.cumsum(weights[order]) / max(weights.sum(), 1)
    floor, ceiling = (float(ratios[min(int(np.searchsorted(share, q)), len(ratios) - 1)]) for q in RATIO_RANGE)
    return floor, max(ceiling, floor, math.ulp(1.0))
