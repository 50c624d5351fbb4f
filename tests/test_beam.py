"""Beam search and sampling: equivalences with greedy decoding and with a plain reference search."""

import pytest
import torch
from support.models import lively_model, random_source, unpadded
from support.reference_search import reference_beam_search

from attn_cli.data.batching import Example
from attn_cli.data.collate import collate
from attn_cli.decoding.beam import beam_search
from attn_cli.decoding.greedy import greedy_search, sampler
from attn_cli.decoding.search import SearchSettings


def _assert_same_hypotheses(batched, reference):
    assert [h.tokens for h in batched] == [h.tokens for h in reference]
    for ours, theirs in zip(batched, reference):
        assert ours.score == pytest.approx(theirs.score, abs=1e-4)
        assert ours.log_prob == pytest.approx(theirs.log_prob, abs=1e-4)


@pytest.mark.parametrize("seed", range(2))
@pytest.mark.parametrize("beam_size,alpha", [(2, 0.0), (3, 0.6), (5, 1.0), (4, -0.5)])
def test_batched_beam_search_equals_the_reference_search(seed, beam_size, alpha, device):
    model = lively_model(seed).to(device)
    src = random_source(4, 8, lengths=[8, 3, 6, 5]).to(device)
    batched = beam_search(
        model, src, SearchSettings(beam_size, n_best=beam_size, length_penalty=alpha, max_len_a=1.0, max_len_b=5)
    )
    for row in range(src.shape[0]):
        reference = reference_beam_search(model, unpadded(src, row), beam_size, alpha, 1.0, 5, beam_size)
        _assert_same_hypotheses(batched[row], reference)
    assert len({len(hypotheses[0].tokens) for hypotheses in batched}) > 1, "sentences should end at different lengths"


@pytest.mark.parametrize("positions", ["relative", "rotary"])
def test_beam_search_over_the_cache_equals_the_reference_search_with_relative_positions(positions):
    """Each cached step's bias or rotation is that of its own position, and beams reordering keep it so."""
    model = lively_model(0, positions=positions)
    src = random_source(3, 8, lengths=[8, 3, 6])
    batched = beam_search(model, src, SearchSettings(3, n_best=3, length_penalty=0.6, max_len_a=1.0, max_len_b=5))
    for row in range(src.shape[0]):
        _assert_same_hypotheses(batched[row], reference_beam_search(model, unpadded(src, row), 3, 0.6, 1.0, 5, 3))


@pytest.mark.parametrize("seed", range(3))
def test_beam_of_one_is_greedy_decoding(seed, device):
    model = lively_model(seed).to(device)
    src = random_source(5, 9, lengths=[9, 2, 5, 7, 4]).to(device)
    beam = beam_search(model, src, SearchSettings(beam_size=1, length_penalty=0.0, max_len_a=1.0, max_len_b=6))
    greedy = greedy_search(model, src, SearchSettings(max_len_a=1.0, max_len_b=6))
    for beam_hypotheses, greedy_hypotheses in zip(beam, greedy):
        assert beam_hypotheses[0].tokens == greedy_hypotheses[0].tokens
        assert beam_hypotheses[0].log_prob == pytest.approx(greedy_hypotheses[0].log_prob, abs=1e-4)


def test_a_wider_beam_never_scores_worse_than_greedy_on_these_models():
    for seed in range(4):
        model = lively_model(seed)
        src = random_source(4, 7, lengths=[7, 3, 5, 6])
        greedy = greedy_search(model, src, SearchSettings(length_penalty=0.0))
        wide = beam_search(model, src, SearchSettings(beam_size=6, length_penalty=0.0))
        for g, b in zip(greedy, wide):
            assert b[0].score >= g[0].score - 1e-5


def test_sentences_leaving_the_batch_change_no_result():
    """Decoded together, the short sentences finish early and leave; alone, they never share a batch."""
    model = lively_model(1)
    sources = [torch.randint(4, 50, (n,)).tolist() + [3] for n in (9, 1, 4, 12, 2)]
    batch = collate([Example(i, s[:-1], []) for i, s in enumerate(sources)]).src
    together = beam_search(model, batch, SearchSettings(beam_size=3, n_best=3, length_penalty=0.6))
    for row, source in enumerate(sources):
        alone = beam_search(model, torch.tensor([source]), SearchSettings(beam_size=3, n_best=3, length_penalty=0.6))
        _assert_same_hypotheses(together[row], alone[0])
    lengths = [len(hypotheses[0].tokens) for hypotheses in together]
    assert min(lengths) < max(lengths)


def test_n_best_lists_are_sorted_and_distinct():
    model = lively_model(2)
    results = beam_search(model, random_source(3, 6), SearchSettings(beam_size=4, n_best=4, length_penalty=0.6))
    for hypotheses in results:
        assert len(hypotheses) == 4
        scores = [h.score for h in hypotheses]
        assert scores == sorted(scores, reverse=True)
        assert len({tuple(h.tokens) for h in hypotheses}) == 4


def test_cross_attention_is_projected_once_per_source_not_per_beam():
    model = lively_model(0)
    rows_projected = []
    for layer in model.decoder_layers:
        layer.cross_attention.kv_proj.register_forward_hook(
            lambda _m, inputs, _o: rows_projected.append(inputs[0].shape[0])
        )
    beam_search(model, random_source(3, 6), SearchSettings(beam_size=5, length_penalty=0.6, exact_steps=7))
    assert rows_projected == [3] * len(model.decoder_layers)


def test_forced_length_beam_search_gives_that_many_tokens():
    model = lively_model(0)
    results = beam_search(
        model, random_source(2, 5), SearchSettings(beam_size=3, n_best=3, length_penalty=0.6, exact_steps=11)
    )
    assert all(len(h.tokens) == 11 for hypotheses in results for h in hypotheses)


def test_sampling_with_top_k_1_is_greedy():
    model = lively_model(3)
    src = random_source(4, 7, lengths=[7, 3, 5, 6])
    sampled = greedy_search(model, src, choose=sampler(temperature=1.3, top_k=1))
    greedy = greedy_search(model, src)
    assert [h[0].tokens for h in sampled] == [h[0].tokens for h in greedy]


def test_sampling_is_reproducible_with_a_seeded_generator_and_draws_several_samples():
    model = lively_model(3)
    src = random_source(2, 7)
    first = greedy_search(
        model, src, SearchSettings(n_best=4), choose=sampler(generator=torch.Generator().manual_seed(5))
    )
    again = greedy_search(
        model, src, SearchSettings(n_best=4), choose=sampler(generator=torch.Generator().manual_seed(5))
    )
    assert [[h.tokens for h in hs] for hs in first] == [[h.tokens for h in hs] for hs in again]
    assert all(len(hs) == 4 for hs in first)
    assert len({tuple(h.tokens) for h in first[0]}) > 1


def test_sampler_keeps_to_top_k_and_top_p():
    log_probs = torch.tensor([[0.4, 0.3, 0.2, 0.1]]).log().expand(6000, 4)
    generator = torch.Generator().manual_seed(0)
    top_k = torch.bincount(sampler(top_k=2, generator=generator)(log_probs), minlength=4)
    assert top_k[2:].sum() == 0 and top_k[0] > top_k[1] > 0
    # 0.4 alone is short of 0.6, so 0.3 joins; with 0.7 reached, 0.2 and 0.1 are dropped.
    top_p = torch.bincount(sampler(top_p=0.6, generator=generator)(log_probs), minlength=4)
    assert top_p[2:].sum() == 0
    assert top_p[0] / top_p[1] == pytest.approx(4 / 3, rel=0.1)
    cold = torch.bincount(sampler(temperature=0.05, generator=generator)(log_probs), minlength=4)
    assert cold[0] > 0.99 * 6000


def test_unscored_greedy_decoding_picks_the_same_tokens():
    for seed in range(3):
        model = lively_model(seed)
        src = random_source(4, 7, lengths=[7, 3, 5, 6])
        scored = greedy_search(model, src, SearchSettings(max_len_a=1.0, max_len_b=5))
        unscored = greedy_search(model, src, SearchSettings(max_len_a=1.0, max_len_b=5), scored=False)
        assert [h[0].tokens for h in unscored] == [h[0].tokens for h in scored]
        assert all(h[0].log_prob != h[0].log_prob for h in unscored)  # NaN: not computed
