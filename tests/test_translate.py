"""The translation pipeline and the decode options of `attn translate`: fitting long inputs,
batching and putting results back in order, n-best lists, and flags over the checkpoint's config.

The tokenizers are the tiny trained run's (the session fixture `trained_run`, tests/conftest.py). The model is a
"lively" random one of the same vocabulary: the trained tiny model translates every input to the
same empty line, which would let a mixed-up order pass.
"""

import dataclasses
import io
import os
import random
from pathlib import Path

import pytest
import torch
from support.decoding import engine_of, sources_of
from support.models import lively_model, random_source, unpadded

from attn_cli.checkpoint import load_checkpoint
from attn_cli.cli.decoding_flags import decode_options
from attn_cli.config import DecodeConfig
from attn_cli.data.batching import Example
from attn_cli.data.collate import collate
from attn_cli.decoding.beam import beam_search
from attn_cli.decoding.engine import refusals
from attn_cli.decoding.greedy import greedy_search, sampler
from attn_cli.decoding.hypothesis import Hypothesis
from attn_cli.decoding.io import stdin_batches
from attn_cli.decoding.parts import _BOUNDARY_ENDINGS, fit_to_length, split_sources
from attn_cli.decoding.pipeline import assemble, decode, translate
from attn_cli.decoding.records import Part, Source, Translation
from attn_cli.decoding.search import SearchSettings, output_constraints
from attn_cli.errors import UserError

# Lengths differ and the longest comes first, so length-sorted batches reorder them; two are empty.
SENTENCES = [
    "Where is the station? It is near the old bridge, by the river.",
    "Go.",
    "",
    "I love machine learning, and you?",
    "   ",
    "Tom is here.",
    "Hello.",
]
LONG = "Where is the station? It is near the old bridge, and the bus stops there. Thank you!"
# Short outputs: the lively model's position bias covers 64 output positions.
SHORT = dict(max_len_a=1.0, max_len_b=5)


# --- fit_to_length -------------------------------------------------------------------------------


def _fit(pieces: list[str], limit: int, mode: str = "split") -> list[list[int]]:
    """fit_to_length over ids 100.. that stand for `pieces` (so ids and positions differ)."""
    ids = [100 + i for i in range(len(pieces))]
    return fit_to_length(ids, limit, mode, lambda xs: [pieces[x - 100] for x in xs])


def _cuts(parts: list[list[int]]) -> list[int]:
    """Where each part ends, as positions into the input (ids are 100 + position)."""
    return [part[-1] - 100 + 1 for part in parts]


def _assert_valid_split(ids: list[int], parts: list[list[int]], limit: int, pieces: list[str]) -> None:
    """Parts rebuild the input, fit the limit, and each cut is the last boundary in the second half
    of its window, or the window's end when there is none."""
    assert [i for part in parts for i in part] == ids
    assert all(1 <= len(part) <= limit for part in parts)
    boundaries = {i + 1 for i, piece in enumerate(pieces) if piece.rstrip().endswith(_BOUNDARY_ENDINGS)}
    start = 0
    for part in parts[:-1]:
        cut, low = start + len(part), start + max(1, limit // 2)
        in_window = [b for b in boundaries if low <= b <= start + limit]
        assert cut == (max(in_window) if in_window else start + limit), (start, cut, in_window)
        start = cut


@pytest.mark.parametrize("mode", ["split", "truncate"])
def test_an_input_within_the_limit_is_left_alone(mode):
    pieces = ["▁a", ".", "▁b", ",", "▁c"]
    for limit in (5, 6, 100):
        assert _fit(pieces, limit, mode) == [[100, 101, 102, 103, 104]]


def test_truncate_keeps_the_first_limit_ids():
    pieces = ["▁a", ".", "▁b", ",", "▁c", "▁d", "."]
    assert _fit(pieces, 4, "truncate") == [[100, 101, 102, 103]]
    assert _fit(pieces, 1, "truncate") == [[100]]


def test_split_cuts_after_the_last_boundary_in_the_second_half_of_each_window():
    pieces = ["▁I", "▁saw", "▁it", ".", "▁Then", "▁he", "▁left", ",", "▁and", "▁she", "▁stayed", "▁home", "."]
    # Limit 10: the "." at 4 lies in the first half; the "," at 8 is the last boundary in 5..10.
    assert _cuts(_fit(pieces, 10)) == [8, 13]
    # Limit 6: window 3..6 has the "." at 4; then 7..10 has the "," at 8.
    assert _cuts(_fit(pieces, 6)) == [4, 8, 13]


def test_split_cuts_after_chinese_punctuation():
    pieces = ["我", "喜欢", "你", "，", "他", "也", "喜欢", "你", "。", "好", "的"]
    assert _cuts(_fit(pieces, 5)) == [4, 9, 11]


def test_split_cuts_at_the_limit_without_a_boundary_in_the_second_half():
    pieces = ["▁a", ".", "▁b", "▁c", "▁d", "▁e", "▁f", "▁g", "▁h", "▁i"]  # boundary at 2, before 8 // 2
    assert _cuts(_fit(pieces, 8)) == [8, 10]
    assert _cuts(_fit(["▁w"] * 7, 3)) == [3, 6, 7]


def test_split_with_a_limit_of_one_gives_single_tokens_and_ends():
    # A boundary right at a window's start once cut an empty part, forever.
    assert _fit([".", "a", "b", ".", "c"], 1) == [[100], [101], [102], [103], [104]]


@pytest.mark.parametrize("seed", range(40))
def test_split_rules_hold_on_random_inputs(seed):
    rng = random.Random(seed)
    pieces = [rng.choice(["▁a", "b", "▁c", ".", "，", "。", "?", "x,", "!", "▁y"]) for _ in range(rng.randint(1, 40))]
    limit = rng.randint(1, 12)
    ids = [100 + i for i in range(len(pieces))]
    parts = _fit(pieces, limit)
    _assert_valid_split(ids, parts, limit, pieces)


def test_split_rules_hold_with_the_real_tokenizer(tokenizers):
    ids = tokenizers.source.encode([LONG])[0]
    pieces = tokenizers.source.id_to_piece(ids)
    assert any(piece.endswith(_BOUNDARY_ENDINGS) for piece in pieces)
    for limit in (4, 7, 10, len(ids) - 1):
        parts = fit_to_length(ids, limit, "split", tokenizers.source.id_to_piece)
        assert len(parts) > 1
        _assert_valid_split(ids, parts, limit, pieces)


# --- the translation pipeline --------------------------------------------------------------------


@pytest.fixture(scope="module")
def tokenizers(trained_run):
    return load_checkpoint(trained_run / "checkpoints" / "best.pt").tokenizers


def _model(tokenizers, seed: int = 0, **overrides):
    return lively_model(
        seed, src_vocab_size=tokenizers.source.vocab_size, tgt_vocab_size=tokenizers.target.vocab_size, **overrides
    )


def _translate(model, tokenizers, sentences, options, max_source_tokens=255, target_language="zh", **given):
    """The pipeline's translations of `sentences` with attn's own engine of `model`; `given` may hold
    `prefixes` (one per sentence) and `on_batch`."""
    engine = engine_of(model, tokenizers, max_source_tokens, target_language)
    return translate(engine, sources_of(sentences, given.get("prefixes")), options, given.get("on_batch"))


@dataclasses.dataclass
class _Traced:
    """A translation with what the pipeline made of its source: the parts the model decoded (source
    ids, no EOS) and each part's hypotheses, best first."""

    translation: Translation
    parts: list[list[int]]
    outputs: list[list[Hypothesis]]


def _traced(model, tokenizers, sentences, options, max_source_tokens=255, target_language="zh", prefixes=None):
    """`_translate` stage by stage, keeping each source's parts and their outputs."""
    engine = engine_of(model, tokenizers, max_source_tokens, target_language)
    prepared = split_sources(engine, sources_of(sentences, prefixes), options)
    outputs = decode(engine, prepared, options).outputs
    traced, start = [], 0
    for source, translation in zip(prepared, assemble(engine, prepared, outputs, options)):
        found = outputs[start : start + len(source.parts)]
        traced.append(_Traced(translation, [list(part.ids) for part in source.parts], found))
        start += len(source.parts)
    assert [t.translation for t in traced] == translate(engine, sources_of(sentences, prefixes), options)
    return traced


def _texts(translation: Translation) -> list[str]:
    return [candidate.text for candidate in translation.candidates]


def _scores(translation: Translation) -> list[float]:
    return [candidate.score for candidate in translation.candidates]


def _pieces(translation: Translation) -> list[list[str]]:
    return [candidate.tokens for candidate in translation.candidates]


def _alone(model, ids: list[int], options: DecodeConfig, tokenizers):
    """The hypotheses of one source, decoded in a batch of its own by the engine's configured search,
    with the constraints the pipeline keeps (the random model writes byte pieces)."""
    return engine_of(model, tokenizers).searcher(options)([Part(tuple(ids))])[0]


@pytest.mark.parametrize("beam_size", [1, 3])
@pytest.mark.parametrize("max_tokens", [12, 8000])
def test_results_come_back_in_input_order(tokenizers, beam_size, max_tokens):
    model = _model(tokenizers)
    options = DecodeConfig(beam_size=beam_size, max_tokens=max_tokens, **SHORT)
    encoded = tokenizers.source.encode([s.strip() for s in SENTENCES])
    assert [len(ids) for ids in encoded] != sorted(len(ids) for ids in encoded)  # sorting reorders them
    progress = []
    together = _translate(
        model, tokenizers, SENTENCES, options, on_batch=lambda done, total: progress.append((done, total))
    )
    assert progress[-1] == (5, 5) and (len(progress) > 1) == (max_tokens == 12)
    assert [done for done, _ in progress] == sorted(done for done, _ in progress)
    alone = [_translate(model, tokenizers, [sentence], options)[0] for sentence in SENTENCES]
    assert [t.source.text for t in together] == SENTENCES
    for batched, single in zip(together, alone):
        assert _texts(batched) == _texts(single) and _pieces(batched) == _pieces(single)
        assert _scores(batched) == pytest.approx(_scores(single), abs=1e-4)
    texts = [t.text for t in together if t.source.text.strip()]
    assert len(set(texts)) >= 3, "outputs should differ from input to input, or a mixed-up order would pass"


def test_empty_lines_translate_to_empty_lines(tokenizers):
    model = _model(tokenizers)
    for n_best in (1, 3):
        results = _traced(model, tokenizers, ["", "Go.", "  \t "], DecodeConfig(beam_size=3, n_best=n_best, **SHORT))
        for empty in (results[0], results[2]):
            # n empty translations, so n-best output keeps n lines (or JSON entries) per input
            translation = empty.translation
            assert _texts(translation) == [""] * n_best and _scores(translation) == [0.0] * n_best
            assert _pieces(translation) == [[]] * n_best and empty.outputs == [] and translation.notes == []
        assert len(results[1].translation.candidates) == n_best and results[1].translation.text != ""


def test_a_long_input_is_split_and_each_part_translated_as_if_alone(tokenizers):
    model = _model(tokenizers)
    options = DecodeConfig(beam_size=1, **SHORT)
    ids = tokenizers.source.encode([LONG])[0]
    for target_language, joiner in (("zh", ""), ("zh-CN", ""), ("ZH_Hans", ""), ("bo", ""), ("en", " ")):
        long, short = _traced(model, tokenizers, [LONG, "Go."], options, 6, target_language)
        assert [i for part in long.parts for i in part] == ids
        assert len(long.parts) > 2 and all(len(part) <= 6 for part in long.parts)
        message = f"{len(ids)} tokens is more than the model takes; translated in {len(long.parts)} parts"
        assert [(note.kind, note.message) for note in long.translation.notes] == [("split", message)]
        best = [_alone(model, part, options, tokenizers)[0] for part in long.parts]
        assert [hypotheses[0].tokens for hypotheses in long.outputs] == [h.tokens for h in best]
        assert _texts(long.translation) == [joiner.join(tokenizers.target.decode([h.tokens for h in best]))]
        assert _pieces(long.translation) == [[p for h in best for p in tokenizers.target.id_to_piece(h.tokens)]]
        assert long.translation.candidates[0].score == pytest.approx(sum(h.score for h in best), abs=1e-4)
        assert short.translation.notes == [] and short.parts == tokenizers.source.encode(["Go."])


def test_a_long_input_is_truncated_when_the_config_says_so(tokenizers):
    model = _model(tokenizers)
    options = DecodeConfig(beam_size=3, long_inputs="truncate", **SHORT)
    ids = tokenizers.source.encode([LONG])[0]
    (result,) = _traced(model, tokenizers, [LONG], options, 6)
    assert result.parts == [ids[:6]]
    message = f"{len(ids)} tokens is more than the model takes; truncated to the first 6"
    assert [(note.kind, note.message) for note in result.translation.notes] == [("truncated", message)]
    assert _texts(result.translation) == tokenizers.target.decode(
        [_alone(model, ids[:6], options, tokenizers)[0].tokens]
    )


@pytest.mark.parametrize("long_inputs", ["split", "truncate"])
@pytest.mark.parametrize("beam_size", [1, 3])
def test_long_inputs_fit_a_model_with_learned_positions(tokenizers, long_inputs, beam_size):
    model = _model(tokenizers, positions="learned", max_positions=8)
    ids = tokenizers.source.encode([LONG])[0]
    with pytest.raises(ValueError, match="max_positions"):  # what fitting the input avoids
        greedy_search(model, collate([Example(0, ids, [])]).src)
    options = DecodeConfig(beam_size=beam_size, long_inputs=long_inputs, max_len_a=3.0, max_len_b=20)
    long, short = _traced(model, tokenizers, [LONG, "Go."], options, 7)
    notes = " ".join(note.message for note in long.translation.notes)
    assert all(len(part) <= 7 for part in long.parts) and ("parts" if long_inputs == "split" else "truncated") in notes
    # an output ends where the learned target positions do: 7 tokens and the EOS
    assert all(len(h.tokens) <= 7 for hypotheses in long.outputs + short.outputs for h in hypotheses)
    assert long.translation.text and short.translation.text


def test_n_best_gives_n_translations_best_first(tokenizers):
    model = _model(tokenizers, seed=1)
    sentences = ["I love machine learning, and you?", "Tom is here."]
    best_only = _translate(model, tokenizers, sentences, DecodeConfig(beam_size=3, **SHORT))
    three = _traced(model, tokenizers, sentences, DecodeConfig(beam_size=3, n_best=3, **SHORT))
    for one, traced in zip(best_only, three):
        result = traced.translation
        assert len(_texts(result)) == len(_scores(result)) == len(_pieces(result)) == 3
        assert _scores(result) == sorted(_scores(result), reverse=True) and len(set(_texts(result))) == 3
        hypotheses = traced.outputs[0]
        assert _texts(result) == tokenizers.target.decode([h.tokens for h in hypotheses])
        assert _pieces(result) == [tokenizers.target.id_to_piece(h.tokens) for h in hypotheses]
        assert (result.text, _scores(result)[0]) == (one.text, pytest.approx(_scores(one)[0]))


def test_samples_are_repeatable_with_a_seed_and_come_best_first(tokenizers):
    model = _model(tokenizers, seed=2)
    options = DecodeConfig(sample=True, n_best=4, beam_size=2, seed=7, **SHORT)
    first = _translate(model, tokenizers, ["Tom is here.", "Hello."], options)
    again = _translate(model, tokenizers, ["Tom is here.", "Hello."], options)
    assert [_texts(t) for t in first] == [_texts(t) for t in again]
    for result in first:
        assert len(_texts(result)) == 4 and _scores(result) == sorted(_scores(result), reverse=True)
        assert len(set(_texts(result))) > 1
    # top_k=1 leaves one token to sample: every sample is the greedy translation
    greedy = _translate(model, tokenizers, ["Tom is here."], DecodeConfig(beam_size=1, **SHORT))
    forced = _translate(model, tokenizers, ["Tom is here."], dataclasses.replace(options, top_k=1))
    assert _texts(forced[0]) == _texts(greedy[0]) * 4


@pytest.mark.parametrize("seed", range(2))
def test_the_engine_runs_the_configured_search(tokenizers, seed):
    model = _model(tokenizers, seed)
    src = random_source(4, 8, lengths=[8, 3, 6, 5])
    parts = [Part(tuple(unpadded(src, row)[:-1].tolist())) for row in range(src.shape[0])]  # no EOS
    engine = engine_of(model, tokenizers)

    def settings(options):
        return SearchSettings.of(options, output_constraints(tokenizers.target, options))

    options = DecodeConfig(beam_size=1, length_penalty=0.6, max_len_a=1.0, max_len_b=6)
    greedy = greedy_search(model, src, settings(options))
    by_options = engine.searcher(options)(parts)
    assert [[(h.tokens, h.score) for h in hs] for hs in by_options] == [
        [(h.tokens, h.score) for h in hs] for hs in greedy
    ]
    options = DecodeConfig(beam_size=3, n_best=2, length_penalty=0.6, max_len_a=1.0, max_len_b=6)
    beam = beam_search(model, src, settings(options))
    by_options = engine.searcher(options)(parts)
    assert [[h.tokens for h in hs] for hs in by_options] == [[h.tokens for h in hs] for hs in beam]
    options = DecodeConfig(sample=True, n_best=3, temperature=0.9, max_len_a=1.0, max_len_b=6, seed=3)
    samples = greedy_search(
        model, src, settings(options), choose=sampler(0.9, generator=torch.Generator().manual_seed(3))
    )
    by_options = engine.searcher(options)(parts)
    assert [sorted(h.tokens for h in hs) for hs in by_options] == [sorted(h.tokens for h in hs) for hs in samples]


# --- decode_options --------------------------------------------------------------------------------

NO_FLAGS = {
    "beam_size": None,
    "n_best": None,
    "length_penalty": None,
    "max_len_a": None,
    "max_len_b": None,
    "max_tokens": None,
    "sample": None,
    "temperature": None,
    "top_k": None,
    "top_p": None,
    "seed": None,
}


def test_a_flag_overrides_the_config_and_the_rest_stays():
    config = DecodeConfig(beam_size=5, n_best=2, length_penalty=1.0, max_tokens=300)
    options = decode_options(config, {**NO_FLAGS, "beam_size": 2, "length_penalty": 0.0})
    assert options == dataclasses.replace(config, beam_size=2, length_penalty=0.0)
    assert decode_options(config, NO_FLAGS) == config


def test_an_invalid_combination_names_the_flags_not_the_config_keys():
    with pytest.raises(UserError) as error:
        decode_options(DecodeConfig(), {**NO_FLAGS, "n_best": 4, "beam_size": 2})
    message = str(error.value)
    assert "--n-best" in message and "--beam" in message
    assert "decode" not in message and "n_best" not in message and "beam_size" not in message
    with pytest.raises(UserError, match="^--top-p: 0.0 must be in"):
        decode_options(DecodeConfig(), {**NO_FLAGS, "top_p": 0.0})
    with pytest.raises(UserError) as error:
        decode_options(DecodeConfig(), {**NO_FLAGS, "max_len_b": 0})
    assert "--max-len-b=0" in str(error.value) and "max_len" not in str(error.value)


def test_sampling_draws_n_best_samples_whatever_the_beam():
    config = DecodeConfig(beam_size=2)
    options = decode_options(config, {**NO_FLAGS, "sample": True, "n_best": 4})
    assert options.sample and options.n_best == 4
    options = decode_options(config, {**NO_FLAGS, "sample": True, "n_best": 4, "beam_size": 2})
    assert options.sample and (options.n_best, options.beam_size) == (4, 2)
    with pytest.raises(UserError, match="--n-best"):  # without --sample the beam limits it
        decode_options(config, {**NO_FLAGS, "n_best": 4})


# --- stdin -----------------------------------------------------------------------------------------


def test_stdin_lines_are_batched_as_they_arrive_from_a_real_pipe():
    read, write = os.pipe()
    os.write(write, "a\nb\n\nc\n".encode())
    os.close(write)
    with os.fdopen(read, encoding="utf-8") as stream:
        assert list(stdin_batches(stream, max_lines=3)) == [["a", "b", ""], ["c"]]
    # not a real file (as under CliRunner): one line at a time
    assert list(stdin_batches(io.StringIO("a\nb\n"))) == [["a"], ["b"]]


# --- prefixes --------------------------------------------------------------------------------------


@pytest.mark.parametrize("beam_size", [1, 3])
def test_a_prefix_begins_the_translation_of_its_input_and_forces_only_the_first_part(tokenizers, beam_size):
    model = _model(tokenizers, seed=1)
    options = DecodeConfig(beam_size=beam_size, **SHORT)
    sentences, prefixes = [LONG, "Go.", "", "Tom is here."], ["我们的", "", "你", "他"]
    forced = _traced(model, tokenizers, sentences, options, 6, prefixes=prefixes)
    free = _traced(model, tokenizers, sentences, options, 6)
    for traced, prefix in zip(forced, prefixes):
        assert traced.translation.source.prefix == prefix
    long, go, empty, tom = forced
    for traced, prefix in ((long, "我们的"), (tom, "他")):
        ids = tokenizers.target.encode([prefix])[0]
        translation = traced.translation
        assert traced.outputs[0][0].tokens[: len(ids)] == ids
        assert (
            translation.text.startswith(prefix)
            and translation.text != free[sentences.index(translation.source.text)].translation.text
        )
    assert [hs[0].tokens for hs in long.outputs[1:]] == [
        hs[0].tokens for hs in free[0].outputs[1:]
    ]  # later parts: no prefix
    assert _texts(go.translation) == _texts(free[1].translation) and _texts(empty.translation) == [""]


def test_a_prefix_the_model_cannot_output_is_a_one_line_error(tokenizers):
    model = _model(tokenizers, positions="learned", max_positions=8)
    prefix = "我们的车站在老桥旁边的河边"
    assert len(tokenizers.target.encode([prefix])[0]) > 7
    with pytest.raises(
        UserError,
        match=r"^the prefix '我们的车站在老桥旁边的河边' is \d+ target tokens, more than the 7 "
        r"the model can output; shorten it$",
    ):
        _translate(model, tokenizers, ["Go."], DecodeConfig(beam_size=1), 7, prefixes=[prefix])


def test_prefixes_and_glossaries_are_refused_by_a_search_that_takes_neither(tokenizers):
    from attn_cli.config import Config
    from attn_cli.decoding.glossary import Term
    from attn_cli.engines.ctranslate2 import CAPABILITIES, CTranslate2Engine

    options = DecodeConfig()
    # CTranslate2's search takes neither: the engine's refusals name both, and what to use instead
    refused = refusals(CAPABILITIES, options, [Source("Go.", "我"), Source("Go.", terms=(Term("go", ("走",)),))])
    assert [(refusal.option, refusal.fix) for refusal in refused] == [("prefix", "checkpoint"), ("terms", "checkpoint")]
    assert refusals(CAPABILITIES, options, [Source("Go.")]) == []
    # and its search, given them all the same, refuses them rather than leave them out
    exported = CTranslate2Engine(Config(), tokenizers, None, Path("."), None, None)
    search = exported.searcher(options)
    with pytest.raises(ValueError, match="prefix"):
        search([Part((5, 6), prefix=(7,))])
    with pytest.raises(ValueError, match="constrained search"):
        search([Part((5, 6))], [[[(7,)]]])


def test_decode_no_stutter_keeps_stutter_out_of_every_translation(tokenizers):
    from attn_cli.decoding.stutter import stutters

    model = _model(tokenizers, seed=1)
    texts = tokenizers.target.piece_texts()
    characters = [token for token, text in enumerate(texts) if text and len(text) == 1 and not text.isspace()]
    model.position_bias[:, characters[:3]] += 5.0  # drawn to three characters, it writes them over and over
    options = DecodeConfig(beam_size=2, max_len_a=2.0, max_len_b=12, no_loops=False)  # stutter alone
    free = _translate(model, tokenizers, SENTENCES * 3, options)
    kept = _translate(model, tokenizers, SENTENCES * 3, dataclasses.replace(options, no_stutter=True))
    assert any(stutters(t.text) for t in free), "left alone the random model stutters, so the option was tried"
    assert not any(stutters(t.text) for t in kept)
    assert decode_options(options, {"no_stutter": True}).no_stutter, "--no-stutter sets decode.no_stutter"
