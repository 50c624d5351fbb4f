"""The four ways a position enters the model.

Absolute (added to the token embeddings):
- `SinusoidalPositions`: fixed sin/cos waves (Vaswani et al.), for any length;
- `LearnedPositions`: one trained vector per position, up to `max_positions`.

Relative (inside self-attention, where only the distance between two tokens matters):
- `RelativePositionBias`: T5's learned scalar per head and bucket of relative distance, added to
  the attention scores before the softmax (exact buckets for short distances, logarithmic ones up
  to `max_distance`, beyond which all distances share the last bucket);
- `RotaryPositions`: RoFormer's rotation of each pair of query and key features by an angle that
  grows with the position, so that a query-key product depends on their distance only.

A relative scheme is given the absolute position of the first query (`start`): a decoding step
with a KV cache computes the bias or rotation of its own position against every cached key.
"""

from __future__ import annotations

import math

import torch
from torch import nn


class SinusoidalPositions(nn.Module):
    """Fixed sin/cos encodings; computed for any length, so decoding is never cut short.

    Feature pair k is sin and cos of position x 10000^(-2k/d_model). `layout` orders the features:
    "interleaved" puts each pair side by side (sin, cos, sin, cos, ..., the paper's formula), "halves"
    puts every sine first and every cosine after them (Marian's order, and so the OPUS-MT models')."""

    def __init__(self, d_model: int, max_positions: int, layout: str = "interleaved"):
        super().__init__()
        if layout not in ("interleaved", "halves"):
            raise ValueError(f"layout={layout!r} is not interleaved or halves")
        self.d_model, self.layout = d_model, layout
        self.register_buffer("table", self._table(max_positions), persistent=False)

    def _table(self, length: int) -> torch.Tensor:
        position = torch.arange(length, dtype=torch.float32)[:, None]
        frequency = torch.exp(
            torch.arange(0, self.d_model, 2, dtype=torch.float32) * (-math.log(10000.0) / self.d_model)
        )
        sines, cosines = torch.sin(position * frequency), torch.cos(position * frequency[: self.d_model // 2])
        if self.layout == "halves":  # (length, ceil(d/2) + floor(d/2))
            return torch.cat([sines, cosines], dim=1)
        table = torch.zeros(length, self.d_model)
        table[:, 0::2], table[:, 1::2] = sines, cosines
        return table

    def forward(self, start: int, length: int) -> torch.Tensor:
        if start + length > self.table.shape[0]:
            self.table = self._table(2 * (start + length)).to(self.table.device)
        return self.table[start : start + length]


class LearnedPositions(nn.Module):
    def __init__(self, d_model: int, max_positions: int):
        super().__init__()
        self.max_positions = max_positions
        self.embedding = nn.Embedding(max_positions, d_model)
        nn.init.normal_(self.embedding.weight, std=d_model**-0.5)

    def forward(self, start: int, length: int) -> torch.Tensor:
        if start + length > self.max_positions:
            raise ValueError(f"position {start + length} is beyond model.max_positions={self.max_positions}")
        return self.embedding.weight[start : start + length]


def relative_buckets(relative: torch.Tensor, bidirectional: bool, num_buckets: int, max_distance: int) -> torch.Tensor:
    """The bucket of each relative position (key position - query position), as T5 numbers them.

    Bidirectional (the encoder): half the buckets for keys before the query (or at it), half for
    keys after it. Causal (decoder self-attention): only keys at or before the query; a later key
    (masked anyway) falls in bucket 0. Within a direction, distances below half its buckets each have
    their own; longer ones share logarithmically wider buckets up to `max_distance`, and all beyond
    it the last one.
    """
    offset = torch.zeros_like(relative)
    if bidirectional:
        num_buckets //= 2
        offset = (relative > 0).long() * num_buckets
        distance = relative.abs()
    else:
        distance = (-relative).clamp(min=0)
    exact = num_buckets // 2
    # log(distance / exact) / log(max_distance / exact) runs from 0 at `exact` to 1 at `max_distance`.
    spread = torch.log(distance.clamp(min=exact).float() / exact) / math.log(max_distance / exact)
    logarithmic = (exact + (spread * (num_buckets - exact)).long()).clamp(max=num_buckets - 1)
    return offset + torch.where(distance < exact, distance, logarithmic)


class RelativePositionBias(nn.Module):
    """T5's relative attention bias: a learned scalar per head for each bucket of relative distance."""

    def __init__(
        self, num_heads: int, bidirectional: bool, d_model: int, num_buckets: int = 32, max_distance: int = 128
    ):
        super().__init__()
        self.bidirectional, self.num_buckets, self.max_distance = bidirectional, num_buckets, max_distance
        self.embedding = nn.Embedding(num_buckets, num_heads)
        nn.init.normal_(self.embedding.weight, std=d_model**-0.5)

    def forward(self, start: int, query_length: int, key_length: int) -> torch.Tensor:
        """(1, heads, T, S) bias of queries at start .. start+T-1 against keys at 0 .. S-1."""
        device = self.embedding.weight.device
        query = torch.arange(start, start + query_length, device=device)[:, None]
        key = torch.arange(key_length, device=device)[None, :]
        buckets = relative_buckets(key - query, self.bidirectional, self.num_buckets, self.max_distance)
        # (T, S, heads) -> (1, heads, T, S)
        return self.embedding(buckets).permute(2, 0, 1)[None]


class RotaryPositions(nn.Module):
    """Rotary position embedding: feature pairs (i, i + d_head/2) of each head's queries and keys
    turn by position * base^(-2i/d_head), so q·k depends on the distance between their positions."""

    def __init__(self, head_dim: int, base: float = 10000.0):
        super().__init__()
        if head_dim % 2:
            raise ValueError(f"rotary positions need an even d_head, not {head_dim}")
        frequency = base ** (-torch.arange(0, head_dim, 2, dtype=torch.float32) / head_dim)
        self.register_buffer("frequency", frequency, persistent=False)

    def rotate(self, x: torch.Tensor, start: int) -> torch.Tensor:
        """`x` (B, T, ..., d_head), position start + t on dim 1, rotated; same shape and dtype."""
        length = x.shape[1]
        angles = torch.arange(start, start + length, device=x.device, dtype=torch.float32)[:, None] * self.frequency
        # (T, d_head/2) -> (T, 1, ..., d_head/2): broadcast over the dims between positions and features
        angles = angles.view(length, *[1] * (x.dim() - 3), -1)
        cos, sin = angles.cos(), angles.sin()
        first, second = x.float().chunk(2, dim=-1)
        return torch.cat([first * cos - second * sin, first * sin + second * cos], dim=-1).to(x.dtype)

    def rotate_queries_and_keys(self, qkv: torch.Tensor, num_heads: int, start: int) -> torch.Tensor:
        """The fused (B, T, 3D) projection with its queries and keys rotated, values as they are."""
        batch, length, width = qkv.shape
        # (B, T, 3D) -> (B, T, 3, heads, d_head): queries, keys, values
        parts = qkv.view(batch, length, 3, num_heads, width // (3 * num_heads))
        rotated = torch.cat([self.rotate(parts[:, :, :2], start), parts[:, :, 2:]], dim=2)
        return rotated.view(batch, length, width)
