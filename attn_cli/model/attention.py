"""Multi-head scaled dot-product attention, one module for all three uses.

The same `MultiHeadAttention` serves encoder self-attention, decoder causal self-attention and
decoder cross-attention. Masks follow one convention everywhere: boolean, True = may attend
(the polarity of `torch.nn.functional.scaled_dot_product_attention`), broadcastable to
(batch, heads, queries, keys), and applied before the softmax.
"""

from __future__ import annotations

import math
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Iterator, Optional

import torch
import torch.nn.functional as F
from torch import nn

from attn_cli.model.cache import LayerCache
from attn_cli.model.linear import Linear


def key_padding_mask(ids: torch.Tensor, pad_id: int) -> torch.Tensor:
    """(B, S) token ids -> (B, 1, 1, S) mask that hides padding keys from every query."""
    return (ids != pad_id)[:, None, None, :]


def causal_mask(length: int, device: torch.device) -> torch.Tensor:
    """(1, 1, T, T) mask: query i may attend to keys 0..i."""
    return torch.ones(length, length, dtype=torch.bool, device=device).tril()[None, None]


def _fused_kernel_is_slow(q: torch.Tensor) -> bool:
    """PyTorch's fused CPU kernel runs bf16 forward+backward about 4x slower than the plain formula
    at translation lengths (measured with 160 x 4 heads x 24 x 64 on 2 cores), so bf16 on the CPU
    takes the explicit path. Both paths compute the same function."""
    return q.dtype == torch.bfloat16 and q.device.type == "cpu"  # the dtype first: .device builds an object


_folding_switched_off = False


@contextmanager
def without_folded_cross_attention() -> Iterator[None]:
    """Decoding inside never folds cross-attention (`bench_decode.py --folding-ablation`)."""
    global _folding_switched_off
    before, _folding_switched_off = _folding_switched_off, True
    try:
        yield
    finally:
        _folding_switched_off = before


@dataclass
class FoldedCrossAttention:
    """One decoder layer's cross-attention for a search, its query and output projections folded
    into the cached keys and values of each source sentence (see `MultiHeadAttention.fold`)."""

    scores_weight: torch.Tensor  # (B, D, heads*S): x @ this + scores_bias = each head's scaled scores
    scores_bias: torch.Tensor  # (B, 1, heads*S), -inf at padded source positions
    values_out: torch.Tensor  # (B, heads*S, D): weights @ this + the output bias = the output
    heads: int

    def select(self, rows: torch.Tensor) -> "FoldedCrossAttention":
        return FoldedCrossAttention(self.scores_weight.index_select(0, rows), self.scores_bias.index_select(0, rows),
                                    self.values_out.index_select(0, rows), self.heads)


class MultiHeadAttention(nn.Module):
    """Self-attention projects queries, keys and values with one fused matrix product; cross-attention
    (`cross=True`) projects queries from the decoder and keys and values, fused, from the encoder
    output. Fewer, larger products: one token at a time, decoding is bound by the cost of each call."""

    def __init__(self, d_model: int, num_heads: int, dropout: float = 0.0, cross: bool = False):
        super().__init__()
        assert d_model % num_heads == 0, "num_heads must divide d_model"
        self.num_heads = num_heads
        self.head_dim = d_model // num_heads
        self.dropout = dropout
        self.cross = cross
        if cross:
            self.q_proj = Linear(d_model, d_model)
            self.kv_proj = Linear(d_model, 2 * d_model)
        else:
            self.qkv_proj = Linear(d_model, 3 * d_model)
        self.out_proj = Linear(d_model, d_model)

    def _split(self, x: torch.Tensor, parts: int) -> tuple[torch.Tensor, ...]:
        batch, length, _ = x.shape
        # (B, T, parts*D) -> parts x (B, heads, T, d_head)
        return x.view(batch, length, parts, self.num_heads, self.head_dim).permute(2, 0, 3, 1, 4).unbind(0)

    def keys_values(self, memory: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Cross-attention keys and values of (B, S, D) encoder output, each (B, heads, S, d_head)."""
        return self._split(self.kv_proj(memory), 2)

    def forward(
        self,
        query: torch.Tensor,
        memory: Optional[torch.Tensor] = None,
        mask: Optional[torch.Tensor] = None,
        cache: Optional[LayerCache] = None,
        need_weights: bool = False,
    ) -> tuple[torch.Tensor, Optional[torch.Tensor]]:
        """Attend from `query` (B, T, D) to `memory` (cross-attention) or to itself (self-attention).

        With a cache, self-attention appends this step's keys and values to the cached ones, and
        cross-attention projects `memory` once per source and reuses it at every later step.
        `memory` may hold fewer rows than `query`: B sources for B*g queries, where rows
        b*g .. b*g+g-1 belong to source b (the hypotheses of a beam).
        Returns the output (B, T, D) and, when `need_weights`, the weights (B, heads, T, S).
        """
        if (memory is not None) != self.cross:
            raise ValueError("cross-attention needs `memory` and self-attention takes none")
        if self.cross:
            if cache is not None and not need_weights and not self.training and self.folding_pays(*memory.shape[:2]):
                def fold() -> FoldedCrossAttention:
                    return self.fold(*cache.cross_keys_values(lambda: self.keys_values(memory)), mask)

                return self._attend_folded(query, cache.cross_folded(fold)), None
            (q,) = self._split(self.q_proj.project(query), 1)
            if cache is not None:
                k, v = cache.cross_keys_values(lambda: self.keys_values(memory))
            else:
                k, v = self.keys_values(memory)
        elif cache is not None:
            qkv = self.qkv_proj.project(query)  # (B, T, 3D): queries, keys, values
            d_model = self.num_heads * self.head_dim
            (q,) = self._split(qkv[..., :d_model], 1)
            k, v = self._split(cache.append_self(qkv[..., d_model:]), 2)
        else:
            q, k, v = self._split(self.qkv_proj.project(query), 3)

        batch, _, length, _ = q.shape
        # Beam search decodes g = batch / sources hypotheses per source sentence against keys and
        # values projected once per source: fold the g copies into the query axis instead of
        # copying the keys g times.
        copies = batch // k.shape[0]
        if copies > 1:
            # (B*g, heads, T, d_head) -> (B, heads, g*T, d_head)
            q = q.reshape(k.shape[0], copies, self.num_heads, length, self.head_dim).transpose(1, 2)
            q = q.reshape(k.shape[0], self.num_heads, copies * length, self.head_dim)

        dropout = self.dropout if self.training else 0.0
        if need_weights or _fused_kernel_is_slow(q):
            out, weights = self._attend_explicitly(q, k, v, mask, dropout)
        else:
            out, weights = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, dropout_p=dropout), None
        if copies > 1:
            out, weights = self._unfold_copies(out, copies), self._unfold_copies(weights, copies)
        # (B, heads, T, d_head) -> (B, T, D)
        out = out.transpose(1, 2).reshape(batch, length, self.num_heads * self.head_dim)
        # Direct calls rather than module calls: a decoding step is short enough for dispatch to show.
        return self.out_proj.project(out), weights

    def folding_pays(self, sources: int, source_length: int) -> bool:
        """Whether a decoding step reads fewer numbers with the projections folded into the keys and
        values: the plain step reads the query and output weights (2 D^2) and the cached keys and
        values (2 B S D), the folded one two (B, heads*S, D) matrices. That holds for a sentence or
        two at a time (base size, 20-token sources: up to 3), where decoding is bound by reading
        weights; in a large batch the folded matrices would outweigh the weights."""
        d_model = self.num_heads * self.head_dim
        return not _folding_switched_off and sources * source_length * (self.num_heads - 1) < d_model

    def fold(self, keys: torch.Tensor, values: torch.Tensor, mask: Optional[torch.Tensor]) -> FoldedCrossAttention:
        """Fold the query and output projections into one search's cross-attention keys and values
        (B, heads, S, d_head), once per source, so that each step costs two matrix products.

        Per head h, with q_h = x Wq_h^T + bq_h (Wq_h: the head's d_head rows of Wq):
            q_h k_h^T = x (k_h Wq_h)^T + k_h bq_h,
        an (S, D) matrix and an S-vector; and the output projection of the heads' results is
            sum_h (weights_h v_h) Wo_h^T + bo = sum_h weights_h (v_h Wo_h^T) + bo,
        with Wo_h the head's d_head columns of Wo: another (S, D) matrix. The padding mask becomes
        -inf in the score bias. The same function, rounded differently."""
        sources, heads, length, head_dim = keys.shape
        d_model = heads * head_dim
        scale = 1.0 / math.sqrt(head_dim)
        q_weight = self.q_proj.weight.view(heads, head_dim, d_model)
        # (B, heads, S, d_head) @ (heads, d_head, D) -> (B, heads, S, D) -> (B, D, heads*S)
        scores_weight = (keys @ q_weight).mul_(scale).reshape(sources, heads * length, d_model).transpose(1, 2)
        # (B, heads, S, d_head) @ (heads, d_head, 1) -> (B, 1, heads*S)
        scores_bias = (keys @ self.q_proj.bias.view(heads, head_dim, 1)).mul_(scale).reshape(sources, 1, heads * length)
        if mask is not None:  # (B, 1, 1, S) -> (B, 1, heads*S)
            padded = ~mask.reshape(sources, 1, length).repeat(1, 1, heads)
            scores_bias = scores_bias.masked_fill(padded, float("-inf"))
        # Wo (D, heads*d_head) -> (heads, d_head, D); (B, heads, S, d_head) @ that -> (B, heads*S, D)
        out_weight = self.out_proj.weight.view(d_model, heads, head_dim).permute(1, 2, 0)
        values_out = (values @ out_weight).reshape(sources, heads * length, d_model)
        return FoldedCrossAttention(scores_weight, scores_bias, values_out, heads)

    def _attend_folded(self, query: torch.Tensor, folded: FoldedCrossAttention) -> torch.Tensor:
        rows, length, d_model = query.shape
        sources = folded.scores_weight.shape[0]
        # (B*g, T, D) -> (B, g*T, D): the g hypotheses of a source share its folded matrices
        x = query.reshape(sources, rows // sources * length, d_model)
        scores = torch.baddbmm(folded.scores_bias, x, folded.scores_weight)  # (B, g*T, heads*S)
        # softmax over each head's S scores: (B, g*T, heads*S) -> (B, g*T, heads, S) and back
        weights = scores.view(sources, -1, folded.heads, scores.shape[-1] // folded.heads).softmax(dim=-1)
        out = torch.baddbmm(self.out_proj.bias, weights.view(scores.shape), folded.values_out)  # (B, g*T, D)
        return out.view(rows, length, d_model)

    def _unfold_copies(self, x: Optional[torch.Tensor], copies: int) -> Optional[torch.Tensor]:
        """(B, heads, g*T, X) -> (B*g, heads, T, X): undo the folding of hypotheses into queries."""
        if x is None:
            return None
        sources, heads, queries, last = x.shape
        x = x.view(sources, heads, copies, queries // copies, last).transpose(1, 2)
        return x.reshape(sources * copies, heads, queries // copies, last)

    def _attend_explicitly(self, q, k, v, mask, dropout):
        """The textbook formula, for inspection: softmax(q k^T / sqrt(d_head) + mask) v."""
        scores = q @ k.transpose(-2, -1) / math.sqrt(self.head_dim)  # (B, heads, T, S)
        if mask is not None:
            scores = scores.masked_fill(~mask, float("-inf"))
        weights = scores.softmax(dim=-1)
        return F.dropout(weights, dropout, self.training) @ v, weights
