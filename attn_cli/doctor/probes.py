"""The sentences the model checks run on: real ones from the run's test split, so that attention
looks as it does in use, or a few built-in pairs when the run has no test split. A module of its own
because both the model checks and the attention checks run on a `Probe`, and model_checks.py runs
the attention checks: merged into either, it would make the two import each other."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Optional

import torch

from attn_cli.data.batching import Example
from attn_cli.data.collate import collate
from attn_cli.data.corpus import Pair
from attn_cli.data.tokenizer import Tokenizers
from attn_cli.vocab import PAD_ID

SENTENCES = 8
MIN_TOKENS = 4  # the position checks reorder tokens, the causal check changes a later half
MAX_TOKENS = 48  # longer says nothing more, and costs time

BUILT_IN: list[Pair] = [
    ("Where is the train station?", "火车站在哪里？"),
    ("I don't know what to do.", "我不知道该怎么办。"),
    ("It's going to rain tomorrow.", "明天会下雨。"),
    ("Can you help me carry these boxes upstairs?", "你能帮我把这些箱子搬到楼上吗？"),
    ("How much does this old bicycle cost?", "这辆旧自行车多少钱？"),
    ("She reads a book every evening before she goes to sleep.", "她每天晚上睡觉前都读一本书。"),
    ("The children played in the park until it got dark.", "孩子们在公园里玩到天黑。"),
    ("We should leave early, because the roads will be busy.", "我们应该早点出发，因为路上会很堵。"),
]


@dataclass
class Probe:
    src: torch.Tensor  # (B, S) ids + EOS, right-padded
    tgt_in: torch.Tensor  # (B, T) BOS + ids, right-padded
    origin: str  # where the sentences come from, for the report

    @property
    def source_lengths(self) -> list[int]:
        return (self.src != PAD_ID).sum(dim=1).tolist()

    @property
    def target_lengths(self) -> list[int]:
        return (self.tgt_in != PAD_ID).sum(dim=1).tolist()


def read_test_pairs(source_file: Path, target_file: Path, limit: int = 200) -> Optional[list[Pair]]:
    """The first `limit` pairs of a run's test split, or None when it has none."""
    if not (source_file.is_file() and target_file.is_file()):
        return None
    with source_file.open(encoding="utf-8") as sources, target_file.open(encoding="utf-8") as targets:
        pairs = [(s.strip(), t.strip()) for _, s, t in zip(range(limit), sources, targets)]
    return pairs or None


def probe_batch(tokenizers: Tokenizers, test_pairs: Optional[list[Pair]], longest: Optional[int], origin: str) -> Probe:
    """SENTENCES pairs of at least MIN_TOKENS tokens a side, cut to `longest` tokens (learned
    positions end there; None: MAX_TOKENS), from `test_pairs`, else from BUILT_IN."""
    limit = min(MAX_TOKENS, longest) if longest is not None else MAX_TOKENS
    chosen = _encoded(tokenizers, test_pairs or [], limit)[:SENTENCES]
    if len(chosen) < SENTENCES:
        origin = f"{origin} and built-in sentences" if chosen else "built-in sentences"
        chosen += _encoded(tokenizers, BUILT_IN, limit)
    batch = collate(chosen[:SENTENCES])
    return Probe(batch.src, batch.tgt_in, origin)


def _encoded(tokenizers: Tokenizers, pairs: list[Pair], limit: int) -> list[Example]:
    if not pairs:
        return []
    first_target = next(iter(tokenizers.target_tags), None)  # a model of several: its first direction
    sources = tokenizers.encode_sources([pair[0] for pair in pairs], first_target)
    targets = tokenizers.target.encode([pair[1] for pair in pairs])
    return [
        Example(index, source[:limit], target[:limit])
        for index, (source, target) in enumerate(zip(sources, targets))
        if len(source) >= MIN_TOKENS and len(target) >= MIN_TOKENS
    ]
