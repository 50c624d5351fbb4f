"""Beam search written for clarity, not speed: one sentence at a time, no cache, plain lists.

The batched search in `attn_cli.decoding.beam` must return exactly what this returns. Both follow the same
rules: rank every extension of every hypothesis by summed log-probability; among the k best,
those ending in EOS are finished; the beam goes on with the k best that do not end; a sentence is
done when no live hypothesis can beat its k-th best finished one.
"""

from __future__ import annotations

import torch

from attn_cli.decoding.ensemble import Ensemble
from attn_cli.decoding.hypothesis import Hypothesis, length_penalty, output_limits
from attn_cli.vocab import BOS_ID, EOS_ID


@torch.no_grad()
def reference_beam_search(
    model,
    src_row: torch.Tensor,
    beam_size: int,
    alpha: float,
    max_len_a: float,
    max_len_b: int,
    n_best: int,
    prefix: tuple[int, ...] = (),
) -> list[Hypothesis]:
    """The n best hypotheses for one source sentence (S,), without padding, from one model or an
    `Ensemble`. A forced `prefix` starts the one first hypothesis, with log-probability 0; steps and
    length penalties count what follows it."""
    model = Ensemble.of(model)
    src = src_row[None]
    encoded = model.encode(src)
    limit = int(output_limits(model.max_target_tokens, src, max_len_a, max_len_b, len(prefix))[0])
    beam = [(list(prefix), 0.0)]  # (tokens so far, summed log-probability)
    finished: list[Hypothesis] = []
    for step in range(limit + 1):
        candidates = []
        for tokens, log_prob in beam:
            history = torch.tensor([[BOS_ID] + tokens])
            # the whole history, every step, without a cache
            next_log_probs = model.next_log_probs(history, encoded, None, torch.tensor([step >= limit]), exact=False)[0]
            totals = torch.tensor(log_prob, dtype=torch.float32) + next_log_probs  # float32, as batched
            for token, total in enumerate(totals.tolist()):
                if total != float("-inf"):
                    candidates.append((total, tokens, token))
        candidates.sort(key=lambda c: c[0], reverse=True)
        for total, tokens, token in candidates[:beam_size]:
            if token == EOS_ID:
                finished.append(Hypothesis(tokens, total, total / length_penalty(step + 1, alpha)))
        finished = sorted(finished, key=lambda h: h.score, reverse=True)[:beam_size]
        beam = [(tokens + [token], total) for total, tokens, token in candidates if token != EOS_ID][:beam_size]
        if not beam:
            break
        best = max(log_prob for _, log_prob in beam)
        best_possible = max(best / length_penalty(step + 2, alpha), best / length_penalty(limit + 1, alpha))
        if len(finished) == beam_size and finished[-1].score >= best_possible:
            break
    return finished[:n_best]
