"""Lexically constrained beam search (dynamic beam allocation): every output holds its terms, and
the batched search over the cache equals a plain reference search."""

import pytest
from support.models import lively_model, random_source, unpadded
from support.reference_search import _holds, reference_constrained_search

from attn_cli.decoding.beam import beam_search
from attn_cli.decoding.constrained import TermTracker, constrained_beam_search
from attn_cli.decoding.search import SearchSettings

SHORT = dict(max_len_a=1.0, max_len_b=6)

# Per sentence of a batch of four: terms, each a tuple of alternatives (token ids 4..49).
TERMS = [
    [((7, 8),)],  # one two-token term
    [((11,),), ((20, 21, 22),)],  # two terms
    [((30, 31), (40,))],  # one term with two alternatives
    [],  # no term: a plain beam search
]


def _meets(tokens, terms):
    return all(any(_holds(tokens, alternative) for alternative in term) for term in terms)


def _same(batched, reference):
    assert [h.tokens for h in batched] == [h.tokens for h in reference]
    for ours, theirs in zip(batched, reference):
        assert ours.score == pytest.approx(theirs.score, abs=1e-4)


@pytest.mark.parametrize("seed", range(3))
@pytest.mark.parametrize("beam_size,alpha", [(2, 0.0), (4, 0.6), (6, 1.0)])
def test_constrained_search_equals_the_reference_search(seed, beam_size, alpha, device):
    model = lively_model(seed).to(device)
    src = random_source(4, 8, lengths=[8, 4, 6, 5]).to(device)
    batched = constrained_beam_search(
        model, src, TERMS, SearchSettings(beam_size, n_best=beam_size, length_penalty=alpha, **SHORT)
    )
    for row in range(src.shape[0]):
        reference = reference_constrained_search(
            model, unpadded(src, row), TERMS[row], beam_size, alpha, 1.0, 6, beam_size
        )
        _same(batched[row], reference)


@pytest.mark.parametrize("seed", range(3))
def test_every_output_holds_every_term_of_its_sentence(seed):
    model = lively_model(seed)
    src = random_source(4, 8, lengths=[8, 4, 6, 5])
    plain = beam_search(model, src, SearchSettings(4, n_best=4, length_penalty=0.6, **SHORT))
    constrained = constrained_beam_search(model, src, TERMS, SearchSettings(4, n_best=4, length_penalty=0.6, **SHORT))
    for terms, unconstrained, outputs in zip(TERMS, plain, constrained):
        assert len(outputs) == 4
        assert all(_meets(h.tokens, terms) for h in outputs)
        if terms:  # the terms were not there by chance
            assert not all(_meets(h.tokens, terms) for h in unconstrained)


@pytest.mark.parametrize("seed", range(3))
def test_without_terms_the_search_is_the_plain_beam_search(seed):
    model = lively_model(seed)
    src = random_source(4, 8, lengths=[8, 4, 6, 5])
    plain = beam_search(model, src, SearchSettings(3, n_best=3, length_penalty=0.6, **SHORT))
    for constrained, unconstrained in zip(
        constrained_beam_search(model, src, [[]] * 4, SearchSettings(3, n_best=3, length_penalty=0.6, **SHORT)), plain
    ):
        _same(constrained, unconstrained)
    # A sentence without terms beside sentences with them is searched as if alone.
    mixed = constrained_beam_search(model, src, TERMS, SearchSettings(3, n_best=3, length_penalty=0.6, **SHORT))
    _same(mixed[3], plain[3])


def test_any_one_alternative_meets_a_term():
    model = lively_model(1)
    src = random_source(3, 6, lengths=[6, 6, 6])
    alternatives = ((30, 31), (40,))
    both = constrained_beam_search(
        model, src, [[alternatives]] * 3, SearchSettings(3, n_best=3, length_penalty=0.6, **SHORT)
    )
    first = constrained_beam_search(
        model, src, [[alternatives[:1]]] * 3, SearchSettings(3, n_best=3, length_penalty=0.6, **SHORT)
    )
    second = constrained_beam_search(
        model, src, [[alternatives[1:]]] * 3, SearchSettings(3, n_best=3, length_penalty=0.6, **SHORT)
    )
    for outputs, only_first, only_second in zip(both, first, second):
        assert all(_holds(h.tokens, alternatives[0]) or _holds(h.tokens, alternatives[1]) for h in outputs)
        # The search free to choose finds at least as good an output as either one forced.
        assert outputs[0].score >= max(only_first[0].score, only_second[0].score) - 1e-5


def test_a_prefix_counts_toward_the_terms():
    model = lively_model(2)
    src = random_source(2, 6, lengths=[6, 5])
    prefix = random_source(2, 2)[:, :1].clone()
    prefix[:] = 11
    terms = [[((11,),)], [((11,),), ((7, 8),)]]
    found = constrained_beam_search(
        model, src, terms, SearchSettings(3, n_best=3, length_penalty=0.6, **SHORT), prefix=prefix
    )
    for row, outputs in enumerate(found):
        reference = reference_constrained_search(model, unpadded(src, row), terms[row], 3, 0.6, 1.0, 6, 3, (11,))
        _same(outputs, reference)
        assert all(h.tokens[0] == 11 and _meets(h.tokens, terms[row]) for h in outputs)
    # The first sentence's one term is met by the prefix: its search is the plain one.
    _same(
        found[0],
        beam_search(model, src[:1], SearchSettings(3, n_best=3, length_penalty=0.6, **SHORT), prefix=prefix[:1])[0],
    )


def test_terms_that_cannot_fit_leave_the_sentence_unconstrained():
    model = lively_model(0)
    src = random_source(1, 3, lengths=[3])  # a limit of 2 * 1.0 + 1 = 3 tokens
    too_long = [[((5, 6, 7, 8),)]]
    found = constrained_beam_search(
        model, src, too_long, SearchSettings(3, n_best=1, length_penalty=0.6, max_len_a=1.0, max_len_b=1)
    )
    plain = beam_search(model, src, SearchSettings(3, n_best=1, length_penalty=0.6, max_len_a=1.0, max_len_b=1))
    _same(found[0], plain[0])


def test_the_tracker_follows_overlapping_starts():
    tracker = TermTracker([((5, 5, 6),)])
    state = tracker.start([5, 5, 5])  # 5 5 5 then 6: the last two 5s start the term
    assert not tracker.complete(state) and tracker.needed(state) == 1
    assert tracker.complete(tracker.advance(state, 6))
    assert tracker.needed(tracker.advance(state, 7)) == 3  # broken off: the whole term again


def test_two_terms_begun_by_one_token_need_room_for_both():
    """After 5, the terms 5 6 and 5 7 need three more tokens (6 5 7), not two."""
    tracker = TermTracker([((5, 6),), ((5, 7),)])
    assert tracker.needed(tracker.start([5])) == 3
    model = lively_model(0)
    src = random_source(1, 3, lengths=[3])  # a limit of 2 * 1.0 + 2 = 4 tokens, 3 after the prefix
    prefix = src.new_full((1, 1), 5)
    terms = [[((5, 6),), ((5, 7),)]]
    limits = dict(max_len_a=1.0, max_len_b=2)
    found = constrained_beam_search(
        model, src, terms, SearchSettings(3, n_best=3, length_penalty=0.6, **limits), prefix=prefix
    )
    assert found[0] and all(_meets(h.tokens, terms[0]) for h in found[0])
    _same(found[0], reference_constrained_search(model, unpadded(src, 0), terms[0], 3, 0.6, 1.0, 2, 3, (5,)))
    # One token less: both cannot fit, and the longer-or-later one is left out; the other is met.
    tight = constrained_beam_search(
        model, src, terms, SearchSettings(3, n_best=3, length_penalty=0.6, max_len_a=1.0, max_len_b=1), prefix=prefix
    )
    assert tight[0] and all(_holds(h.tokens, (5, 6)) for h in tight[0])
    _same(tight[0], reference_constrained_search(model, unpadded(src, 0), terms[0], 3, 0.6, 1.0, 1, 3, (5,)))


@pytest.mark.parametrize("seed", range(3))
def test_no_word_continuation_follows_a_term(seed):
    model = lively_model(seed)
    src = random_source(4, 8, lengths=[8, 4, 6, 5])
    glued = frozenset(range(25, 50))  # as if these pieces glued onto the word before them
    continuations = [glued, frozenset(), glued, frozenset()]  # rows into a spaced and an unspaced language
    found = constrained_beam_search(
        model, src, TERMS, SearchSettings(4, n_best=4, length_penalty=0.6, **SHORT), word_continuations=continuations
    )
    for row, outputs in enumerate(found):
        reference = reference_constrained_search(
            model, unpadded(src, row), TERMS[row], 4, 0.6, 1.0, 6, 4, word_continuations=continuations[row]
        )
        _same(outputs, reference)
        for h in outputs:
            assert _meets(h.tokens, TERMS[row])
            for term in TERMS[row]:  # where the term was first met, the next token begins a word
                met_at = min(
                    i + len(a) for a in term for i in range(len(h.tokens)) if tuple(h.tokens[i : i + len(a)]) == a
                )
                assert met_at == len(h.tokens) or h.tokens[met_at] not in continuations[row]
