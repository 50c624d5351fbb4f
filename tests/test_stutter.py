"""decode.no_stutter: no unit of 1 to 4 characters three times in a row, found on the text, not the tokens."""

import itertools
import random

import pytest
import torch
from support.models import lively_model, random_source, small_model
from support.runs import hello_tokenizers

from attn_cli.decoding.beam import beam_search
from attn_cli.decoding.greedy import greedy_search
from attn_cli.decoding.search import SearchSettings
from attn_cli.decoding.stutter import NoStutter, has_new_stutter, stutters
from attn_cli.vocab import BOS_ID

# A vocabulary of 50 (the test models'): 4 special ids, then texts cut from a few characters so that
# the same text can be written with different tokens (过 · 过 · 过去), and a few pieces without text
# (byte pieces, <unk>) at ids 46-49.
ALPHABET = ["a", "b", "过", "1", " "]
LONGER = ["aaa", "abab", "bab", "a1a", "11111", "过 过", "babab", "1a1a1a", "b过b过", "过1过1过", "ba  ", "过过过过"]
TEXTS = (
    [None] * 4
    + ["".join(chars) for n in (1, 2) for chars in itertools.product(ALPHABET, repeat=n)]
    + LONGER
    + [None] * 4
)
CONSTRAINT = NoStutter(TEXTS)


def text_of(tokens: list[int]) -> str:
    """The output's text as `NoStutter` sees it: a piece without text is a character never repeated."""
    return "".join(TEXTS[t] if TEXTS[t] else chr(0xE000 + i) for i, t in enumerate(tokens))


def banned(tokens: list[int]) -> set[int]:
    log_probs = CONSTRAINT.restrict(torch.zeros(1, len(TEXTS)), torch.tensor([[BOS_ID, *tokens]]), None)
    return set(torch.isinf(log_probs[0]).nonzero().flatten().tolist())


def reference_banned(tokens: list[int]) -> set[int]:
    """Every token whose text, appended, would complete a stutter: the whole vocabulary tried."""
    text = text_of(tokens)
    return {t for t, piece in enumerate(TEXTS) if piece and has_new_stutter(text + piece, len(text))}


def test_the_definition():
    assert has_new_stutter("叔叔叔", 2) and has_new_stutter("一座一座一座", 5) and has_new_stutter("ab ab ab ", 8)
    assert not has_new_stutter("叔叔叔", 3), "the stutter was already there"
    assert not has_new_stutter("10000", 4) and not has_new_stutter("a   b", 4), "digits and spaces may repeat"
    assert not has_new_stutter("abcdeabcdeabcde", 14), "a unit of five characters is not one"


def test_the_banned_tokens_are_those_the_whole_vocabulary_says():
    stuttering = {text for text in TEXTS if text and has_new_stutter(text, 0)}
    assert stuttering == {"aaa", "1a1a1a", "过过过过"}, "a token may stutter on its own: never allowed"
    assert {TEXTS[t] for t in banned([TEXTS.index("过")] * 2)} == {t for t in TEXTS if t and t[0] == "过"} | stuttering
    # 1111 is a number; 11过1过1过 is 1过 three times, begun by the output's last character.
    assert {TEXTS[t] for t in banned([TEXTS.index("1")] * 2)} == stuttering | {"过1过1过"}
    rng = random.Random(0)
    checked = 0
    for _ in range(600):
        few = rng.sample(range(4, len(TEXTS)), 3)  # histories from a few tokens, which repeat
        tokens = [rng.choice(few) for _ in range(rng.randint(0, 12))]
        assert banned(tokens) == reference_banned(tokens), text_of(tokens)
        checked += bool(banned(tokens))
    assert checked > 100, "most histories ban something"


@pytest.mark.parametrize("beam", [1, 4])
def test_no_output_stutters_and_outputs_without_stutter_are_unchanged(beam):
    torch.manual_seed(0)
    bitten = 0
    for model in (small_model(), lively_model(3), lively_model(4)):  # the untrained one repeats itself
        src = random_source(6, 9, lengths=[9, 3, 5, 7, 8, 4])
        search = (
            (lambda **kw: greedy_search(model, src, SearchSettings(max_len_a=1.5, max_len_b=8, **kw)))
            if beam == 1
            else (
                lambda **kw: beam_search(
                    model, src, SearchSettings(beam, length_penalty=0.6, max_len_a=1.5, max_len_b=8, **kw)
                )
            )
        )
        for unconstrained, constrained in zip(search(), search(constraints=(CONSTRAINT,))):
            text = text_of(constrained[0].tokens)
            assert not stutters(text) and not has_new_stutter(text, 0), text
            if has_new_stutter(text_of(unconstrained[0].tokens), 0):
                bitten += 1
            elif beam == 1:  # greedy: the constraint never bit, so every choice was the same
                assert constrained[0].tokens == unconstrained[0].tokens
    assert bitten, "some unconstrained output stuttered, so the constraint was tried"


def test_a_forced_prefix_counts_as_output():
    guo = TEXTS.index("过")
    model = lively_model(5)
    model.position_bias[:, guo] += 20.0  # left alone, it writes 过 after 过过
    src = random_source(2, 6)
    prefix = torch.tensor([[guo, guo], [guo, guo]])
    free = greedy_search(model, src, prefix=prefix)
    kept = greedy_search(model, src, SearchSettings(constraints=(CONSTRAINT,)), prefix=prefix)
    for unconstrained, constrained in zip(free, kept):
        assert unconstrained[0].tokens[:3] == [guo] * 3
        assert constrained[0].tokens[:2] == [guo, guo] and not has_new_stutter(text_of(constrained[0].tokens), 0)


def test_the_tokenizer_s_texts():
    tokenizers = hello_tokenizers()
    target = tokenizers.target
    texts = target.piece_texts()
    assert texts[:4] == [None] * 4, "padding, <unk>, BOS and EOS write nothing"
    assert texts[target.piece_to_id("<0xE4>")] is None
    for token, text in enumerate(texts):
        if text:  # what the piece writes, but for the space the start of an output drops
            assert target.decode([[token]])[0] == text.lstrip(" "), text
    ni = target.piece_to_id("你")
    assert texts[ni] == "你"
    log_probs = NoStutter.for_tokenizer(target).restrict(
        torch.zeros(1, target.vocab_size), torch.tensor([[BOS_ID, ni, ni]]), None
    )
    assert torch.isinf(log_probs[0, ni])


def test_a_tokenizer_s_output_constraints_are_built_once_and_follow_the_option():
    """A server searches once per batch of requests: the vocabulary is indexed once, not each time."""
    from attn_cli.config import DecodeConfig
    from attn_cli.decoding.loops import NoLoop
    from attn_cli.decoding.search import output_constraints
    from attn_cli.decoding.utf8 import Utf8Constraint

    target = hello_tokenizers().target
    first = output_constraints(target, DecodeConfig(no_stutter=True))
    assert [type(c) for c in first] == [Utf8Constraint, NoStutter, NoLoop]
    assert all(a is b for a, b in zip(first, output_constraints(target, DecodeConfig(no_stutter=True))))
    neither = DecodeConfig(no_stutter=False, no_loops=False)
    assert [type(c) for c in output_constraints(target, neither)] == [Utf8Constraint]
