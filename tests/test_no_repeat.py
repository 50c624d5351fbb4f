"""decode.no_repeat_ngram: no token n-gram twice in one output, and nothing else changed."""

import pytest
import torch
from support.models import lively_model, random_source, small_model

from attn_cli.decoding.beam import beam_search
from attn_cli.decoding.greedy import greedy_search
from attn_cli.decoding.search import SearchSettings, ban_repeated_ngrams
from attn_cli.vocab import BOS_ID


def repeats(tokens: list[int], n: int) -> bool:
    grams = [tuple(tokens[i : i + n]) for i in range(len(tokens) - n + 1)]
    return len(grams) != len(set(grams))


def test_the_tokens_that_would_repeat_an_n_gram_are_banned_and_no_others():
    history = torch.tensor([[BOS_ID, 5, 6, 7, 5, 6], [BOS_ID, 8, 9, 8, 9, 8]])
    for n, banned in ((3, [{7}, {9}]), (2, [{7}, {9}]), (1, [{5, 6, 7}, {8, 9}]), (4, [set(), {9}])):
        log_probs = ban_repeated_ngrams(torch.zeros(2, 12), history, n)
        assert [set(torch.isinf(row).nonzero().flatten().tolist()) for row in log_probs] == banned, n
    assert not torch.isinf(ban_repeated_ngrams(torch.zeros(2, 12), history[:, :2], 2)).any(), "no bigram yet"


@pytest.mark.parametrize("n", [1, 2, 3])
@pytest.mark.parametrize("beam", [1, 4])
def test_no_output_repeats_an_n_gram_and_outputs_without_repeats_are_unchanged(n, beam):
    torch.manual_seed(0)
    models = [small_model(), lively_model(3)]  # an untrained model stutters; a lively one mostly does not
    bitten = 0
    for model in models:
        src = random_source(6, 9, lengths=[9, 3, 5, 7, 8, 4])
        if beam == 1:
            free = greedy_search(model, src, SearchSettings(max_len_a=1.5, max_len_b=8))
            banned = greedy_search(model, src, SearchSettings(max_len_a=1.5, max_len_b=8, no_repeat_ngram=n))
        else:
            free = beam_search(model, src, SearchSettings(beam, length_penalty=0.6, max_len_a=1.5, max_len_b=8))
            banned = beam_search(
                model, src, SearchSettings(beam, length_penalty=0.6, max_len_a=1.5, max_len_b=8, no_repeat_ngram=n)
            )
        for unconstrained, constrained in zip(free, banned):
            assert not repeats(constrained[0].tokens, n)
            if repeats(unconstrained[0].tokens, n):
                bitten += 1
            elif beam == 1:  # greedy: the ban never bit, so every choice was the same
                assert constrained[0].tokens == unconstrained[0].tokens
    assert bitten, "some unconstrained output repeated an n-gram, so the ban was tried"
