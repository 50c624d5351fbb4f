"""Forced prefixes: every output begins with the prefix and the search continues from there.

What holds exactly, and is tested: greedy decoding from a prefix that is the start of the greedy
output gives that output again (greedy's choice at a step depends only on the tokens before it);
beam search from a prefix equals a plain reference beam search from the same prefix, and a beam of
one equals greedy decoding from it. What does not hold exactly, and is not tested: beam search from
the first k tokens of its own best output need not give that output again, since from the prefix
all k beams extend it, where the unconstrained beam shared them with other hypotheses.
"""

import pytest
import torch
from support.decoding import engine_of
from support.models import lively_model, random_source, small_model, unpadded
from support.reference_search import reference_beam_search
from support.runs import numbered_tokenizers

from attn_cli.config import DecodeConfig
from attn_cli.data.collate import padded_sources
from attn_cli.decoding.beam import beam_search
from attn_cli.decoding.greedy import greedy_search
from attn_cli.decoding.records import Part
from attn_cli.decoding.search import SearchSettings, next_token_log_probs, output_constraints
from attn_cli.vocab import BOS_ID

SHORT = dict(max_len_a=1.0, max_len_b=6)


def _prefix(rows: int, tokens: list[int]) -> torch.Tensor:
    return torch.tensor([tokens] * rows)


@pytest.mark.parametrize("search", ["greedy", "beam"])
def test_every_output_begins_with_the_prefix(search):
    model = lively_model(0)
    src = random_source(3, 7, lengths=[7, 3, 5])
    prefix = [7, 19, 4]
    if search == "greedy":
        results = greedy_search(model, src, SearchSettings(**SHORT), prefix=_prefix(3, prefix))
    else:
        results = beam_search(
            model, src, SearchSettings(3, n_best=3, length_penalty=0.6, **SHORT), prefix=_prefix(3, prefix)
        )
    unconstrained = greedy_search(model, src, SearchSettings(**SHORT))
    assert all(hypotheses[0].tokens[:3] != prefix for hypotheses in unconstrained)  # the prefix changes something
    for hypotheses in results:
        assert hypotheses and all(h.tokens[:3] == prefix for h in hypotheses)


@torch.no_grad()
def _prefix_log_prob(model, src_row: torch.Tensor, prefix: list[int]) -> float:
    """log P(prefix | source), teacher-forced: what the unconstrained search adds for those tokens."""
    logits = model.decode(torch.tensor([[BOS_ID] + prefix[:-1]]), model.encode(src_row[None]))[0]
    log_probs = next_token_log_probs(logits, None, exact=False)
    return float(log_probs[torch.arange(len(prefix)), torch.tensor(prefix)].sum())


@pytest.mark.parametrize("seed", range(3))
def test_a_prefix_of_the_greedy_output_gives_that_output_again(seed):
    model = lively_model(seed)
    src = random_source(4, 8, lengths=[8, 3, 6, 5])
    unconstrained = greedy_search(model, src, SearchSettings(**SHORT))
    tested = 0
    for row in range(src.shape[0]):
        source = unpadded(src, row)[None]
        (best,) = unconstrained[row]
        for k in range(1, len(best.tokens) + 1):
            (found,) = greedy_search(model, source, SearchSettings(**SHORT), prefix=torch.tensor([best.tokens[:k]]))[0]
            assert found.tokens == best.tokens
            # The prefix's own tokens are not scored: the rest of the log-probability is.
            rest = best.log_prob - _prefix_log_prob(model, source[0], best.tokens[:k])
            assert found.log_prob == pytest.approx(rest, abs=1e-4)
            tested += 1
    assert tested >= 4


@pytest.mark.parametrize("seed", range(2))
@pytest.mark.parametrize("beam_size,alpha", [(2, 0.0), (3, 0.6), (5, 1.0)])
def test_beam_search_from_a_prefix_equals_the_reference_search(seed, beam_size, alpha):
    model = lively_model(seed)
    src = random_source(4, 8, lengths=[8, 3, 6, 5])
    prefix = [11, 23]
    batched = beam_search(
        model,
        src,
        SearchSettings(beam_size, n_best=beam_size, length_penalty=alpha, **SHORT),
        prefix=_prefix(4, prefix),
    )
    for row in range(src.shape[0]):
        reference = reference_beam_search(model, unpadded(src, row), beam_size, alpha, 1.0, 6, beam_size, tuple(prefix))
        assert [h.tokens for h in batched[row]] == [h.tokens for h in reference]
        for ours, theirs in zip(batched[row], reference):
            assert ours.score == pytest.approx(theirs.score, abs=1e-4)
            assert ours.log_prob == pytest.approx(theirs.log_prob, abs=1e-4)


@pytest.mark.parametrize("seed", range(3))
def test_a_beam_of_one_from_a_prefix_is_greedy_decoding_from_it(seed):
    model = lively_model(seed)
    src = random_source(4, 8, lengths=[8, 3, 6, 5])
    prefix = _prefix(4, [9, 30, 12])
    beam = beam_search(model, src, SearchSettings(1, length_penalty=0.6, **SHORT), prefix=prefix)
    greedy = greedy_search(model, src, SearchSettings(length_penalty=0.6, **SHORT), prefix=prefix)
    for (b,), (g,) in zip(beam, greedy):
        assert b.tokens == g.tokens
        assert b.log_prob == pytest.approx(g.log_prob, abs=1e-4) and b.score == pytest.approx(g.score, abs=1e-4)


def test_the_cache_primed_in_one_call_equals_the_cache_built_token_by_token():
    model = small_model()
    src = random_source(3, 7, lengths=[7, 4, 6])
    encoded = model.encode(src)
    history = torch.cat([torch.full((3, 1), BOS_ID), torch.randint(4, 50, (3, 5))], dim=1)
    at_once, one_by_one = model.new_cache(), model.new_cache()
    with torch.inference_mode():
        primed_logits = model.decode(history, encoded, at_once)[:, -1]
        for position in range(history.shape[1]):
            stepped_logits = model.decode(history[:, position : position + 1], encoded, one_by_one)[:, -1]
        torch.testing.assert_close(primed_logits, stepped_logits, atol=1e-5, rtol=0)
        assert at_once.steps == one_by_one.steps == 6
        for primed, stepped in zip(at_once.layers, one_by_one.layers):
            assert primed.self_keys_values().shape[1] == 6
            torch.testing.assert_close(primed.self_keys_values(), stepped.self_keys_values(), atol=1e-5, rtol=0)
            torch.testing.assert_close(primed.cross_keys, stepped.cross_keys, atol=1e-5, rtol=0)
            torch.testing.assert_close(primed.cross_values, stepped.cross_values, atol=1e-5, rtol=0)
        # and the next step goes on alike from either
        step = torch.tensor([[5], [6], [7]])
        torch.testing.assert_close(
            model.decode(step, encoded, at_once), model.decode(step, encoded, one_by_one), atol=1e-5, rtol=0
        )


@pytest.mark.parametrize("search", ["greedy", "beam"])
def test_the_search_primes_the_cache_in_one_decoder_call(search, monkeypatch):
    model = lively_model(0)
    widths = []
    decode = model.decode
    monkeypatch.setattr(
        model,
        "decode",
        lambda tgt_in, *args, **kwargs: widths.append(tgt_in.shape[1]) or decode(tgt_in, *args, **kwargs),
    )
    src = random_source(2, 6)
    prefix = _prefix(2, [8, 9, 10, 11])
    if search == "greedy":
        greedy_search(model, src, SearchSettings(**SHORT), prefix=prefix)
    else:
        beam_search(model, src, SearchSettings(3, length_penalty=0.6, **SHORT), prefix=prefix)
    assert widths[0] == 5 and len(widths) > 1 and set(widths[1:]) == {1}  # BOS + 4 prefix tokens, then one at a time


@pytest.mark.parametrize("search", ["greedy", "beam"])
def test_the_length_limit_counts_the_prefix(search):
    model = lively_model(1)
    src = random_source(3, 6, lengths=[6, 4, 5])

    def decode(prefix, **limits):
        prefix = _prefix(3, prefix)
        if search == "greedy":
            return greedy_search(model, src, SearchSettings(**limits), prefix=prefix)
        return beam_search(model, src, SearchSettings(3, n_best=3, length_penalty=0.6, **limits), prefix=prefix)

    outputs = [h.tokens for hypotheses in decode([7, 8, 9], max_len_a=0.0, max_len_b=5) for h in hypotheses]
    assert all(len(tokens) <= 5 for tokens in outputs) and any(len(tokens) == 5 for tokens in outputs)
    # A prefix that reaches or passes the limit is the whole output: an EOS is forced right after it.
    for prefix in ([7, 8, 9, 10, 11], [7, 8, 9, 10, 11, 12, 13]):
        for hypotheses in decode(prefix, max_len_a=0.0, max_len_b=5):
            assert [h.tokens for h in hypotheses] == [prefix]
    # Learned positions: the prefix and the searched tokens together stay within them.
    model = lively_model(1, positions="learned", max_positions=8)
    assert all(len(h.tokens) <= 7 for hypotheses in decode([7, 8, 9], max_len_a=3.0, max_len_b=20) for h in hypotheses)


@pytest.mark.parametrize("options", [DecodeConfig(beam_size=1, **SHORT), DecodeConfig(beam_size=3, n_best=2, **SHORT)])
def test_a_batch_with_prefixes_of_different_lengths_equals_each_sentence_alone(options):
    tokenizers = numbered_tokenizers()
    vocab = tokenizers.target.vocab_size
    model = lively_model(2, src_vocab_size=vocab, tgt_vocab_size=vocab)
    search = engine_of(model, tokenizers).searcher(options)
    sources = [torch.randint(4, 50, (n,)).tolist() for n in (7, 2, 5, 9, 4)]
    prefixes = [[12, 13], [], [20], [12, 13, 14], [25, 26]]
    together = search([Part(tuple(source), tuple(prefix)) for source, prefix in zip(sources, prefixes)])
    for row, (source, prefix) in enumerate(zip(sources, prefixes)):
        (alone,) = search([Part(tuple(source), tuple(prefix))])
        assert [h.tokens for h in together[row]] == [h.tokens for h in alone]
        assert all(h.tokens[: len(prefix)] == prefix for h in alone)
        for ours, theirs in zip(together[row], alone):
            assert ours.score == pytest.approx(theirs.score, abs=1e-4)
    # no prefix at all: the batch as it always was
    unforced = search([Part(tuple(source), ()) for source in sources])
    settings = SearchSettings.of(options, output_constraints(tokenizers.target, options))
    src = padded_sources(sources)
    plain = greedy_search(model, src, settings) if options.beam_size == 1 else beam_search(model, src, settings)
    assert [[h.tokens for h in hs] for hs in unforced] == [[h.tokens for h in hs] for hs in plain]
