"""The guard against degenerate outputs: no loop (decode.no_loops) and outputs within the lengths the
training pairs make plausible (decode.learned_lengths, data/lengths.py)."""

import random

import numpy as np
import pytest
import torch
from support.models import lively_model, random_source

from attn_cli.data.lengths import LengthModel
from attn_cli.decoding.beam import beam_search
from attn_cli.decoding.greedy import greedy_search
from attn_cli.decoding.loops import LONGEST_SPAN, SHORTEST_LOOP, LoopVocabulary, NoLoop, loops, token_loop
from attn_cli.decoding.search import SearchSettings, output_bounds
from attn_cli.vocab import BOS_ID, EOS_ID

# A vocabulary of 50 (the test models'): 4 special ids, digits at 4-5, texts of 1 to 3 characters
# from 6 on (6, 7 and 8 one character each), and a byte piece without text at 49.
TEXTS = [None] * 4 + ["1", "2"] + ["x", "y", "z"] + ["ab"[: 1 + i % 2] + chr(ord("c") + i) for i in range(40)] + [None]
RULE = NoLoop(TEXTS)


def loops_in_tokens(tokens: list[int]) -> bool:
    """The plain definition: some span of 1..LONGEST_SPAN tokens, not digits alone, of 3 characters
    or more, ends the output three times back to back."""
    for span in range(1, LONGEST_SPAN + 1):
        if len(tokens) >= 3 * span:
            unit = tokens[-span:]
            written = sum(len(TEXTS[t]) if TEXTS[t] else 1 for t in unit)
            repeatable = all(TEXTS[t] and TEXTS[t].isdigit() for t in unit)
            if tokens[-3 * span :] == unit * 3 and not repeatable and written >= SHORTEST_LOOP:
                return True
    return False


def test_no_loop_rules_out_exactly_the_tokens_that_would_complete_a_third_copy():
    generator = random.Random(0)
    histories = []
    for _ in range(300):
        unit = [generator.choice([4, 5, 6, 7, 8, 9, 10, 49]) for _ in range(generator.randint(1, 6))]
        tail = unit * generator.randint(1, 3)
        tail = tail[: len(tail) - generator.randint(0, len(unit))]  # a copy cut anywhere
        histories.append([generator.randint(4, 49) for _ in range(generator.randint(0, 4))] + tail)
    found = 0
    for tokens in histories:
        log_probs = RULE.restrict(torch.zeros(1, len(TEXTS)), torch.tensor([[BOS_ID, *tokens]]), None)
        banned = set(torch.isinf(log_probs[0]).nonzero().flatten().tolist())
        expected = {t for t in range(4, len(TEXTS)) if loops_in_tokens([*tokens, t])}
        assert banned == expected, tokens
        assert token_loop([*tokens, *expected][: len(tokens) + 1], LoopVocabulary.of(TEXTS)) == bool(expected)
        found += bool(expected)
    assert found > 30, "the histories held many loops about to close"
    assert not banned_after([6, 6]) and banned_after([6, 7, 8] * 2 + [6, 7]) == {8}, "哈哈哈 is stutter's to judge"


def banned_after(tokens: list[int]) -> set[int]:
    log_probs = RULE.restrict(torch.zeros(1, len(TEXTS)), torch.tensor([[BOS_ID, *tokens]]), None)
    return set(torch.isinf(log_probs[0]).nonzero().flatten().tolist())


def test_loops_are_spans_of_three_characters_or_more_three_times_back_to_back():
    assert loops("但是她就说她就说她就说她不说")
    assert loops("图书馆和图书馆和图书馆和")
    assert not loops("她就说她就说")  # twice is not a loop
    assert not loops("哈哈哈哈")  # a unit of one character is stutter (decoding/stutter.py)
    assert not loops("100010001000")  # digits repeat as a matter of course
    assert loops("very very very good")


def _looping_model(seed: int = 0):
    """A random model drawn to a cycle of three tokens: left alone, it writes xyzxyzxyz..."""
    model = lively_model(seed)
    for position in range(64):
        model.position_bias[position, 6 + position % 3] += 20.0
    return model


def test_the_guard_keeps_a_looping_model_out_of_loops_in_every_search():
    model, src = _looping_model(), random_source(4, 7)
    free = SearchSettings(max_len_a=2.0, max_len_b=10)
    guarded = SearchSettings(max_len_a=2.0, max_len_b=10, constraints=(RULE,))
    left_alone = [h.tokens for hs in greedy_search(model, src, free) for h in hs]
    assert all(_any_loop(tokens) for tokens in left_alone), "left alone, the model loops"
    for results in (
        greedy_search(model, src, guarded),
        beam_search(model, src, SearchSettings(3, n_best=3, max_len_a=2.0, max_len_b=10, constraints=(RULE,))),
    ):
        for hypotheses in results:
            for hypothesis in hypotheses:
                assert not _any_loop(hypothesis.tokens), hypothesis.tokens


def _any_loop(tokens: list[int]) -> bool:
    return any(loops_in_tokens(tokens[:end]) for end in range(1, len(tokens) + 1))


def test_the_guard_leaves_an_output_without_a_loop_unchanged():
    sound = []
    for seed in range(1, 5):
        model, src = lively_model(seed), random_source(6, 8)
        free = greedy_search(model, src, SearchSettings(max_len_a=2.0, max_len_b=10))
        guarded = greedy_search(model, src, SearchSettings(max_len_a=2.0, max_len_b=10, constraints=(RULE,)))
        sound += [(a[0], b[0]) for a, b in zip(free, guarded) if not _any_loop(a[0].tokens)]
    assert len(sound) >= 3, "some outputs of the random models have no loop"
    for alone, kept in sound:
        assert kept.tokens == alone.tokens and kept.score == pytest.approx(alone.score)


def _length_model(ratio: float = 2.0, pairs: int = 4000) -> LengthModel:
    generator = np.random.default_rng(0)
    sources = generator.integers(1, 12, pairs)
    targets = np.maximum(0, np.round(sources * ratio + generator.normal(0, 1, pairs))).astype(int)
    return LengthModel.fit(sources, targets)


def test_a_length_model_bounds_each_source_length_around_the_ratio_it_was_fitted_on():
    model = _length_model(ratio=2.0)
    lengths = np.arange(1, 40)
    shortest, longest = model.bounds(lengths)
    assert (shortest <= 2 * lengths).all() and (2 * lengths <= longest).all()
    assert (longest < 1.5 * lengths + 10)[:5].all(), "tighter than the fixed limit on short sources"
    assert (shortest[6:11] > 0).all(), "a floor where the pairs have one"
    assert longest[-1] > longest[10], "sources longer than any counted take the longest ones' ratios"
    assert LengthModel.from_counts(model.counts).counts.tolist() == model.counts.tolist()
    assert LengthModel.from_counts(None) is None


@pytest.mark.parametrize("beam", [1, 3])
@pytest.mark.parametrize("ending", ["early", "late"])
def test_learned_lengths_keep_every_output_between_its_floor_and_its_limit(beam, ending):
    model, src = lively_model(4), random_source(6, 10, lengths=[6, 8, 9, 10, 11, 7])
    if ending == "early":
        model.position_bias[:, EOS_ID] += 12.0  # left alone, it ends at once
    settings = SearchSettings(beam, n_best=beam, max_len_a=3.0, max_len_b=10, lengths=_length_model(ratio=1.5))
    floors, limits = output_bounds(None, src, settings)
    assert (floors > 0).all() and (limits < 3 * 10 + 10).all()
    search = greedy_search if beam == 1 else beam_search
    free = search(model, src, SearchSettings(beam, n_best=beam, max_len_a=3.0, max_len_b=10))
    free_lengths = [(len(h.tokens), floor, limit) for hs, floor, limit in zip(free, floors, limits) for h in hs]
    if ending == "early":  # left alone, every output is shorter than its floor
        assert all(length < floor for length, floor, _ in free_lengths)
    else:  # and here some run past their limit
        assert any(length > limit for length, _, limit in free_lengths)
    for hypotheses, floor, limit in zip(search(model, src, settings), floors.tolist(), limits.tolist()):
        assert hypotheses
        for hypothesis in hypotheses:
            assert floor <= len(hypothesis.tokens) <= limit


def test_a_trained_run_keeps_the_lengths_of_its_training_pairs(trained_run):
    from attn_cli.checkpoint import find_checkpoint, load_checkpoint
    from attn_cli.data.prepared import TokenizedPairs
    from attn_cli.paths import RunPaths

    (entry,) = [path for path in RunPaths.of(trained_run).prepared_dir.iterdir() if path.is_dir()]
    pairs = TokenizedPairs.open(entry)
    kept = load_checkpoint(find_checkpoint(trained_run, None)).lengths
    assert kept.counts.sum() == len(pairs) > 0
    assert kept.counts.tolist() == LengthModel.fit(pairs.src_lengths, pairs.tgt_lengths).counts.tolist()
