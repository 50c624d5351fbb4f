"""What each attention module of a model received and returned while a block ran, captured with
public forward hooks: the checks recompute attention from its inputs and the module's own
projection weights, independently of the module's code."""

from __future__ import annotations

import contextlib
from dataclasses import dataclass
from typing import Iterator, Optional

import torch
from torch import nn

from attn_cli.model.attention import MultiHeadAttention
from attn_cli.model.positions import RotaryPositions


@dataclass
class AttentionCall:
    name: str  # the module's name in the model, e.g. "decoder_layers.0.cross_attention"
    module: MultiHeadAttention
    query: torch.Tensor  # (B, T, D): what queries (and, for self-attention, keys and values) are projected from
    memory: Optional[torch.Tensor]  # (B, S, D) for cross-attention: what keys and values are projected from
    mask: Optional[torch.Tensor]  # boolean, True = may attend, broadcastable to (B, heads, T, S)
    output: torch.Tensor  # (B, T, D)
    weights: Optional[torch.Tensor]  # (B, heads, T, S) when the call asked for them
    # Relative positions of self-attention, as the call got them (attn_cli/model/positions.py).
    bias: Optional[torch.Tensor] = None  # (1, heads, T, S), added to the scores
    rotary: Optional[RotaryPositions] = None  # turns queries and keys by their positions
    start: int = 0  # the position of the first query

    @property
    def kind(self) -> str:
        """encoder, decoder self or cross: which of the three uses of attention this call is."""
        if self.module.cross:
            return "cross"
        return "encoder" if self.name.startswith("encoder") else "decoder self"

    @property
    def layer(self) -> int:
        """The layer's number, counted from 1, for the report."""
        digits = [part for part in self.name.split(".") if part.isdigit()]
        return int(digits[0]) + 1 if digits else 0


@contextlib.contextmanager
def attention_calls(model: nn.Module) -> Iterator[list[AttentionCall]]:
    """Every call of every MultiHeadAttention of `model` inside the block, in order."""
    calls: list[AttentionCall] = []
    handles = []

    def hook(name: str):
        def record(module, args, kwargs, output):
            memory = args[1] if len(args) > 1 else kwargs.get("memory")
            out, weights = output
            calls.append(
                AttentionCall(
                    name,
                    module,
                    args[0] if args else kwargs["query"],
                    memory,
                    kwargs.get("mask"),
                    out,
                    weights,
                    kwargs.get("bias"),
                    kwargs.get("rotary"),
                    kwargs.get("start", 0),
                )
            )

        return record

    for name, module in model.named_modules():
        if isinstance(module, MultiHeadAttention):
            handles.append(module.register_forward_hook(hook(name), with_kwargs=True))
    try:
        yield calls
    finally:
        for handle in handles:
            handle.remove()


def queries_and_keys(call: AttentionCall) -> tuple[torch.Tensor, torch.Tensor]:
    """The call's queries and keys, (B, heads, length, d_head) each, projected anew from its inputs
    with the module's weights: the fused projection's first D rows are the queries' (self-attention),
    and cross-attention's keys are the first D rows of its key-value projection. Rotary positions
    turn them as the call's own `rotary` does."""
    module = call.module
    width = module.num_heads * module.head_dim
    if module.cross:
        queries = nn.functional.linear(call.query, module.q_proj.weight, module.q_proj.bias)
        keys = nn.functional.linear(call.memory, module.kv_proj.weight[:width], module.kv_proj.bias[:width])
    else:
        weight, bias = module.qkv_proj.weight, module.qkv_proj.bias
        queries = nn.functional.linear(call.query, weight[:width], bias[:width])
        keys = nn.functional.linear(call.query, weight[width : 2 * width], bias[width : 2 * width])
    return _heads(queries, module.num_heads, call), _heads(keys, module.num_heads, call)


def _heads(x: torch.Tensor, heads: int, call: AttentionCall) -> torch.Tensor:
    batch, length, width = x.shape
    x = x.view(batch, length, heads, width // heads)  # (B, T, heads, d_head)
    if call.rotary is not None:
        x = call.rotary.rotate(x, call.start)
    return x.transpose(1, 2)
