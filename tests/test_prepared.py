"""Prepared data: tokenized once, reused while nothing it is made from changes, never half-written."""

import dataclasses
import os
from collections import Counter

import numpy as np
import pytest

from attn_cli.config import Config, CorpusConfig, DataConfig, TokenizerConfig
from attn_cli.data import prepare as prepare_module
from attn_cli.data.batching import token_batches
from attn_cli.data.collate import collate
from attn_cli.data.prepare import encode_pairs, prepare_data
from attn_cli.data.prepared import TokenizedPairsWriter, entry_name, open_prepared
from attn_cli.data.tokenizer import train_tokenizers

PAIRS = [(f"sentence number {i} " + "word " * (i % 12), f"句子{i}号" + "字" * (i % 5)) for i in range(240)]


@pytest.fixture
def setting(tmp_path):
    corpus = tmp_path / "corpus.tsv"
    corpus.write_text("".join(f"{s}\t{t}\n" for s, t in PAIRS), encoding="utf-8")
    cfg = Config(
        run_dir=str(tmp_path / "run"),
        data=DataConfig(
            corpus=CorpusConfig(path=str(corpus)),
            valid_size=20,
            test_size=20,
            max_source_tokens=22,
            max_length_ratio=6.0,
        ),
        tokenizer=TokenizerConfig(vocab_size=300, character_coverage=1.0),
    )
    tokenizers = train_tokenizers([s for s, _ in PAIRS], [t for _, t in PAIRS], cfg.tokenizer)
    return cfg, tokenizers, corpus


def _no_reading(monkeypatch):
    def refuse(*args, **kwargs):
        raise AssertionError("the corpus was read again")

    monkeypatch.setattr(prepare_module, "read_split", refuse)


@pytest.mark.parametrize("chunk", [20_000, 7])
def test_the_prepared_pairs_are_the_tokenized_and_filtered_split(setting, monkeypatch, chunk):
    cfg, tokenizers, _ = setting
    monkeypatch.setattr(prepare_module, "_ENCODE_CHUNK", chunk)  # one chunk, or many of uneven lengths
    prepared = prepare_data(cfg, tokenizers, log=lambda message: None)
    split = prepare_module.read_split(cfg, log=lambda message: None)
    train = list(split.train_pairs())
    kept = [
        e
        for e in encode_pairs(train, tokenizers)
        if 1 <= len(e.src) <= 22
        and 1 <= len(e.tgt) <= 128
        and max(len(e.src), len(e.tgt)) / min(len(e.src), len(e.tgt)) <= cfg.data.max_length_ratio
    ]
    assert 0 < len(prepared.train) == len(kept) < len(train) == split.train_count
    assert [(e.src, e.tgt) for e in prepared.train] == [(e.src, e.tgt) for e in kept]
    assert prepared.valid == split.valid and prepared.test == split.test
    assert isinstance(prepared.train.src_ids, np.memmap), "opened memory-mapped"
    # Batches planned from the length arrays are those planned from the examples themselves.
    for shuffle in (False, True):
        assert [b.tolist() for b in token_batches(prepared.train, 200, shuffle, seed=3, epoch=2)] == [
            b.tolist() for b in token_batches(kept, 200, shuffle, seed=3, epoch=2)
        ]
    first = token_batches(prepared.train, 200, True)[0]
    assert collate([prepared.train[p] for p in first]).src.tolist() == collate([kept[p] for p in first]).src.tolist()


def test_it_is_reused_until_the_corpus_a_filter_or_the_tokenizer_changes(setting, monkeypatch):
    cfg, tokenizers, corpus = setting
    first = prepare_data(cfg, tokenizers, log=lambda message: None)
    with monkeypatch.context() as patch:
        _no_reading(patch)
        again = prepare_data(cfg, tokenizers, log=lambda message: None)
    assert again.directory == first.directory

    names = {entry_name(cfg.data, tokenizers)}
    names.add(entry_name(dataclasses.replace(cfg.data, max_source_tokens=24), tokenizers))
    names.add(entry_name(dataclasses.replace(cfg.data, split_seed=2), tokenizers))
    other = train_tokenizers(
        [s for s, _ in PAIRS], [t for _, t in PAIRS], dataclasses.replace(cfg.tokenizer, vocab_size=310)
    )
    names.add(entry_name(cfg.data, other))
    stat = corpus.stat()
    corpus.write_text(corpus.read_text(encoding="utf-8").replace("句子7号", "句子七号"), encoding="utf-8")
    os.utime(corpus, ns=(stat.st_atime_ns, stat.st_mtime_ns))  # the same time: the content still tells
    names.add(entry_name(cfg.data, tokenizers))
    assert len(names) == 5
    assert entry_name(dataclasses.replace(cfg.data, cache_dir="/elsewhere"), tokenizers) in names, "where, not what"
    changed = prepare_data(cfg, tokenizers, log=lambda message: None)
    assert changed.directory != first.directory
    assert not first.directory.exists(), "the run's own cache keeps only the entry in use"


def test_a_preparation_cut_short_leaves_nothing_that_is_used(setting, monkeypatch):
    cfg, tokenizers, _ = setting
    original = TokenizedPairsWriter.finish

    def killed_midway(self):
        np.save(self.directory / "src_offsets.npy", np.zeros(3, dtype=np.int64))  # part of the arrays, then the end
        raise KeyboardInterrupt

    monkeypatch.setattr(TokenizedPairsWriter, "finish", killed_midway)
    with pytest.raises(KeyboardInterrupt):
        prepare_data(cfg, tokenizers, log=lambda message: None)
    monkeypatch.setattr(TokenizedPairsWriter, "finish", original)
    cache = prepare_module.cache_dir(cfg)
    assert os.listdir(cache) == [] and open_prepared(cache, entry_name(cfg.data, tokenizers)) is None
    # An entry without its manifest (a copy cut short, say) is not one either, nor one whose arrays
    # are damaged: each is prepared again.
    name = entry_name(cfg.data, tokenizers)
    (cache / name).mkdir()
    (cache / name / "src_ids.bin").write_bytes(b"half")
    assert open_prepared(cache, name) is None
    prepared = prepare_data(cfg, tokenizers, log=lambda message: None)
    assert prepared.directory == cache / name and len(prepared.train) > 0
    (cache / name / "tgt_offsets.npy").write_bytes(b"damaged")
    assert open_prepared(cache, name) is None and not (cache / name).exists()
    prepare_data(cfg, tokenizers, log=lambda message: None)
    with (cache / name / "src_ids.bin").open("ab") as longer:  # ids that the offsets do not account for
        longer.write(b"\0\0\0\0")
    assert open_prepared(cache, name) is None and not (cache / name).exists()
    assert len(prepare_data(cfg, tokenizers, log=lambda message: None).train) == len(prepared.train)


def test_malformed_lines_are_counted_by_reason_when_the_tokenizer_is_trained_first(setting, tmp_path):
    from attn_cli.data.prepare import tokenizers_and_data

    cfg, _, corpus = setting
    with corpus.open("a", encoding="utf-8") as more:
        more.write("no tab on this line\n\tno source\n")
    _, prepared = tokenizers_and_data(cfg, log=lambda message: None)
    assert sum(prepared.stats["skipped_lines"].values()) == 2, prepared.stats["skipped_lines"]


def test_the_tokenizer_sample_is_seeded_uniform_and_whole_when_small():
    from attn_cli.data.prepare import reservoir_sample

    items = [(str(i), str(i)) for i in range(100)]
    assert reservoir_sample(iter(items), 100, seed=1) == items == reservoir_sample(iter(items), 500, seed=1)
    sample = reservoir_sample(iter(items), 10, seed=1)
    assert len(set(sample)) == 10 and sample == reservoir_sample(iter(items), 10, seed=1)
    assert sample != reservoir_sample(iter(items), 10, seed=2)
    # Uniform: over many seeds each item is drawn about 10% of the time, the last ones as often as the first.
    drawn = Counter(item for seed in range(2000) for item in reservoir_sample(iter(items), 10, seed))
    assert len(drawn) == 100 and min(drawn.values()) > 130 and max(drawn.values()) < 280
