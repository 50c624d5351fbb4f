"""Training pairs joined into longer ones, so that a model trained on short sentences sees long inputs.

Tatoeba-like corpora are mostly sentences of a few words; a model trained on them alone has never
seen a 30-word input, and breaks down on one (it stops early, or stutters). Each epoch, a share of
the training pairs (`train.join.rate`) is drawn at random and grouped, two to `train.join.max_pairs`
at a time, into joined pairs: the sources joined with a space, the targets with the target
language's separator (none for Chinese, Japanese, Thai and the like, a space otherwise), and the
joined text tokenized again, so that a joined pair is exactly the pair a corpus line holding both
sentences would give. The rest of the pairs stay as they are: an epoch still holds every pair once,
alone or inside a joined pair, and the same number of tokens.

The draw is a function of (train.seed, epoch) alone: every process of a distributed run, and a
resumed run, builds the same epoch.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Optional

import numpy as np

from attn_cli.data.batching import Example, within_length_limits
from attn_cli.data.prepared import TokenizedPairs
from attn_cli.data.tokenizer import Tokenizers

_JOIN_STREAM = 0x4A4F494E  # keeps the join draw apart from every other use of (seed, epoch)
_CHUNK = 20_000  # groups joined and tokenized at a time


@dataclass(frozen=True)
class JoinSettings:
    rate: float  # share of the pairs that go into joined pairs each epoch
    max_pairs: int  # most pairs in one joined pair
    max_source_tokens: int  # a joined pair longer than these on either side is not made
    max_target_tokens: int
    source_separator: str
    target_separator: str
    # A multi-target model's target languages: their separators (source, target), by target
    # language; pairs are joined only with pairs of the same target language.
    by_target: Optional[dict[str, tuple[str, str]]] = None


def plan_groups(
    src_lengths: np.ndarray, tgt_lengths: np.ndarray, settings: JoinSettings, rng: np.random.Generator
) -> list[np.ndarray]:
    """Groups of positions to join: a random `rate` share of the pairs, in random order, cut into runs
    of 2..max_pairs (drawn per group) whose summed token counts stay within the limits. A pair that
    would be left alone goes back to the singles (it is in no group)."""
    count = len(src_lengths)
    chosen = rng.permutation(count)[: int(round(settings.rate * count))]
    groups: list[np.ndarray] = []
    start = 0
    while start < len(chosen):
        size = int(rng.integers(2, settings.max_pairs + 1))
        end, source, target = start, 0, 0
        while end < len(chosen) and end - start < size:
            position = chosen[end]
            if end > start and (
                source + src_lengths[position] > settings.max_source_tokens
                or target + tgt_lengths[position] > settings.max_target_tokens
            ):
                break
            source += src_lengths[position]
            target += tgt_lengths[position]
            end += 1
        if end - start >= 2:
            groups.append(chosen[start:end])
        start = max(end, start + 1)
    return groups


class EpochPairs:
    """One epoch's training examples: the pairs left alone (positions into the base pairs), then
    the joined pairs (in-memory TokenizedPairs of their own). Indexing, lengths and token counts
    work as on TokenizedPairs, so batching and the trainer treat both alike."""

    def __init__(self, base: TokenizedPairs, singles: np.ndarray, joined: TokenizedPairs):
        self.base, self.singles, self.joined = base, singles, joined
        self.src_lengths = np.concatenate([base.src_lengths[singles], joined.src_lengths])
        self.tgt_lengths = np.concatenate([base.tgt_lengths[singles], joined.tgt_lengths])

    def __len__(self) -> int:
        return len(self.singles) + len(self.joined)

    def __getitem__(self, i: int) -> Example:
        found = self.base[int(self.singles[i])] if i < len(self.singles) else self.joined[i - len(self.singles)]
        return Example(i, found.src, found.tgt)

    @property
    def joined_count(self) -> int:
        return len(self.joined)

    def token_count(self, positions: np.ndarray) -> int:
        positions = np.asarray(positions, dtype=np.int64)
        return int(self.src_lengths[positions].sum() + self.tgt_lengths[positions].sum())


def join_epoch(
    base: TokenizedPairs, tokenizers: Tokenizers, settings: JoinSettings, seed: int, epoch: int
) -> EpochPairs:
    """The examples of `epoch`: `base` with a `rate` share of its pairs joined, drawn from (seed, epoch)."""
    rng = np.random.default_rng([seed, epoch, _JOIN_STREAM])
    groups: list[np.ndarray] = []
    for positions, lane in _lanes(base, tokenizers, settings):
        planned = plan_groups(base.src_lengths[positions], base.tgt_lengths[positions], lane, rng)
        groups += [positions[group] for group in planned]
    alone = np.ones(len(base), dtype=bool)
    rows: dict[str, list[np.ndarray]] = {"src": [], "tgt": []}
    for start in range(0, len(groups), _CHUNK):  # a chunk's texts at a time, never the epoch's
        chunk = groups[start : start + _CHUNK]
        src_rows, tgt_rows = _joined_rows(base, tokenizers, settings, chunk)
        # Tokenized again, a joined pair can come out a token longer than its parts; one over the
        # limits is not made, and its pairs stay alone.
        fits = within_length_limits(
            [len(row) for row in src_rows],
            [len(row) for row in tgt_rows],
            settings.max_source_tokens,
            settings.max_target_tokens,
            float("inf"),
        )
        for group, src_row, tgt_row, made in zip(chunk, src_rows, tgt_rows, fits.tolist()):
            if made:
                alone[group] = False
                rows["src"].append(np.asarray(src_row, dtype=np.int32))
                rows["tgt"].append(np.asarray(tgt_row, dtype=np.int32))
    return EpochPairs(base, np.flatnonzero(alone), TokenizedPairs.from_rows(rows["src"], rows["tgt"]))


def _lanes(base, tokenizers: Tokenizers, settings: JoinSettings) -> list[tuple[np.ndarray, JoinSettings]]:
    """The positions of the pairs that may be joined together, with the settings that join them:
    all pairs, or, for a multi-target model, the pairs of each target language (read from the
    target tag each source begins with)."""
    if not tokenizers.multi_target or not settings.by_target:
        return [(np.arange(len(base), dtype=np.int64), settings)]
    at = len(tokenizers.prefix_ids)  # the target tag follows the source prefix
    tag_ids = np.array([row[at] if len(row) > at else -1 for row in (base[i].src for i in range(len(base)))])
    lanes = []
    for language, (source_separator, target_separator) in settings.by_target.items():
        tag = tokenizers.source.piece_to_id(tokenizers.target_tags[language])
        separators = replace(settings, source_separator=source_separator, target_separator=target_separator)
        lanes.append((np.flatnonzero(tag_ids == tag), separators))
    return lanes


def _separators(tokenizers: Tokenizers, settings: JoinSettings, text: str) -> tuple[str, str]:
    """How a joined pair beginning with the source `text` joins its sources and its targets."""
    if tokenizers.multi_target and settings.by_target:
        target_tag = tokenizers.split_leading_tags(text)[0].split(" ")[0]
        for language, tag in tokenizers.target_tags.items():
            if tag == target_tag and language in settings.by_target:
                return settings.by_target[language]
    return settings.source_separator, settings.target_separator


def _joined_rows(
    base: TokenizedPairs, tokenizers: Tokenizers, settings: JoinSettings, groups: list[np.ndarray]
) -> tuple[list[list[int]], list[list[int]]]:
    """The token ids of each group's pairs joined as text and tokenized again."""
    members = np.concatenate(groups)
    # A joined source carries its first pair's tags (target language, data.corpora's), once, and
    # the source prefix once.
    src_texts = tokenizers.decode_sources([base[int(p)].src for p in members])
    tgt_texts = tokenizers.target.decode([base[int(p)].tgt for p in members])
    sources, targets, start = [], [], 0
    for group in groups:
        end = start + len(group)
        source_separator, target_separator = _separators(tokenizers, settings, src_texts[start])
        parts = [src_texts[start], *(tokenizers.split_leading_tags(text)[1] for text in src_texts[start + 1 : end])]
        sources.append(source_separator.join(parts))
        targets.append(target_separator.join(tgt_texts[start:end]))
        start = end
    return tokenizers.encode_sources(sources), tokenizers.target.encode(targets)
