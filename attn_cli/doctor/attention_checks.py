"""The attention checks: whether the scores are scaled by 1/sqrt(d_head), and how attention spreads
over the keys (entropy), on what every attention module of a model received and returned for real
sentences. The calls are captured with public forward hooks (`attention_calls`, also used by
model_checks.py), and the checks recompute attention from the captured inputs and the module's own
projection weights, independently of the module's code."""

from __future__ import annotations

import contextlib
import math
from collections import defaultdict
from dataclasses import dataclass
from typing import Iterator, Optional

import torch
from torch import nn

from attn_cli.doctor.checks import Check
from attn_cli.doctor.probes import Probe
from attn_cli.model.attention import MultiHeadAttention
from attn_cli.model.positions import RotaryPositions
from attn_cli.vocab import PAD_ID

# The capture: each attention call's inputs and outputs, recorded by forward hooks.


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


# The checks, on the captured calls.

SECTION = "model"
# Used scores over textbook scores: exactly 1 for a correct layer (up to rounding); a missing
# 1/sqrt(d_head) makes it sqrt(d_head), a doubled one 1/sqrt(d_head).
SCALE_TOLERANCE = 0.05
# Weights this small carry no usable logarithm; their keys are left out of the comparison.
SMALLEST_WEIGHT = 1e-30
ROUNDING = 1e-4  # relative: what float32 rounding moves an output by between two ways of computing it
# Entropy over the visible keys, divided by its largest value log(keys): 1 is uniform attention, 0
# attention to one key. A layer whose every head is beyond these bounds warns.
NEAR_UNIFORM = 0.95
NEAR_ONE_HOT = 0.05


def _query_rows(call: AttentionCall, probe: Probe) -> torch.Tensor:
    """(B, T) True for the real (not padding) queries of the call."""
    ids = probe.src if call.kind == "encoder" else probe.tgt_in
    return ids != PAD_ID


def _visible(call: AttentionCall, probe: Probe) -> torch.Tensor:
    """(B, heads, T, S) True where a real query may see a key."""
    shape = call.weights.shape
    visible = call.mask.expand(shape) if call.mask is not None else torch.ones(shape, dtype=torch.bool)
    return visible & _query_rows(call, probe)[:, None, :, None]


def _centred(values: torch.Tensor, visible: torch.Tensor) -> torch.Tensor:
    """Each row minus its mean over its visible keys; 0 elsewhere."""
    values = values.masked_fill(~visible, 0.0)
    mean = values.sum(-1, keepdim=True) / visible.sum(-1, keepdim=True).clamp_min(1)
    return (values - mean).masked_fill(~visible, 0.0)


def score_ratio(call: AttentionCall, probe: Probe) -> float:
    """The spread of the scores the layer used over that of q.k/sqrt(d_head) recomputed from its
    inputs and weights. The softmax weights give the used scores up to a constant per row (log w =
    s - logsumexp s), so both are compared after removing each row's mean over its visible keys."""
    queries, keys = queries_and_keys(call)
    textbook = queries @ keys.transpose(-2, -1) / math.sqrt(call.module.head_dim)
    if call.bias is not None:  # relative positions: the textbook scores carry the bias too
        textbook = textbook + call.bias
    visible = _visible(call, probe) & (call.weights > SMALLEST_WEIGHT)
    used = call.weights.clamp_min(SMALLEST_WEIGHT).log()
    textbook_spread = _centred(textbook, visible).square().sum()
    return math.sqrt(_centred(used, visible).square().sum() / textbook_spread.clamp_min(1e-30))


def fused_drift(call: AttentionCall) -> float:
    """How far the fused kernel's output (the path training and decoding take) is from the explicit
    formula's output the call returned with its weights, relative to the output's size."""
    module = call.module
    args = (call.query, call.memory) if module.cross else (call.query,)
    fused, _ = module(*args, mask=call.mask, bias=call.bias, rotary=call.rotary, start=call.start)
    return float((fused - call.output).abs().max() / call.output.abs().max().clamp_min(1e-12))


def score_scale_check(calls: list[AttentionCall], probe: Probe) -> Check:
    ratios = {f"{call.kind} {call.layer}": score_ratio(call, probe) for call in calls}
    drift = max(fused_drift(call) for call in calls)
    head_dim = calls[0].module.head_dim
    numbers = {
        "ratios": {name: round(ratio, 4) for name, ratio in ratios.items()},
        "fused_drift": drift,
        "d_head": head_dim,
    }
    wrong = {name: ratio for name, ratio in ratios.items() if abs(ratio - 1) > SCALE_TOLERANCE}
    fix = (
        "divide the scores by sqrt(d_head) in MultiHeadAttention (attn_cli/model/attention.py) on both paths; "
        "`python3 -m pytest tests/test_model.py -k explicit`"
    )
    if wrong:
        shown = ", ".join(f"{name} {ratio:.2f}" for name, ratio in wrong.items())
        missing = any(
            abs(ratio - math.sqrt(head_dim)) < SCALE_TOLERANCE * math.sqrt(head_dim) for ratio in wrong.values()
        )
        why = (
            f": about sqrt(d_head) = {math.sqrt(head_dim):.2f}, the 1/sqrt(d_head) scaling is missing"
            if missing
            else ""
        )
        return Check(SECTION, "score scale", "fail", f"scores used / (q.k/sqrt(d_head)) is {shown}{why}", fix, numbers)
    if drift > ROUNDING:
        return Check(
            SECTION,
            "score scale",
            "fail",
            f"the explicit formula is scaled right, but the fused kernel's "
            f"output differs from it by {drift:.1e} (relative)",
            fix,
            numbers,
        )
    spread = f"{min(ratios.values()):.3f}-{max(ratios.values()):.3f}"
    return Check(
        SECTION,
        "score scale",
        "pass",
        f"scores used / (q.k/sqrt(d_head)) = {spread} in all {len(ratios)} "
        f"attention layers (d_head {head_dim}); the fused kernel agrees to {drift:.0e}",
        fix,
        numbers,
    )


def head_entropies(call: AttentionCall, probe: Probe) -> list[float]:
    """Each head's mean entropy over the visible keys, as a share of its largest value log(keys),
    over the real queries that see at least two keys."""
    visible = _visible(call, probe)
    keys = visible.sum(-1)  # (B, heads, T)
    entropy = torch.special.entr(call.weights).masked_fill(~visible, 0.0).sum(-1)
    counted = keys >= 2
    normalised = torch.where(counted, entropy / keys.clamp_min(2).log(), 0.0)
    return (normalised.sum(dim=(0, 2)) / counted.sum(dim=(0, 2)).clamp_min(1)).tolist()


def attention_entropy_check(calls: list[AttentionCall], probe: Probe) -> Check:
    by_kind: dict[str, list[str]] = defaultdict(list)
    uniform, one_hot, numbers = [], [], {}
    for call in calls:
        heads = head_entropies(call, probe)
        name = f"{call.kind} {call.layer}"
        numbers[name] = [round(value, 3) for value in heads]
        by_kind[call.kind].append(f"{sum(heads) / len(heads):.2f}")
        if min(heads) > NEAR_UNIFORM:
            uniform.append(name)
        if max(heads) < NEAR_ONE_HOT:
            one_hot.append(name)
    shown = "; ".join(f"{kind} {' '.join(values)}" for kind, values in by_kind.items())
    found = f"entropy / log(keys), mean of heads by layer (1 uniform, 0 one key): {shown}"
    fix = "train longer (train.max_steps), or check the score scale and the learning rate (train.lr)"
    if uniform or one_hot:
        problems = ([f"every head near uniform in {', '.join(uniform)}"] if uniform else []) + (
            [f"every head on one key in {', '.join(one_hot)}"] if one_hot else []
        )
        return Check(SECTION, "attention entropy", "warn", f"{found}: {'; '.join(problems)}", fix, numbers)
    return Check(SECTION, "attention entropy", "pass", found, fix, numbers)
