"""Ensembles: several models searched as one, scored by the mean of their log-probabilities."""

import pytest
import torch
from support.models import lively_model, random_source, small_model, unpadded
from support.reference_search import reference_beam_search

from attn_cli.checkpoint import require_shared_tokenizers
from attn_cli.config import TokenizerConfig
from attn_cli.data.tokenizer import Tokenizers, train_sentencepiece
from attn_cli.decoding.beam import beam_search
from attn_cli.decoding.ensemble import Ensemble
from attn_cli.decoding.greedy import greedy_search
from attn_cli.decoding.search import SearchSettings
from attn_cli.errors import UserError
from attn_cli.vocab import BOS_ID, PAD_ID

SHORT = dict(max_len_a=1.0, max_len_b=6)


def _searches(model, src):
    """Greedy and beam search results of `model` (a model or an ensemble) as comparable tuples."""
    return {
        "greedy": greedy_search(model, src, SearchSettings(length_penalty=0.6, **SHORT)),
        "beam": beam_search(model, src, SearchSettings(3, n_best=3, length_penalty=0.6, **SHORT)),
    }


def _as_tuples(results):
    return [[(h.tokens, h.log_prob, h.score) for h in hypotheses] for hypotheses in results]


@pytest.mark.parametrize("seed", range(2))
def test_an_ensemble_of_one_searches_as_the_model_alone(seed):
    model = lively_model(seed)
    src = random_source(4, 8, lengths=[8, 3, 6, 5])
    alone, ensemble = _searches(model, src), _searches(Ensemble([model]), src)
    for search in ("greedy", "beam"):
        assert _as_tuples(ensemble[search]) == _as_tuples(alone[search])  # the same tokens and scores, exactly


@pytest.mark.parametrize("seed", range(2))
def test_an_ensemble_of_a_model_with_itself_picks_the_models_tokens(seed):
    model = lively_model(seed)
    src = random_source(4, 8, lengths=[8, 3, 6, 5])
    alone, doubled = _searches(model, src), _searches(Ensemble([model, model]), src)
    for search in ("greedy", "beam"):
        assert [[h.tokens for h in hs] for hs in doubled[search]] == [[h.tokens for h in hs] for hs in alone[search]]
        for ours, theirs in zip(doubled[search], alone[search]):
            assert [h.score for h in ours] == pytest.approx([h.score for h in theirs], abs=1e-4)


def _log_probs(model, src) -> torch.Tensor:
    """A model's own first-step distribution: log-softmax over the tokens it may emit."""
    logits = model.decode(torch.full((src.shape[0], 1), BOS_ID), model.encode(src))[:, -1]
    logits[:, [PAD_ID, BOS_ID]] = float("-inf")
    return logits.log_softmax(dim=-1)


def test_the_first_step_log_probs_of_two_models_are_the_mean_of_theirs():
    torch.manual_seed(1)
    first, second = small_model(), small_model(num_heads=2, decoder_layers=1)
    src = random_source(3, 6, lengths=[6, 3, 5])
    ensemble = Ensemble([first, second])
    with torch.inference_mode():
        combined = ensemble.next_log_probs(
            torch.full((3, 1), BOS_ID), ensemble.encode(src), ensemble.new_cache(), at_limit=None, exact=False
        )
        theirs = _log_probs(first, src), _log_probs(second, src)
    torch.testing.assert_close(combined, (theirs[0] + theirs[1]) / 2, atol=1e-6, rtol=0)
    assert not torch.allclose(theirs[0][:, 4:], theirs[1][:, 4:], atol=1e-3)  # two models that disagree
    (first_token,) = {tuple(h[0].tokens[:1]) for h in [greedy_search(ensemble, src[:1], SearchSettings(**SHORT))[0]]}
    assert first_token == (int(combined[0].argmax()),)


@pytest.mark.parametrize("prefix", [(), (11, 23)])
@pytest.mark.parametrize("beam_size,alpha", [(2, 0.0), (4, 0.6)])
def test_ensemble_beam_search_equals_the_reference_search(prefix, beam_size, alpha):
    """Beams reorder, and sentences leave, in every member's cache: a member left behind would give
    other log-probabilities than the reference search, which keeps no cache."""
    ensemble = Ensemble([lively_model(0), lively_model(1), lively_model(2)])
    src = random_source(4, 8, lengths=[8, 3, 6, 5])
    forced = torch.tensor([list(prefix)] * 4, dtype=torch.long)
    batched = beam_search(
        ensemble, src, SearchSettings(beam_size, n_best=beam_size, length_penalty=alpha, **SHORT), prefix=forced
    )
    for row in range(src.shape[0]):
        reference = reference_beam_search(ensemble, unpadded(src, row), beam_size, alpha, 1.0, 6, beam_size, prefix)
        assert [h.tokens for h in batched[row]] == [h.tokens for h in reference]
        assert [h.score for h in batched[row]] == pytest.approx([h.score for h in reference], abs=1e-4)


def test_ensemble_greedy_search_with_a_cache_equals_it_without():
    ensemble = Ensemble([lively_model(0), lively_model(3)])
    src = random_source(5, 9, lengths=[9, 2, 5, 7, 4])
    cached = greedy_search(ensemble, src, SearchSettings(**SHORT))
    uncached = greedy_search(ensemble, src, SearchSettings(**SHORT), use_cache=False)
    assert [[h.tokens for h in hs] for hs in cached] == [[h.tokens for h in hs] for hs in uncached]
    assert len({len(hs[0].tokens) for hs in cached}) > 1, "sentences should leave the batch at different steps"
    # without scores, the mean of the members' logits picks the tokens the mean of their log-probabilities does
    unscored = greedy_search(ensemble, src, SearchSettings(**SHORT), scored=False)
    assert [[h.tokens for h in hs] for hs in unscored] == [[h.tokens for h in hs] for hs in cached]


def _tokenizers(letters: str) -> Tokenizers:
    """A tiny SentencePiece model trained on made-up words of these letters."""
    words = [a + b + c for a in letters for b in letters for c in letters]
    sentences = [" ".join(words[i : i + 6]) for i in range(0, len(words), 6)]
    tokenizer = train_sentencepiece(sentences, TokenizerConfig(vocab_size=300))
    return Tokenizers(tokenizer, tokenizer)


def test_models_with_different_tokenizers_are_refused_in_one_line():
    first, second = _tokenizers("abcdefghij"), _tokenizers("klmnopqrst")
    same = Tokenizers.from_state(first.to_state())  # another object, the same SentencePiece model
    require_shared_tokenizers([("a.pt", first), ("b.pt", same)])
    with pytest.raises(UserError) as refused:
        require_shared_tokenizers([("a.pt", first), ("b.pt", same), ("c.pt", second)])
    message = str(refused.value)
    assert "\n" not in message and "a.pt and c.pt use different tokenizers" in message
    assert "ensemble checkpoints that share one" in message
