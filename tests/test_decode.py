"""The KV cache must change nothing but speed."""

import pytest
import torch
from support.models import random_source, small_model

from attn_cli.data.batching import Example
from attn_cli.data.collate import collate
from attn_cli.decoding.greedy import greedy_decode
from attn_cli.decoding.search import SearchSettings
from attn_cli.vocab import BOS_ID


@pytest.mark.parametrize(
    "variant",
    [dict(), dict(pre_norm=False), dict(positions="learned"), dict(positions="relative"), dict(positions="rotary")],
)
def test_cached_step_logits_equal_full_prefix_logits(variant, device):
    model = small_model(**variant).to(device)
    src = random_source(3, 7, lengths=[7, 4, 6]).to(device)
    encoded = model.encode(src)
    cache = model.new_cache()
    prefix = torch.full((3, 1), BOS_ID, device=device)
    # fp32; a GPU's kernels pick their summation order by shape, so one step and the whole prefix
    # round differently there
    tolerance = 1e-5 if device.type == "cpu" else 1e-4
    for _ in range(10):
        cached = model.decode(prefix[:, -1:], encoded, cache)[:, -1]
        full = model.decode(prefix, encoded)[:, -1]
        torch.testing.assert_close(cached, full, atol=tolerance, rtol=0)
        prefix = torch.cat([prefix, full.argmax(-1, keepdim=True)], dim=1)


@pytest.mark.parametrize("positions", ["sinusoidal", "relative", "rotary"])
def test_cached_greedy_decoding_equals_uncached(positions, device):
    for seed in range(5):
        torch.manual_seed(seed)
        model = small_model(positions=positions).to(device)
        src = random_source(4, 9, lengths=[9, 2, 5, 7]).to(device)
        cached = greedy_decode(model, src, SearchSettings(max_len_a=1.0, max_len_b=6))
        uncached = greedy_decode(model, src, SearchSettings(max_len_a=1.0, max_len_b=6), use_cache=False)
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
    exact = greedy_decode(model, src, SearchSettings(exact_steps=12))
    assert [len(out) for out in exact] == [12, 12]
    limited = greedy_decode(model, src, SearchSettings(max_len_a=0.0, max_len_b=2))
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


@pytest.mark.parametrize(
    "rows",
    [
        [0, 1, 2, 3],  # nothing moves
        [0, 0, 2, 3],  # one row takes another's history
        [1, 0, 2, 3],  # a swap: each row is the other's origin
        [3, 3, 0, 1],  # most rows move
    ],
)
def test_cache_reorders_rows_without_changing_any_logit(rows):
    # Four hypotheses of one source, as in a beam: the cross-attention keys stay one row.
    model = small_model()
    encoded = model.encode(random_source(1, 5))
    cache = model.new_cache(hypotheses=4)
    prefix = torch.tensor([[BOS_ID, 5, 6], [BOS_ID, 7, 8], [BOS_ID, 9, 10], [BOS_ID, 11, 12]])
    with torch.no_grad():
        model.decode(prefix, encoded, cache)
        rows = torch.tensor(rows)
        cache.select(rows)
        step = torch.arange(13, 13 + len(rows))[:, None]
        cached = model.decode(step, encoded, cache)[:, -1]
        full = model.decode(torch.cat([prefix[rows], step], dim=1), encoded.select(torch.zeros_like(rows)))[:, -1]
    torch.testing.assert_close(cached, full, atol=1e-5, rtol=0)


def test_the_hypotheses_per_source_are_the_caches_never_guessed_from_shapes():
    """Four decoder rows against one source's keys decode as its four hypotheses only with a cache
    made for four; with one made for one (or none) the mismatch is an error, not a silent grouping."""
    model = small_model()
    encoded = model.encode(random_source(1, 5))
    rows = torch.full((4, 1), BOS_ID)
    with torch.no_grad():
        grouped = model.decode(rows, encoded, model.new_cache(hypotheses=4))
        copied = model.decode(rows, encoded.select(torch.zeros(4, dtype=torch.long)), model.new_cache())
        torch.testing.assert_close(grouped, copied, atol=1e-5, rtol=0)
        with pytest.raises(ValueError, match="4 query rows against 1 rows of keys"):
            model.decode(rows, encoded, model.new_cache())
        with pytest.raises(ValueError, match="4 query rows against 1 rows of keys"):
            model.decode(rows, encoded)


def test_learned_positions_cap_the_output_length_instead_of_crashing():
    model = small_model(positions="learned", max_positions=8)
    src = random_source(2, 6)
    outputs = greedy_decode(model, src, SearchSettings(max_len_a=3.0, max_len_b=10))
    assert all(len(out) <= 7 for out in outputs)


def test_cross_attention_keys_and_values_are_projected_once_per_source():
    model = small_model()
    calls = []
    for layer in model.decoder_layers:
        layer.cross_attention.kv_proj.register_forward_hook(lambda *_: calls.append("kv"))
    outputs = greedy_decode(model, random_source(2, 6), SearchSettings(exact_steps=9))
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


def _teacher_forced_cached_logits(model, src, copies, steps, targets):
    """Cached logits for fixed target tokens, g = `copies` rows per source as in a beam; after step
    3, source 1 leaves the batch."""
    encoded, cache = model.encode(src), model.new_cache(hypotheses=copies)
    sources = list(range(src.shape[0]))
    logits = []
    for step in range(steps):
        rows = torch.tensor(sources).repeat_interleave(copies)
        logits.append(
            model.decode(_hypothesis_targets(targets, rows, copies)[:, step : step + 1], encoded, cache)[:, -1]
        )
        if step == 3:
            kept_sources = torch.tensor([0, 2])
            kept_rows = (kept_sources[:, None] * copies + torch.arange(copies)).flatten()
            cache.select(kept_rows, source_rows=kept_sources)
            encoded, sources = encoded.select(kept_sources), [0, 2]
    return logits, cache


def _hypothesis_targets(targets: torch.Tensor, rows: torch.Tensor, copies: int) -> torch.Tensor:
    """Each hypothesis of a source its own target tokens, so that a mix-up between them shows."""
    return 4 + (targets[rows] - 4 + torch.arange(len(rows))[:, None] % copies) % 46


@pytest.mark.parametrize("copies", [1, 3])
def test_hypotheses_sharing_a_source_give_the_logits_of_the_full_prefix(copies):
    """Padded sources, g = `copies` hypotheses per source whose cross-attention keys and values are
    held once per source (as in a beam), and a source leaving mid-search: every cached step gives
    the logits of the decoder run on the whole prefix against its own copy of the source."""
    model = small_model()
    src = random_source(3, 7, lengths=[7, 4, 6])
    targets = torch.randint(4, 50, (3, 8))
    with torch.inference_mode():
        cached, cache = _teacher_forced_cached_logits(model, src, copies, 8, targets)
        for step, logits in enumerate(cached):
            sources = torch.tensor([0, 1, 2] if step <= 3 else [0, 2]).repeat_interleave(copies)
            encoded = model.encode(src[sources])
            full = model.decode(_hypothesis_targets(targets, sources, copies)[:, : step + 1], encoded)[:, -1]
            torch.testing.assert_close(logits, full, atol=1e-5, rtol=0)
    assert cache.layers[0].cross_keys.shape[0] == 2  # one row per source that stays


@pytest.mark.parametrize("beam", [1, 3])
def test_a_search_stops_between_steps_when_its_stop_check_says_so(beam):
    from attn_cli.decoding.beam import beam_search
    from attn_cli.decoding.engine import SearchStopped
    from attn_cli.decoding.greedy import greedy_search

    model, src = small_model(), random_source(2, 6)
    asked = []

    def stop_after_three() -> bool:
        asked.append(True)
        return len(asked) > 3

    settings = SearchSettings(beam, max_len_a=0.0, max_len_b=50, exact_steps=20, stop=stop_after_three)
    search = greedy_search if beam == 1 else beam_search
    with pytest.raises(SearchStopped):
        search(model, src, settings)
    assert len(asked) == 4, "asked once before each step, and stopped at the first yes"
    asked.clear()
    done = search(model, src, SearchSettings(beam, max_len_a=0.0, max_len_b=50, exact_steps=3, stop=stop_after_three))
    assert len(done) == 2 and len(asked) == 3, "a search that ends first is not stopped"
