"""Greedy decoding on top of `Transformer.encode`/`decode`, with or without the KV cache,
and batched translation of plain strings."""

from __future__ import annotations

from typing import Callable, Sequence

import torch

from attn_cli.data import Example, collate, token_batches
from attn_cli.model import Transformer
from attn_cli.tokenizer import BOS_ID, EOS_ID, PAD_ID

# Tokens the decoder must never emit: padding and a second start-of-sentence.
_NEVER_EMITTED = [PAD_ID, BOS_ID]


def max_output_lengths(src: torch.Tensor, max_len_a: float, max_len_b: int) -> torch.Tensor:
    """Per-sentence output limit a * source_length + b, counted without BOS and EOS."""
    source_lengths = (src != PAD_ID).sum(dim=1) - 1  # the source ends in EOS
    return (max_len_a * source_lengths.float()).long() + max_len_b


@torch.inference_mode()
def greedy_decode(model: Transformer, src: torch.Tensor, max_len_a: float = 1.5, max_len_b: int = 10,
                  use_cache: bool = True, exact_steps: int | None = None) -> list[list[int]]:
    """Decode a batch (B, S) greedily; each sentence stops at its own EOS or its length limit.

    `use_cache=False` re-runs the decoder over the whole prefix at every step (the reference the
    cache is tested and benchmarked against). `exact_steps` forces that many output tokens (EOS
    suppressed), for benchmarks. Returns token ids without BOS and EOS.
    """
    encoded = model.encode(src)
    batch = src.shape[0]
    limits = max_output_lengths(src, max_len_a, max_len_b)
    if model.max_target_positions is not None:  # learned positions end; keep one for EOS
        limits = limits.clamp(max=model.max_target_positions - 1)
    steps = exact_steps if exact_steps is not None else int(limits.max()) + 1  # + 1 for the EOS
    cache = model.new_cache() if use_cache else None
    tokens = torch.full((batch, 1), BOS_ID, dtype=torch.long, device=src.device)
    finished = torch.zeros(batch, dtype=torch.bool, device=src.device)
    for step in range(steps):
        logits = model.decode(tokens[:, -1:] if use_cache else tokens, encoded, cache)[:, -1].float()
        logits[:, _NEVER_EMITTED] = float("-inf")
        if exact_steps is not None:
            logits[:, EOS_ID] = float("-inf")
        else:
            # A sentence at its limit may only end.
            at_limit = step >= limits
            logits[at_limit] = torch.where(torch.arange(logits.shape[1], device=logits.device) == EOS_ID, 0.0, float("-inf"))
        next_tokens = logits.argmax(dim=-1).masked_fill(finished, PAD_ID)
        tokens = torch.cat([tokens, next_tokens[:, None]], dim=1)
        finished |= next_tokens == EOS_ID
        if finished.all():
            break
    return [_strip(row) for row in tokens[:, 1:].tolist()]


def _strip(ids: Sequence[int]) -> list[int]:
    out = []
    for token in ids:
        if token in (EOS_ID, PAD_ID):
            break
        out.append(token)
    return out


def translate_sentences(model: Transformer, tokenizers, sentences: Sequence[str], max_len_a: float = 1.5,
                        max_len_b: int = 10, max_tokens: int = 8000,
                        on_batch: Callable[[int], None] | None = None) -> list[str]:
    """Translate strings in length-sorted token-budget batches; results come back in input order.

    An empty (or all-whitespace) sentence translates to an empty string. A source longer than the
    model's learned positions reach is truncated to fit. `on_batch(n)` is told after each batch of
    n sentences.
    """
    device = next(model.parameters()).device
    encoded = tokenizers.source.encode([s.strip() for s in sentences])
    if model.max_source_positions is not None:
        encoded = [ids[: model.max_source_positions - 1] for ids in encoded]  # one position for EOS
    examples = [Example(index, ids, []) for index, ids in enumerate(encoded) if ids]
    results = [""] * len(sentences)
    for positions in token_batches(examples, max_tokens, shuffle=False):
        batch = collate([examples[p] for p in positions]).to(device)
        outputs = greedy_decode(model, batch.src, max_len_a, max_len_b)
        for index, text in zip(batch.indices, tokenizers.target.decode(outputs)):
            results[index] = text
        if on_batch is not None:
            on_batch(len(positions))
    return results
