"""The model checks: what a correct Transformer's outputs must and must not depend on, measured on a
checkpoint with real sentences. Each compares two forward passes that a correct model makes agree
(or differ) and reports the largest change, relative to the size of the outputs.

- causal mask: changing the target after position i changes no logit at positions <= i.
- padding masks: padding a batch changes no encoder output and no logit.
- cached decoding: decoding with the KV cache, several positions at once and then one at a time,
  gives the logits of decoding the whole prefix at once.
- cross-attention input: every cross-attention call reads the encoder's output, and the cache keeps
  the keys projected from it.
- positions: reversing a source changes the encoder's output beyond reordering it, and swapping two
  earlier target tokens changes later logits; without positions both would be unchanged.
- score scale and attention entropy: attention_checks.py, on the weights captured here.
"""

from __future__ import annotations

import contextlib
from typing import Iterator

import torch
import torch.nn.functional as F

from attn_cli.doctor.attention_checks import attention_calls, attention_entropy_check, score_scale_check
from attn_cli.doctor.checks import Check
from attn_cli.doctor.probes import Probe
from attn_cli.model import Transformer
from attn_cli.vocab import EOS_ID, PAD_ID

SECTION = "model"
# Relative change that float32 rounding explains (batches of other shapes take other summation
# orders); every fault the checks look for changes the outputs by far more.
ROUNDING = 1e-4
FIRST_ORDINARY_ID = EOS_ID + 1
EXTRA_PADDING = 3
# The cached decoder's first calls take several positions at once (the mask then follows the
# cache's length), the later ones one position each, as beam search does.
FIRST_CACHED_CALLS = (2, 3)


def relative_change(after: torch.Tensor, before: torch.Tensor) -> float:
    return float((after - before).abs().max() / before.abs().max().clamp_min(1e-12))


@torch.no_grad()
def model_checks(model: Transformer, probe: Probe) -> list[Check]:
    model.eval()
    with one_thread():
        with attention_calls(model) as calls:  # the weights of every layer, for the attention checks
            encoded = model.encode(probe.src, attention={})
            model.decode(probe.tgt_in, encoded, attention={})
        return [
            causal_mask_check(model, probe),
            padding_check(model, probe),
            *cached_decoding_checks(model, probe),
            positions_check(model, probe),
            score_scale_check(calls, probe),
            attention_entropy_check(calls, probe),
        ]


@contextlib.contextmanager
def one_thread() -> Iterator[None]:
    """Torch on one thread while the block runs. The checks run a few sentences at a time: waking a
    pool of threads for such small tensors costs more than they save, most of all on a busy machine."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(threads)


def _another_token(ids: torch.Tensor, vocabulary: int) -> torch.Tensor:
    """Each ordinary token id replaced by the next one, wrapping round: never itself, never special."""
    return (ids - FIRST_ORDINARY_ID + 1) % (vocabulary - FIRST_ORDINARY_ID) + FIRST_ORDINARY_ID


def causal_mask_check(model: Transformer, probe: Probe) -> Check:
    encoded = model.encode(probe.src)
    before = model.decode(probe.tgt_in, encoded)
    changed, cuts = probe.tgt_in.clone(), []
    for row, length in enumerate(probe.target_lengths):
        cut = length // 2  # positions 0..cut keep their tokens, the later ones of the row change
        changed[row, cut + 1 : length] = _another_token(changed[row, cut + 1 : length], before.shape[-1])
        cuts.append(cut)
    after = model.decode(changed, encoded)
    drift = max(relative_change(after[row, : cut + 1], before[row, : cut + 1]) for row, cut in enumerate(cuts))
    found = (
        f"changing the target after position i changed the logits at positions <= i by {drift:.1e} "
        f"(relative; {len(cuts)} sentences from {probe.origin})"
    )
    fix = (
        "make the decoder's self-attention mask lower-triangular (causal_mask, attn_cli/model/attention.py); "
        "`python3 -m pytest tests/test_model.py -k causal`"
    )
    status = "fail" if drift > ROUNDING else "pass"
    found += ": the decoder sees the future" if status == "fail" else ""
    return Check(SECTION, "causal mask", status, found, fix, {"drift": drift})


def padding_check(model: Transformer, probe: Probe) -> Check:
    src = F.pad(probe.src, (0, EXTRA_PADDING), value=PAD_ID)
    tgt_in = F.pad(probe.tgt_in, (0, EXTRA_PADDING), value=PAD_ID)
    encoded = model.encode(src)
    logits = model.decode(tgt_in, encoded)
    encoder_drift = logits_drift = 0.0
    for row, (source, target) in enumerate(zip(probe.source_lengths, probe.target_lengths)):
        alone = model.encode(src[row : row + 1, :source])
        alone_logits = model.decode(tgt_in[row : row + 1, :target], alone)
        encoder_drift = max(encoder_drift, relative_change(encoded.memory[row, :source], alone.memory[0]))
        logits_drift = max(logits_drift, relative_change(logits[row, :target], alone_logits[0]))
    found = (
        f"padding a batch changed the encoder output by {encoder_drift:.1e} and the logits by {logits_drift:.1e} "
        f"(relative, each sentence alone against in a padded batch)"
    )
    fix = (
        "hide padding keys from every query (key_padding_mask, attn_cli/model/attention.py, in encode and "
        "decode); `python3 -m pytest tests/test_model.py -k padding`"
    )
    status = "fail" if max(encoder_drift, logits_drift) > ROUNDING else "pass"
    found += ": padding is attended to" if status == "fail" else ""
    drifts = {"encoder_drift": encoder_drift, "logits_drift": logits_drift}
    return Check(SECTION, "padding masks", status, found, fix, drifts)


def _cached_call_sizes(length: int) -> list[int]:
    sizes, done = [], 0
    for size in FIRST_CACHED_CALLS:
        if done + size < length:
            sizes.append(size)
            done += size
    return sizes + [1] * (length - done)


def cached_decoding_checks(model: Transformer, probe: Probe) -> list[Check]:
    """Cached decoding against decoding the whole prefix, and what cross-attention reads meanwhile."""
    encoded = model.encode(probe.src)
    whole = model.decode(probe.tgt_in, encoded)
    cache, steps, start = model.new_cache(), [], 0
    with attention_calls(model) as calls:
        for size in _cached_call_sizes(probe.tgt_in.shape[1]):
            steps.append(model.decode(probe.tgt_in[:, start : start + size], encoded, cache))
            start += size
    real = probe.tgt_in != PAD_ID  # a padded row's cached steps past its end see its padding: not compared
    drift = relative_change(torch.cat(steps, dim=1)[real], whole[real])
    sizes = ", ".join(str(size) for size in FIRST_CACHED_CALLS)
    found = (
        f"cached decoding ({sizes} positions at once, then one at a time) differs from decoding the whole "
        f"prefix by {drift:.1e} (relative)"
    )
    status = "fail" if drift > ROUNDING else "pass"
    cached = Check(
        SECTION,
        "cached decoding",
        status,
        found + (": the inference mask or the cache does not follow the decoded length" if status == "fail" else ""),
        "make the cached self-attention mask cover every cached key (Transformer._decoder_states, "
        "attn_cli/model/transformer.py); `python3 -m pytest tests/test_decode.py -k cache`",
        {"drift": drift},
    )
    return [cached, _cross_attention_input(model, encoded, calls, cache)]


def _cross_attention_input(model: Transformer, encoded, calls, cache) -> Check:
    cross = [call for call in calls if call.module.cross]
    other_input = sum(not torch.equal(call.memory, encoded.memory) for call in cross)
    key_drift = 0.0
    for layer, layer_cache in zip(model.decoder_layers, cache.layers):
        attention = layer.cross_attention
        width = attention.num_heads * attention.head_dim
        keys = F.linear(encoded.memory, attention.kv_proj.weight[:width], attention.kv_proj.bias[:width])
        keys = keys.view(*keys.shape[:2], attention.num_heads, attention.head_dim).transpose(1, 2)
        key_drift = max(key_drift, relative_change(layer_cache.cross_keys, keys))
    found = (
        f"{len(cross) - other_input} of {len(cross)} cross-attention calls read the encoder output; the cached "
        f"keys differ from its projection by {key_drift:.1e} (relative)"
    )
    status = "fail" if other_input or key_drift > ROUNDING else "pass"
    return Check(
        SECTION,
        "cross-attention input",
        status,
        found,
        "pass the final encoder output (Encoded.memory) to every cross-attention and project its keys "
        "once per source (LayerCache.cross_keys_values, attn_cli/model/cache.py)",
        {"calls": len(cross), "other_input": other_input, "key_drift": key_drift},
    )


def positions_check(model: Transformer, probe: Probe) -> Check:
    """Without positions an encoder is permutation-equivariant (reordering the source reorders its
    output and changes nothing else), and a decoder position sees the earlier tokens as a set."""
    encoder_change = _encoder_reordering_change(model, probe)
    decoder_change = _decoder_swap_change(model, probe)
    numbers = {"encoder_change": encoder_change, "decoder_change": decoder_change}
    if encoder_change is None and decoder_change is None:
        return Check(
            SECTION,
            "positions",
            "skip",
            "no sentence to reorder (each needs two different tokens)",
            "run the check on a run with a test split",
            numbers,
        )
    parts, blind = [], []
    if encoder_change is not None:
        parts.append(f"reversing a source changed the encoder output beyond reordering it by {encoder_change:.1e}")
        if encoder_change <= ROUNDING:
            blind.append("encoder")
    if decoder_change is not None:
        parts.append(f"swapping two earlier target tokens changed later logits by {decoder_change:.1e}")
        if decoder_change <= ROUNDING:
            blind.append("decoder")
    found = "; ".join(parts) + " (relative)"
    fix = (
        "add the position encodings to the embeddings (Transformer._embed, attn_cli/model/transformer.py) and "
        "keep model.positions: sinusoidal or learned"
    )
    if blind:
        return Check(
            SECTION, "positions", "fail", f"{found}: the {' and '.join(blind)} ignore word order", fix, numbers
        )
    return Check(SECTION, "positions", "pass", found, fix, numbers)


def _encoder_reordering_change(model: Transformer, probe: Probe) -> float | None:
    """The largest change of the encoder output of a reversed source (EOS kept last) from the
    original output reversed alike; None when no source changes when reversed."""
    reversed_src, orders = probe.src.clone(), {}
    for row, length in enumerate(probe.source_lengths):
        order = list(range(length - 2, -1, -1)) + [length - 1]
        reversed_src[row, :length] = probe.src[row, order]
        if not torch.equal(reversed_src[row], probe.src[row]):
            orders[row] = order
    if not orders:
        return None
    original, reordered = model.encode(probe.src).memory, model.encode(reversed_src).memory
    return max(relative_change(reordered[row, : len(order)], original[row, order]) for row, order in orders.items())


def _decoder_swap_change(model: Transformer, probe: Probe) -> float | None:
    """The largest change of the logits after positions 1 and 2 when their tokens are swapped;
    None when no target has two different tokens there and a later position."""
    rows = [
        row
        for row, length in enumerate(probe.target_lengths)
        if length >= 4 and probe.tgt_in[row, 1] != probe.tgt_in[row, 2]
    ]
    if not rows:
        return None
    swapped = probe.tgt_in.clone()
    swapped[:, [1, 2]] = probe.tgt_in[:, [2, 1]]
    encoded = model.encode(probe.src)
    before, after = model.decode(probe.tgt_in, encoded), model.decode(swapped, encoded)
    return max(
        relative_change(after[row, 3 : probe.target_lengths[row]], before[row, 3 : probe.target_lengths[row]])
        for row in rows
    )
