"""decode.split_clauses: a source longer than the training sources, translated clause by clause."""

import dataclasses

import numpy as np
import pytest
from support.decoding import engine_of, sources_of
from support.models import lively_model

from attn_cli.config import DecodeConfig
from attn_cli.data.lengths import LengthModel
from attn_cli.decoding.parts import SHORTEST_CLAUSE, clauses, split_sources
from attn_cli.decoding.pipeline import translate

WORDS = "the man you see over there , is my dear old uncle and he has lived in this city for years".split()


def _cut(words: list[str], longest: int, language: str = "en") -> list[list[str]]:
    pieces = ["▁" + word if word != "," else "," for word in words]
    return [[words[i] for i in part] for part in clauses(list(range(len(words))), longest, pieces, language)]


def test_a_long_source_is_cut_at_the_boundary_nearest_its_middle_until_each_part_fits():
    parts = _cut(WORDS, 10)
    assert [word for part in parts for word in part] == WORDS, "nothing lost, nothing reordered"
    assert parts[0][-1] == ",", "a punctuation mark comes first"
    assert parts[1][0] == "is" and parts[2][0] == "and", "then, in a part with none, a conjunction"
    assert all(len(part) >= SHORTEST_CLAUSE for part in parts)
    assert _cut(WORDS, len(WORDS)) == [WORDS], "a source that fits stays whole"
    assert _cut(WORDS, 10, language="xx")[1:] == [WORDS[7:]], (
        "a language without listed conjunctions: punctuation alone"
    )
    no_boundary = [word for word in WORDS if word not in (",", "and")]
    assert _cut(no_boundary, 5) == [no_boundary]


@pytest.fixture(scope="module")
def tokenizers(trained_run):
    from attn_cli.checkpoint import find_checkpoint, load_checkpoint

    return load_checkpoint(find_checkpoint(trained_run, None)).tokenizers


def _engine(tokenizers, longest_source: int):
    vocab = dict(src_vocab_size=tokenizers.source.vocab_size, tgt_vocab_size=tokenizers.target.vocab_size)
    engine = engine_of(lively_model(0, **vocab), tokenizers)
    sources = np.full(1000, longest_source)
    engine.lengths = LengthModel.fit(sources, sources)
    return engine


def test_with_split_clauses_a_source_longer_than_the_training_sources_is_translated_in_clauses(tokenizers):
    engine = _engine(tokenizers, longest_source=6)
    text = "I am here, you are over there, and he is nowhere at all"
    whole = split_sources(engine, sources_of([text]), DecodeConfig(split_clauses=False))[0]
    split = split_sources(engine, sources_of([text]), DecodeConfig(split_clauses=True))[0]
    assert len(whole.parts) == 1 and len(split.parts) == 3
    assert [id for part in split.parts for id in part.ids] == list(whole.parts[0].ids)
    assert [(note.kind, note.warning) for note in split.notes] == [("clauses", False)]
    # each clause is translated as the source it is, and the outputs joined
    options = DecodeConfig(beam_size=2, split_clauses=True, learned_lengths=False)
    (joined,) = translate(engine, sources_of([text]), options)
    texts = engine.tokenizers.source.decode([list(part.ids) for part in split.parts])
    assert engine.tokenizers.source.encode(texts) == [list(part.ids) for part in split.parts]
    alone = translate(engine, sources_of(texts), dataclasses.replace(options, split_clauses=False))
    assert joined.text == "".join(t.text for t in alone)
    # short sources, and an engine that does not know its training lengths, are left whole
    assert (
        len(split_sources(_engine(tokenizers, 40), sources_of([text]), DecodeConfig(split_clauses=True))[0].parts) == 1
    )
    unknown = _engine(tokenizers, 6)
    unknown.lengths = None
    assert len(split_sources(unknown, sources_of([text]), DecodeConfig(split_clauses=True))[0].parts) == 1
