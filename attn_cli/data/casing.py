"""Training pairs upper-cased or title-cased, so that a model trained on ordinary text keeps
translating when its input comes in ALL CAPS or As A Headline.

A corpus rarely holds such text, and a model that never saw it meets unknown pieces (an upper-case
word is split into other, rarer pieces) and falls apart on it: among the commonest complaints
against small CPU translation models. Each epoch, a share of the training pairs (`train.casing.upper`,
`train.casing.title`) is drawn at random and recased on both sides: upper case, or each word's first
letter a capital. Languages without case (Chinese, Japanese, ...) are left as they are, since their
characters have no upper case. The recased text is tokenized again, so a recased pair is exactly the
pair a corpus line in those letters would give; a pair that comes out over the length limits stays
as it was. An epoch still holds every pair once.

The draw is a function of (train.seed, epoch) alone: every process of a distributed run, and a
resumed run, builds the same epoch.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from attn_cli.data.batching import Example, within_length_limits
from attn_cli.data.prepared import TokenizedPairs
from attn_cli.data.tokenizer import Tokenizers

_CASING_STREAM = 0x43415345  # keeps the casing draw apart from every other use of (seed, epoch)
_CHUNK = 20_000  # pairs recased and tokenized at a time


@dataclass(frozen=True)
class CasingSettings:
    upper: float  # share of the pairs upper-cased
    title: float  # share title-cased
    max_source_tokens: int  # a recased pair longer than these on either side stays as it was
    max_target_tokens: int


def title_case(text: str) -> str:
    """Each space-separated word with its first letter a capital, the rest as it was ("don't" stays
    "Don't", where str.title gives "Don'T")."""
    return " ".join(word[:1].upper() + word[1:] for word in text.split(" "))


def upper_case(text: str) -> str:
    return text.upper()


class RecasedPairs:
    """One epoch's pairs with some of them recased: the recased ones in memory, the rest read from
    `base`. Indexing, lengths and token counts work as on TokenizedPairs."""

    def __init__(self, base, positions: np.ndarray, recased: TokenizedPairs):
        self.base, self.positions, self.recased = base, positions, recased  # positions sorted, one per recased pair
        self.src_lengths = np.array(base.src_lengths, dtype=np.int64)
        self.tgt_lengths = np.array(base.tgt_lengths, dtype=np.int64)
        self.src_lengths[positions] = recased.src_lengths
        self.tgt_lengths[positions] = recased.tgt_lengths

    def __len__(self) -> int:
        return len(self.src_lengths)

    def __getitem__(self, i: int) -> Example:
        found = int(np.searchsorted(self.positions, i))
        if found < len(self.positions) and self.positions[found] == i:
            pair = self.recased[found]
        else:
            pair = self.base[i]
        return Example(i, pair.src, pair.tgt)

    @property
    def recased_count(self) -> int:
        return len(self.positions)

    def token_count(self, positions: np.ndarray) -> int:
        positions = np.asarray(positions, dtype=np.int64)
        return int(self.src_lengths[positions].sum() + self.tgt_lengths[positions].sum())


def case_epoch(base, tokenizers: Tokenizers, settings: CasingSettings, seed: int, epoch: int) -> RecasedPairs:
    """The examples of `epoch`: `base` with the `upper` and `title` shares of its pairs recased,
    drawn from (seed, epoch)."""
    rng = np.random.default_rng([seed, epoch, _CASING_STREAM])
    chosen = rng.permutation(len(base))
    upper_count = int(round(settings.upper * len(base)))
    title_count = int(round(settings.title * len(base)))
    plans = [(p, upper_case) for p in chosen[:upper_count].tolist()]
    plans += [(p, title_case) for p in chosen[upper_count : upper_count + title_count].tolist()]
    plans.sort()
    kept_positions, src_rows, tgt_rows = [], [], []
    for start in range(0, len(plans), _CHUNK):  # a chunk's texts at a time, never the epoch's
        chunk = plans[start : start + _CHUNK]
        sources = tokenizers.decode_sources([base[p].src for p, _ in chunk])
        targets = tokenizers.target.decode([base[p].tgt for p, _ in chunk])
        recased_sources = []
        for source, (_, recase) in zip(sources, chunk):
            tags, text = tokenizers.split_leading_tags(source)
            recased_sources.append(f"{tags} {recase(text)}" if tags else recase(text))
        src_ids = tokenizers.encode_sources(recased_sources)
        tgt_ids = tokenizers.target.encode([recase(target) for target, (_, recase) in zip(targets, chunk)])
        fits = within_length_limits(
            [len(row) for row in src_ids],
            [len(row) for row in tgt_ids],
            settings.max_source_tokens,
            settings.max_target_tokens,
            float("inf"),
        )
        for (position, _), src_row, tgt_row, made in zip(chunk, src_ids, tgt_ids, fits.tolist()):
            if made:
                kept_positions.append(position)
                src_rows.append(np.asarray(src_row, dtype=np.int32))
                tgt_rows.append(np.asarray(tgt_row, dtype=np.int32))
    return RecasedPairs(base, np.asarray(kept_positions, dtype=np.int64), TokenizedPairs.from_rows(src_rows, tgt_rows))
