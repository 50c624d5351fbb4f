"""The KV cache must change nothing but speed."""

import contextlib

import pytest
import torch

from attn_cli.beam import beam_search
from attn_cli.data import Example, collate
from attn_cli.decode import greedy_decode, greedy_search
from attn_cli.model.attention import MultiHeadAttention, without_folded_cross_attention
from attn_cli.tokenizer import BOS_ID

from conftest import lively_model, random_source, small_model


@pytest.mark.parametrize("variant", [dict(), dict(pre_norm=False), dict(positions="learned")])
def test_cached_step_logits_equal_full_prefix_logits(variant):
    model = small_model(**variant)
    src = random_source(3, 7, lengths=[7, 4, 6])
    encoded = model.encode(src)
    cache = model.new_cache()
    prefix = torch.full((3, 1), BOS_ID)
    for _ in range(10):
        cached = model.decode(prefix[:, -1:], encoded, cache)[:, -1]
        full = model.decode(prefix, encoded)[:, -1]
        torch.testing.assert_close(cached, full, atol=1e-5, rtol=0)
        prefix = torch.cat([prefix, full.argmax(-1, keepdim=True)], dim=1)


def test_cached_greedy_decoding_equals_uncached():
    for seed in range(5):
        torch.manual_seed(seed)
        model = small_model()
        src = random_source(4, 9, lengths=[9, 2, 5, 7])
        cached = greedy_decode(model, src, max_len_a=1.0, max_len_b=6)
        uncached = greedy_decode(model, src, max_len_a=1.0, max_len_b=6, use_cache=False)
        assert cached == uncached
        assert any(len(out) > 0 for out in cached)


def test_padding_a_batch_changes_no_decoded_sentence():
    model = small_model()
    sources = [torch.randint(4, 50, (n,)).tolist() for n in (8, 2, 5, 11)]
    batch = collate([Example(i, s, []) for i, s in enumerate(sources)])
    together = greedy_decode(model, batch.src)
    for row, source in enumerate(sources):
        assert greedy_decode(model, collate([Example(0, source, [])]).src) == [together[row]]


def test_output_length_limit_follows_the_source_length():
    model = small_model()
    src = random_source(2, 10, lengths=[10, 3])
    exact = greedy_decode(model, src, exact_steps=12)
    assert [len(out) for out in exact] == [12, 12]
    limited = greedy_decode(model, src, max_len_a=0.0, max_len_b=2)
    assert all(len(out) <= 2 for out in limited)


def test_cache_selects_rows():
    model = small_model()
    src = random_source(3, 5)
    encoded = model.encode(src)
    cache = model.new_cache()
    first = torch.full((3, 1), BOS_ID)
    model.decode(first, encoded, cache)
    rows = torch.tensor([2, 0])
    cache.select(rows, source_rows=rows)
    step = torch.tensor([[7], [9]])
    cached = model.decode(step, encoded.select(rows), cache)[:, -1]
    full = model.decode(torch.cat([first[rows], step], dim=1), encoded.select(rows))[:, -1]
    torch.testing.assert_close(cached, full, atol=1e-5, rtol=0)


@pytest.mark.parametrize("rows, in_place", [
    ([0, 1, 2, 3], True),  # nothing moves
    ([0, 0, 2, 3], True),  # one row takes another's history
    ([1, 0, 2, 3], True),  # a swap: each row is the other's origin
    ([3, 3, 0, 1], False),  # most rows move: one full copy
    ([2, 0], False),  # rows leave
])
def test_cache_reorders_in_place_or_by_copy_without_changing_any_logit(rows, in_place):
    # Four hypotheses of one source, as in a beam: the cross-attention keys stay one row.
    model = small_model()
    encoded = model.encode(random_source(1, 5))
    cache = model.new_cache()
    prefix = torch.tensor([[BOS_ID, 5, 6], [BOS_ID, 7, 8], [BOS_ID, 9, 10], [BOS_ID, 11, 12]])
    with torch.no_grad():
        model.decode(prefix, encoded, cache)
        keys_before = cache.layers[0]._history
        rows = torch.tensor(rows)
        cache.select(rows)
        assert (cache.layers[0]._history is keys_before) == in_place
        step = torch.arange(13, 13 + len(rows))[:, None]
        cached = model.decode(step, encoded, cache)[:, -1]
        full = model.decode(torch.cat([prefix[rows], step], dim=1), encoded.select(torch.zeros_like(rows)))[:, -1]
    torch.testing.assert_close(cached, full, atol=1e-5, rtol=0)


def test_learned_positions_cap_the_output_length_instead_of_crashing():
    model = small_model(positions="learned", max_positions=8)
    src = random_source(2, 6)
    outputs = greedy_decode(model, src, max_len_a=3.0, max_len_b=10)
    assert all(len(out) <= 7 for out in outputs)


def test_cross_attention_keys_and_values_are_projected_once_per_source():
    model = small_model()
    calls = []
    for layer in model.decoder_layers:
        layer.cross_attention.kv_proj.register_forward_hook(lambda *_: calls.append("kv"))
    outputs = greedy_decode(model, random_source(2, 6), exact_steps=9)
    assert len(outputs[0]) == 9
    assert calls.count("kv") == len(model.decoder_layers)


def test_the_cache_grows_and_reorders_without_changing_any_logit():
    """Past its first capacity (32 positions), and with rows reordered as beams do, the cache still
    gives the logits of the full prefix."""
    model = small_model()
    src = random_source(3, 6, lengths=[6, 4, 5])
    encoded, cache = model.encode(src), model.new_cache()
    prefix = torch.full((3, 1), BOS_ID)
    with torch.inference_mode():
        for step in range(70):
            cached = model.decode(prefix[:, -1:], encoded, cache)[:, -1]
            full = model.decode(prefix, encoded)[:, -1]
            torch.testing.assert_close(cached, full, atol=1e-5, rtol=0)
            prefix = torch.cat([prefix, full.argmax(-1, keepdim=True)], dim=1)
            if step in (20, 40):  # reorder the rows: row 0 takes row 2's history, and so on
                rows = torch.tensor([2, 0, 1])
                cache.select(rows, source_rows=rows)
                prefix, encoded = prefix[rows], encoded.select(rows)


def _fold_cross_attention(monkeypatch, fold: bool) -> None:
    monkeypatch.setattr(MultiHeadAttention, "folding_pays", lambda self, sources, source_length: fold)


def _teacher_forced_cached_logits(model, src, copies, steps, targets):
    """Cached logits for fixed target tokens, g = `copies` rows per source as in a beam; after step
    3, source 1 leaves the batch."""
    encoded, cache = model.encode(src), model.new_cache()
    sources = list(range(src.shape[0]))
    logits = []
    for step in range(steps):
        rows = torch.tensor(sources).repeat_interleave(copies)
        logits.append(model.decode(targets[rows, step : step + 1], encoded, cache)[:, -1])
        if step == 3:
            kept_sources = torch.tensor([0, 2])
            kept_rows = (kept_sources[:, None] * copies + torch.arange(copies)).flatten()
            cache.select(kept_rows, source_rows=kept_sources)
            encoded, sources = encoded.select(kept_sources), [0, 2]
    return logits, cache


@pytest.mark.parametrize("copies", [1, 3])
def test_folded_cross_attention_gives_the_plain_logits(monkeypatch, copies):
    """Padded sources, several hypotheses per source, and a source leaving mid-search: folding the
    projections into the keys and values changes the logits by rounding only (float64 here)."""
    model = small_model().double()
    src = random_source(3, 7, lengths=[7, 4, 6])
    targets = torch.randint(4, 50, (3, 8))
    results = {}
    for fold in (True, False):
        _fold_cross_attention(monkeypatch, fold)
        results[fold], cache = _teacher_forced_cached_logits(model, src, copies, 8, targets)
        assert (cache.layers[0].folded_cross is not None) == fold
    for folded, plain in zip(results[True], results[False]):
        torch.testing.assert_close(folded, plain, atol=1e-10, rtol=0)


def test_searches_give_the_same_results_with_folded_cross_attention(monkeypatch):
    model = lively_model(2)
    src = random_source(4, 8, lengths=[8, 3, 6, 5])
    results = {}
    for fold in (True, False):
        _fold_cross_attention(monkeypatch, fold)
        results[fold] = (greedy_search(model, src), beam_search(model, src, beam_size=4, alpha=0.6, n_best=4))
    for folded_hypotheses, plain_hypotheses in zip(sum(results[True], []), sum(results[False], [])):
        assert [h.tokens for h in folded_hypotheses] == [h.tokens for h in plain_hypotheses]
        assert [h.score for h in folded_hypotheses] == pytest.approx([h.score for h in plain_hypotheses], abs=1e-4)
    lengths = [len(hypotheses[0].tokens) for hypotheses in results[True][0]]
    assert min(lengths) < max(lengths), "sentences should leave the batch at different steps"


def test_cross_attention_is_folded_for_a_sentence_or_two_and_not_for_a_batch():
    """At the base size with 20-token sources, folding reads fewer numbers for up to 3 sentences."""
    attention = MultiHeadAttention(512, 8, cross=True)
    assert attention.folding_pays(1, 20) and attention.folding_pays(3, 20)
    assert not attention.folding_pays(4, 20) and not attention.folding_pays(32, 20) and not attention.folding_pays(1, 80)
    # the boundary: 73 source tokens x 7 = 511 < 512 numbers per row, 74 x 7 = 518 are more
    assert attention.folding_pays(1, 73) and not attention.folding_pays(1, 74)


def test_a_model_in_training_mode_never_folds():
    model = small_model()
    src = random_source(1, 5)
    for training in (False, True):
        model.train(training)
        encoded, cache = model.encode(src), model.new_cache()
        model.decode(torch.full((1, 1), BOS_ID), encoded, cache)
        assert (cache.layers[0].folded_cross is None) == training


def test_folding_can_be_switched_off_for_a_comparison():
    model = small_model()
    src = random_source(1, 5)
    assert model.decoder_layers[0].cross_attention.folding_pays(1, 5)
    for switched_off in (False, True):
        encoded, cache = model.encode(src), model.new_cache()
        with without_folded_cross_attention() if switched_off else contextlib.nullcontext():
            model.decode(torch.full((1, 1), BOS_ID), encoded, cache)
        assert (cache.layers[0].folded_cross is None) == switched_off
