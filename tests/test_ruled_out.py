"""A row whose every next token the rules forbid ends there, with EOS: greedy search, sampling and
beam search never emit padding from a row of -inf, nor sample from NaN."""

import math

import pytest
import torch
from support.models import lively_model, random_source

from attn_cli.decoding.beam import beam_search
from attn_cli.decoding.greedy import greedy_search, sampler
from attn_cli.decoding.search import SearchSettings, restrict_next_tokens
from attn_cli.vocab import EOS_ID, PAD_ID

ALLOWED = 2  # tokens a row may search before the rule below forbids every token, EOS included


class ForbidsAllAfter:
    """A rule that, once a row holds `ALLOWED` searched tokens, forbids every next token."""

    def restrict(self, log_probs, history, steps_left):
        log_probs[history.shape[1] - 1 >= ALLOWED] = float("-inf")  # history: BOS and the searched tokens
        return log_probs


class ForbidsRowOne:
    """A rule that forbids every next token of row 1, EOS included."""

    def restrict(self, log_probs, history, steps_left):
        log_probs[1] = float("-inf")
        return log_probs


def searches(model, src):
    rule = (ForbidsAllAfter(),)
    generator = torch.Generator().manual_seed(3)
    return {
        "greedy": greedy_search(model, src, SearchSettings(max_len_b=8, constraints=rule)),
        "sampling": greedy_search(
            model, src, SearchSettings(n_best=2, max_len_b=8, constraints=rule), choose=sampler(generator=generator)
        ),
        "beam": beam_search(model, src, SearchSettings(3, n_best=1, length_penalty=0.6, max_len_b=8, constraints=rule)),
    }


@pytest.mark.parametrize("search", ["greedy", "sampling", "beam"])
def test_a_row_left_without_a_token_ends_with_eos(search):
    model = lively_model(seed=4)
    src = random_source(5, 6)
    results = searches(model, src)[search]
    assert len(results) == 5
    for hypotheses in results:
        assert hypotheses, "every source has a result"
        for hypothesis in hypotheses:
            assert len(hypothesis.tokens) <= ALLOWED and PAD_ID not in hypothesis.tokens
            assert math.isfinite(hypothesis.score) and math.isfinite(hypothesis.log_prob)


def test_the_ending_keeps_the_eos_probability_it_had():
    log_probs = torch.randn(3, 10).log_softmax(dim=-1)
    before = log_probs[:, EOS_ID].clone()
    history = torch.tensor([[2, 5], [2, 6], [2, 7]])
    restricted = restrict_next_tokens(log_probs.clone(), history, torch.tensor([4, 4, 4]), 0, [ForbidsRowOne()])
    assert restricted[1, EOS_ID] == before[1] and torch.isneginf(restricted[1]).sum() == 9
    assert torch.equal(restricted[[0, 2]], log_probs[[0, 2]]), "rows with a choice are left as they were"
