"""The encoder–decoder Transformer (Vaswani et al., 2017).

Narrow API: `encode(src)` once per source, `decode(tgt_in, encoded, cache)` for teacher forcing
or one incremental step, and `forward(src, tgt_in)` for training. Layers take numbers; only
`build_model` reads the config.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Optional

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.checkpoint import checkpoint

from attn_cli.model.attention import MultiHeadAttention, causal_mask, key_padding_mask
from attn_cli.model.cache import KVCache, LayerCache
from attn_cli.model.positions import LearnedPositions, RelativePositionBias, RotaryPositions, SinusoidalPositions
from attn_cli.vocab import PAD_ID

if TYPE_CHECKING:  # the config is only read by build_model, from a caller that has it
    from attn_cli.config import ModelConfig

# Attention weights by kind ("encoder", "decoder_self", "cross"), one (B, heads, T, S) per layer.
AttentionWeights = dict[str, list[torch.Tensor]]


@dataclass
class Encoded:
    memory: torch.Tensor  # (B, S, D) encoder output
    mask: torch.Tensor  # (B, 1, 1, S) True where a source token may be attended to
    # The mask for cross-attention, or None when no source is padded: attention runs faster
    # without a mask, and a length-sorted decoding batch often has no padding.
    cross_attention_mask: Optional[torch.Tensor] = field(init=False)

    def __post_init__(self) -> None:
        self.cross_attention_mask = None if bool(self.mask.all()) else self.mask

    def select(self, rows: torch.Tensor) -> "Encoded":
        return Encoded(self.memory.index_select(0, rows), self.mask.index_select(0, rows))


# model.activation: ReLU as in the paper, GELU (the exact, erf form) as in BERT, SiLU (swish) as in Marian.
ACTIVATIONS = {"relu": nn.ReLU, "gelu": nn.GELU, "silu": nn.SiLU}


class FeedForward(nn.Sequential):
    """Position-wise Linear-activation-Linear. As in the paper, dropout acts on the sublayer output
    (in `Residual`), not on the 4x wider hidden layer. The activation has no weights, so the
    parameter names are the same for every activation."""

    def __init__(self, d_model: int, ffn_dim: int, activation: str = "relu"):
        super().__init__(nn.Linear(d_model, ffn_dim), ACTIVATIONS[activation](), nn.Linear(ffn_dim, d_model))


class Residual(nn.Module):
    """The residual connection around a sublayer: x + dropout(sublayer(...)), with LayerNorm before
    the sublayer (pre-LN) or after the sum (post-LN). `sublayer_input(x)` is what the sublayer
    reads, and `add(x, out)` adds its output back."""

    def __init__(self, d_model: int, dropout: float, pre_norm: bool):
        super().__init__()
        self.norm = nn.LayerNorm(d_model)
        self.dropout = dropout
        self.pre_norm = pre_norm

    def sublayer_input(self, x: torch.Tensor) -> torch.Tensor:
        return self.norm(x) if self.pre_norm else x

    def add(self, x: torch.Tensor, out: torch.Tensor) -> torch.Tensor:
        x = x + F.dropout(out, self.dropout, self.training)
        return x if self.pre_norm else self.norm(x)


@dataclass(frozen=True)
class LayerShape:
    """The numbers every encoder and decoder layer is built from."""

    d_model: int
    num_heads: int
    ffn_dim: int
    dropout: float
    attention_dropout: float
    pre_norm: bool
    activation: str = "relu"

    def attention(self, cross: bool = False) -> MultiHeadAttention:
        return MultiHeadAttention(self.d_model, self.num_heads, self.attention_dropout, cross=cross)

    def feed_forward(self) -> FeedForward:
        return FeedForward(self.d_model, self.ffn_dim, self.activation)

    def residual(self) -> Residual:
        return Residual(self.d_model, self.dropout, self.pre_norm)


class EncoderLayer(nn.Module):
    def __init__(self, shape: LayerShape):
        super().__init__()
        self.self_attention = shape.attention()
        self.feed_forward = shape.feed_forward()
        self.attention_residual = shape.residual()
        self.feed_forward_residual = shape.residual()

    def forward(self, x, mask, need_weights=False, bias=None, rotary=None):
        out, weights = self.self_attention(
            self.attention_residual.sublayer_input(x), mask=mask, need_weights=need_weights, bias=bias, rotary=rotary
        )
        x = self.attention_residual.add(x, out)
        x = self.feed_forward_residual.add(x, self.feed_forward(self.feed_forward_residual.sublayer_input(x)))
        return x, weights


class DecoderLayer(nn.Module):
    def __init__(self, shape: LayerShape):
        super().__init__()
        self.self_attention = shape.attention()
        self.cross_attention = shape.attention(cross=True)
        self.feed_forward = shape.feed_forward()
        self.self_residual = shape.residual()
        self.cross_residual = shape.residual()
        self.feed_forward_residual = shape.residual()

    def forward(
        self,
        x,
        self_mask,
        memory,
        memory_mask,
        cache: Optional[LayerCache] = None,
        need_weights=False,
        self_bias=None,
        rotary=None,
        start=0,
    ):
        out, self_weights = self.self_attention(
            self.self_residual.sublayer_input(x),
            mask=self_mask,
            cache=cache,
            need_weights=need_weights,
            bias=self_bias,
            rotary=rotary,
            start=start,
        )
        x = self.self_residual.add(x, out)
        out, cross_weights = self.cross_attention(
            self.cross_residual.sublayer_input(x), memory, mask=memory_mask, cache=cache, need_weights=need_weights
        )
        x = self.cross_residual.add(x, out)
        x = self.feed_forward_residual.add(x, self.feed_forward(self.feed_forward_residual.sublayer_input(x)))
        return x, self_weights, cross_weights


class Transformer(nn.Module):
    def __init__(
        self,
        src_vocab_size: int,
        tgt_vocab_size: int,
        d_model: int,
        num_heads: int,
        ffn_dim: int,
        encoder_layers: int,
        decoder_layers: int,
        dropout: float = 0.1,
        attention_dropout: float = 0.0,
        positions: str = "sinusoidal",
        max_positions: int = 256,
        pre_norm: bool = True,
        share_embeddings: bool = True,
        activation: str = "relu",
        sinusoid_layout: str = "interleaved",
        output_bias: bool = False,
    ):
        super().__init__()
        if share_embeddings and src_vocab_size != tgt_vocab_size:
            raise ValueError("shared embeddings need one vocabulary for source and target")
        self.d_model = d_model
        self.embed_scale = math.sqrt(d_model)
        self.tgt_embedding = nn.Embedding(tgt_vocab_size, d_model, padding_idx=PAD_ID)
        self.src_embedding = (
            self.tgt_embedding if share_embeddings else nn.Embedding(src_vocab_size, d_model, padding_idx=PAD_ID)
        )
        for embedding in {self.src_embedding, self.tgt_embedding}:
            nn.init.normal_(embedding.weight, std=d_model**-0.5)
            nn.init.zeros_(embedding.weight[PAD_ID])
        self.positions = positions
        # Absolute positions are added to the embeddings; relative ones act inside self-attention:
        # T5's bias (one table for the encoder, bidirectional; one for the decoder, causal; none in
        # cross-attention, as in T5) or rotary queries and keys (attn_cli/model/positions.py).
        if positions not in ("sinusoidal", "learned", "relative", "rotary"):
            raise ValueError(f"positions={positions!r} is not sinusoidal, learned, relative or rotary")

        def absolute_positions() -> Optional[nn.Module]:
            if positions == "sinusoidal":
                return SinusoidalPositions(d_model, max_positions, sinusoid_layout)
            return LearnedPositions(d_model, max_positions) if positions == "learned" else None

        self.src_positions, self.tgt_positions = absolute_positions(), absolute_positions()
        relative = positions == "relative"
        self.encoder_bias = RelativePositionBias(num_heads, True, d_model) if relative else None
        self.decoder_bias = RelativePositionBias(num_heads, False, d_model) if relative else None
        self.rotary = RotaryPositions(d_model // num_heads) if positions == "rotary" else None
        self.embedding_dropout = dropout
        shape = LayerShape(d_model, num_heads, ffn_dim, dropout, attention_dropout, pre_norm, activation)
        self.encoder_layers = nn.ModuleList(EncoderLayer(shape) for _ in range(encoder_layers))
        self.decoder_layers = nn.ModuleList(DecoderLayer(shape) for _ in range(decoder_layers))
        # Pre-LN leaves the residual stream unnormalised, so each stack ends with a LayerNorm.
        self.encoder_norm = nn.LayerNorm(d_model) if pre_norm else nn.Identity()
        self.decoder_norm = nn.LayerNorm(d_model) if pre_norm else nn.Identity()
        # A bias per target token added to the logits (Marian has one); none in the paper.
        self.register_parameter("output_bias", nn.Parameter(torch.zeros(tgt_vocab_size)) if output_bias else None)
        # Recompute each layer in backward instead of keeping its activations: less memory, more
        # compute. The trainer sets it; it acts only in training mode with gradients on.
        self.gradient_checkpointing = False

    def _run_layer(self, layer: nn.Module, *args, **kwargs):
        if self.gradient_checkpointing and self.training and torch.is_grad_enabled():
            # Non-reentrant checkpointing replays the same dropout masks when it recomputes.
            return checkpoint(layer, *args, use_reentrant=False, **kwargs)
        return layer(*args, **kwargs)

    def _embed(
        self, ids: torch.Tensor, embedding: nn.Embedding, positions: Optional[nn.Module], start: int = 0
    ) -> torch.Tensor:
        x = embedding(ids) * self.embed_scale
        if positions is not None:  # absolute positions; relative ones enter in attention
            x = x + positions(start, ids.shape[1]).to(embedding.weight.dtype)
        return F.dropout(x, self.embedding_dropout, self.training)

    def encode(self, src: torch.Tensor, attention: Optional[AttentionWeights] = None) -> Encoded:
        """src (B, S) ids ending in EOS, right-padded -> the encoder output and its padding mask."""
        mask = key_padding_mask(src, PAD_ID)
        x = self._embed(src, self.src_embedding, self.src_positions)
        length = src.shape[1]
        bias = self.encoder_bias(0, length, length) if self.encoder_bias is not None else None
        for layer in self.encoder_layers:
            x, weights = self._run_layer(
                layer, x, mask, need_weights=attention is not None, bias=bias, rotary=self.rotary
            )
            if attention is not None:
                attention.setdefault("encoder", []).append(weights)
        return Encoded(self.encoder_norm(x), mask)

    def decode(
        self,
        tgt_in: torch.Tensor,
        encoded: Encoded,
        cache: Optional[KVCache] = None,
        attention: Optional[AttentionWeights] = None,
    ) -> torch.Tensor:
        """Next-token logits (B, T, V) for every position of tgt_in (B, T).

        Without a cache, tgt_in is the whole (teacher-forced) prefix under the causal mask. With a
        cache, tgt_in holds only the new positions; earlier ones come from the cache, and every
        new query may see every cached key, so no mask is needed for a single-step update.
        """
        return F.linear(self._decoder_states(tgt_in, encoded, cache, attention), self.output_weight, self.output_bias)

    def decode_hidden(self, tgt_in: torch.Tensor, encoded: Encoded) -> torch.Tensor:
        """The decoder's final hidden states (B, T, D) under teacher forcing, before the output
        projection (`output_weight`, and `output_bias` when the model has one): training projects
        them inside its loss (`attn_cli.training.loss`) rather than building the logits."""
        return self._decoder_states(tgt_in, encoded, None, None)

    def _decoder_states(
        self, tgt_in: torch.Tensor, encoded: Encoded, cache: Optional[KVCache], attention: Optional[AttentionWeights]
    ) -> torch.Tensor:
        """The decoder stack: `decode` without the output projection."""
        if cache is not None and self.gradient_checkpointing and self.training:
            # A recomputed layer would append its keys and values to the cache a second time.
            raise RuntimeError(
                "gradient checkpointing is for the training forward and the KV cache for "
                "inference; call model.eval() before decoding with a cache"
            )
        start = cache.steps if cache is not None else 0
        length = tgt_in.shape[1]
        if cache is None:
            self_mask = causal_mask(length, tgt_in.device) & key_padding_mask(tgt_in, PAD_ID)
        elif length == 1:
            self_mask = None
        else:  # several new positions at once: causal among themselves, all cached keys visible
            self_mask = torch.ones(length, start + length, dtype=torch.bool, device=tgt_in.device).tril(start)[
                None, None
            ]
        x = self._embed(tgt_in, self.tgt_embedding, self.tgt_positions, start)
        # New queries at start .. start+T-1 against every key so far, cached ones included.
        bias = self.decoder_bias(start, length, start + length) if self.decoder_bias is not None else None
        for index, layer in enumerate(self.decoder_layers):
            layer_cache = cache.layers[index] if cache is not None else None
            x, self_weights, cross_weights = self._run_layer(
                layer,
                x,
                self_mask,
                encoded.memory,
                encoded.cross_attention_mask,
                layer_cache,
                need_weights=attention is not None,
                self_bias=bias,
                rotary=self.rotary,
                start=start,
            )
            if attention is not None:
                attention.setdefault("decoder_self", []).append(self_weights)
                attention.setdefault("cross", []).append(cross_weights)
        if cache is not None:
            cache.steps += length
        return self.decoder_norm(x)

    @property
    def output_weight(self) -> torch.Tensor:
        """The (V, D) output projection: the target embedding matrix (weight tying)."""
        return self.tgt_embedding.weight

    def forward(self, src: torch.Tensor, tgt_in: torch.Tensor) -> torch.Tensor:
        return self.decode(tgt_in, self.encode(src))

    @property
    def max_target_tokens(self) -> Optional[int]:
        """The most tokens an output can have where learned positions end (BOS takes the first
        position); None for no limit. The config's side of this rule is ModelConfig.position_limit."""
        positions = getattr(self.tgt_positions, "max_positions", None)
        return None if positions is None else positions - 1

    def new_cache(self, hypotheses: int = 1) -> KVCache:
        """A decoding cache; `hypotheses` decoder rows per source row (a beam's k, rows b*k .. b*k+k-1
        decoding source b), which share the source's cross-attention keys and values."""
        return KVCache(len(self.decoder_layers), hypotheses)


def build_model(cfg: ModelConfig, src_vocab_size: int, tgt_vocab_size: int) -> Transformer:
    return Transformer(
        src_vocab_size,
        tgt_vocab_size,
        d_model=cfg.d_model,
        num_heads=cfg.num_heads,
        ffn_dim=cfg.ffn_dim,
        encoder_layers=cfg.encoder_layers,
        decoder_layers=cfg.decoder_layers,
        dropout=cfg.dropout,
        attention_dropout=cfg.attention_dropout,
        positions=cfg.positions,
        max_positions=cfg.max_positions,
        pre_norm=cfg.norm == "pre",
        share_embeddings=cfg.share_embeddings,
        activation=cfg.activation,
        sinusoid_layout=cfg.sinusoid_layout,
        output_bias=cfg.output_bias,
    )
