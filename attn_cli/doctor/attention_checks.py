"""The attention checks, on the weights every attention layer returns for real sentences: whether the
scores are scaled by 1/sqrt(d_head), and how attention spreads over the keys (entropy)."""

from __future__ import annotations

import math
from collections import defaultdict

import torch

from attn_cli.doctor.attention_capture import AttentionCall, queries_and_keys
from attn_cli.doctor.checks import Check
from attn_cli.doctor.probes import Probe
from attn_cli.vocab import PAD_ID

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
