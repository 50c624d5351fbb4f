"""What every search shares: the `Hypothesis` record, the GNMT length penalty, output length
limits and the next-token distribution."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

import torch

from attn_cli.model import Transformer
from attn_cli.vocab import BOS_ID, EOS_ID, PAD_ID

# Tokens the decoder must never emit: padding and a second start-of-sentence.
_NEVER_EMITTED = [PAD_ID, BOS_ID]


@dataclass
class Hypothesis:
    tokens: list[int]  # output ids, without BOS and EOS
    log_prob: float  # summed log-probability of the tokens and the EOS that ended them
    score: float  # what ranks hypotheses: log_prob / length_penalty(len(tokens) + 1, alpha)


def length_penalty(length: int | torch.Tensor, alpha: float):
    """GNMT's ((5 + |Y|) / 6) ** alpha (Wu et al., 2016); |Y| counts the EOS. alpha = 0 turns it off."""
    return ((5 + length) / 6) ** alpha


def output_limits(model: Transformer, src: torch.Tensor, max_len_a: float, max_len_b: int) -> torch.Tensor:
    """Per-sentence output limit a * source_length + b, counted without BOS and EOS, capped where
    learned target positions end (one position is kept for the EOS)."""
    source_lengths = (src != PAD_ID).sum(dim=1) - 1  # the source ends in EOS
    limits = (max_len_a * source_lengths.float()).long() + max_len_b
    if model.max_target_positions is not None:
        limits = limits.clamp(max=model.max_target_positions - 1)
    return limits


def next_token_log_probs(logits: torch.Tensor, at_limit: Optional[torch.Tensor], exact: bool,
                         normalize: bool = True) -> torch.Tensor:
    """(rows, V) logits -> log-probabilities of what may come next.

    Padding and BOS are never emitted. A row whose `at_limit` is True may only end (EOS keeps its
    own probability, so scores stay true log-probabilities); None means no row is at its limit.
    `exact` forbids ending at all. `normalize=False` leaves the log-softmax out: the same ranking,
    for a caller that needs only the most likely token and no score.
    """
    logits = logits.float()
    logits[:, _NEVER_EMITTED] = float("-inf")
    log_probs = logits.log_softmax(dim=-1) if normalize else logits
    if exact:
        log_probs[:, EOS_ID] = float("-inf")
    elif at_limit is not None and at_limit.any():
        eos = log_probs[at_limit, EOS_ID]
        log_probs[at_limit] = float("-inf")
        log_probs[at_limit, EOS_ID] = eos
    return log_probs


def rows_at_limit(step: int, limits: torch.Tensor, shortest_limit: int) -> Optional[torch.Tensor]:
    """(rows,) whether each row has reached its limit at this step; None while none can have."""
    return step >= limits if step >= shortest_limit else None
