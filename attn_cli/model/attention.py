"""Multi-head scaled dot-product attention, one module for all three uses.

The same `MultiHeadAttention` serves encoder self-attention, decoder causal self-attention and
decoder cross-attention. Masks follow one convention everywhere: boolean, True = may attend
(the polarity of `torch.nn.functional.scaled_dot_product_attention`), broadcastable to
(batch, heads, queries, keys), and applied before the softmax. A relative position bias joins it as
an additive float mask (-inf where the boolean mask hides a key), which both paths take alike.
"""

from __future__ import annotations

import math
from typing import Optional

import torch
import torch.nn.functional as F
from torch import nn

from attn_cli.model.cache import LayerCache
from attn_cli.model.positions import RotaryPositions


def key_padding_mask(ids: torch.Tensor, pad_id: int) -> torch.Tensor:
    """(B, S) token ids -> (B, 1, 1, S) mask that hides padding keys from every query."""
    return (ids != pad_id)[:, None, None, :]


def causal_mask(length: int, device: torch.device) -> torch.Tensor:
    """(1, 1, T, T) mask: query i may attend to keys 0..i."""
    return torch.ones(length, length, dtype=torch.bool, device=device).tril()[None, None]


def _fused_kernel_is_slow(q: torch.Tensor) -> bool:
    """PyTorch's fused CPU kernel runs bf16 forward and backward several times slower than the plain
    formula at translation lengths, so bf16 on the CPU takes the explicit path. Both paths compute
    the same function."""
    return q.dtype == torch.bfloat16 and q.device.type == "cpu"


class MultiHeadAttention(nn.Module):
    """Self-attention projects queries, keys and values with one fused matrix product; cross-attention
    (`cross=True`) projects queries from the decoder and keys and values, fused, from the encoder
    output. Fewer, larger products: one token at a time, decoding is bound by the cost of each call."""

    def __init__(self, d_model: int, num_heads: int, dropout: float = 0.0, cross: bool = False):
        super().__init__()
        if d_model % num_heads:
            raise ValueError(f"num_heads={num_heads} must divide d_model={d_model}")
        self.num_heads = num_heads
        self.head_dim = d_model // num_heads
        self.dropout = dropout
        self.cross = cross
        if cross:
            self.q_proj = nn.Linear(d_model, d_model)
            self.kv_proj = nn.Linear(d_model, 2 * d_model)
        else:
            self.qkv_proj = nn.Linear(d_model, 3 * d_model)
        self.out_proj = nn.Linear(d_model, d_model)

    def _split_heads(self, x: torch.Tensor, parts: int) -> tuple[torch.Tensor, ...]:
        batch, length, _ = x.shape
        # (B, T, parts*D) -> parts x (B, heads, T, d_head)
        return x.view(batch, length, parts, self.num_heads, self.head_dim).permute(2, 0, 3, 1, 4).unbind(0)

    def keys_values(self, memory: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Cross-attention keys and values of (B, S, D) encoder output, each (B, heads, S, d_head)."""
        return self._split_heads(self.kv_proj(memory), 2)

    def forward(
        self,
        query: torch.Tensor,
        memory: Optional[torch.Tensor] = None,
        mask: Optional[torch.Tensor] = None,
        cache: Optional[LayerCache] = None,
        need_weights: bool = False,
        bias: Optional[torch.Tensor] = None,
        rotary: Optional[RotaryPositions] = None,
        start: int = 0,
    ) -> tuple[torch.Tensor, Optional[torch.Tensor]]:
        """Attend from `query` (B, T, D) to `memory` (cross-attention) or to itself (self-attention).

        With a cache, self-attention appends this step's keys and values to the cached ones, and
        cross-attention projects `memory` once per source and reuses it at every later step.
        With a cache made for g hypotheses per source (a beam's), cross-attention takes B*g query rows
        for B sources: rows b*g .. b*g+g-1 belong to source b, whose keys and values are projected
        once and shared by its g hypotheses.
        Self-attention may take relative positions: `bias` (1, heads, T, S) added to the scores, or
        `rotary` to turn its queries and keys, the first query being at position `start`.
        Returns the output (B, T, D) and, when `need_weights`, the weights (B, heads, T, S).
        """
        if (memory is not None) != self.cross:
            raise ValueError("cross-attention needs `memory` and self-attention takes none")
        if self.cross and (bias is not None or rotary is not None):
            raise ValueError("relative positions act in self-attention only")
        q, k, v = self._project(query, memory, cache, rotary, start)
        if bias is not None:
            bias = bias.to(q.dtype)
            mask = bias if mask is None else bias.masked_fill(~mask, float("-inf"))
        batch, _, length, _ = q.shape
        hypotheses = cache.hypotheses if self.cross and cache is not None else 1  # queries per source
        if batch != k.shape[0] * hypotheses:
            raise ValueError(
                f"{batch} query rows against {k.shape[0]} rows of keys: {hypotheses} per source is what the "
                f"cache was made for (model.new_cache(hypotheses=...))"
            )
        if hypotheses > 1:
            q = self._group_hypotheses(q, hypotheses)

        dropout = self.dropout if self.training else 0.0
        if need_weights or _fused_kernel_is_slow(q):
            out, weights = self._attend_explicitly(q, k, v, mask, dropout)
        else:
            out, weights = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, dropout_p=dropout), None
        if hypotheses > 1:
            out = self._ungroup_hypotheses(out, hypotheses)
            weights = self._ungroup_hypotheses(weights, hypotheses) if weights is not None else None
        # (B, heads, T, d_head) -> (B, T, D)
        out = out.transpose(1, 2).reshape(batch, length, self.num_heads * self.head_dim)
        return self.out_proj(out), weights

    def _project(
        self,
        query: torch.Tensor,
        memory: Optional[torch.Tensor],
        cache: Optional[LayerCache],
        rotary: Optional[RotaryPositions],
        start: int,
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Queries, keys and values, each (rows, heads, length, d_head). Rotary positions turn the
        keys before they are cached, so each cached key keeps the rotation of its own position."""
        if self.cross:
            (q,) = self._split_heads(self.q_proj(query), 1)
            if cache is None:
                return (q, *self.keys_values(memory))
            return (q, *cache.cross_keys_values(lambda: self.keys_values(memory)))
        qkv = self.qkv_proj(query)  # (B, T, 3D): queries, then keys and values
        if rotary is not None:
            qkv = rotary.rotate_queries_and_keys(qkv, self.num_heads, start)
        if cache is None:
            return self._split_heads(qkv, 3)
        d_model = self.num_heads * self.head_dim
        (q,) = self._split_heads(qkv[..., :d_model], 1)
        return (q, *self._split_heads(cache.append_self(qkv[..., d_model:]), 2))

    def _group_hypotheses(self, q: torch.Tensor, hypotheses: int) -> torch.Tensor:
        """Beam search decodes g hypotheses per source against keys and values projected once per
        source: put a source's g hypotheses side by side on the query axis instead of copying its
        keys and values g times. (B*g, heads, T, d_head) -> (B, heads, g*T, d_head)."""
        rows, heads, length, head_dim = q.shape
        q = q.reshape(rows // hypotheses, hypotheses, heads, length, head_dim).transpose(1, 2)
        return q.reshape(rows // hypotheses, heads, hypotheses * length, head_dim)

    def _ungroup_hypotheses(self, x: torch.Tensor, hypotheses: int) -> torch.Tensor:
        """(B, heads, g*T, X) -> (B*g, heads, T, X): each hypothesis back on its own row."""
        sources, heads, queries, last = x.shape
        x = x.view(sources, heads, hypotheses, queries // hypotheses, last).transpose(1, 2)
        return x.reshape(sources * hypotheses, heads, queries // hypotheses, last)

    def _attend_explicitly(self, q, k, v, mask, dropout):
        """The textbook formula, for inspection: softmax(q k^T / sqrt(d_head) + mask) v."""
        scores = q @ k.transpose(-2, -1) / math.sqrt(self.head_dim)  # (B, heads, T, S)
        if mask is not None and mask.dtype == torch.bool:
            scores = scores.masked_fill(~mask, float("-inf"))
        elif mask is not None:  # a float mask: the relative bias, -inf where a key is hidden
            scores = scores + mask
        weights = scores.softmax(dim=-1)
        return F.dropout(weights, dropout, self.training) @ v, weights
