"""Prepared data: tokenized once, reused while nothing it is made from changes, never half-written."""

import dataclasses
import os

import numpy as np
import pytest

from attn_cli.config import Config, CorpusConfig, DataConfig, TokenizerConfig
from attn_cli.data import prepare as prepare_module
from attn_cli.data.batching import collate, token_batches
from attn_cli.data.prepare import encode_pairs, prepare_data
from attn_cli.data.prepared import TokenizedPairs, entry_name, open_prepared
from attn_cli.data.tokenizer import train_tokenizers

PAIRS = [(f"sentence number {i} " + "word " * (i % 12), f"句子{i}号" + "字" * (i % 5)) for i in range(240)]


@pytest.fixture
def setting(tmp_path):
    corpus = tmp_path / "corpus.tsv"
    corpus.write_text("".join(f"{s}\t{t}\n" for s, t in PAIRS), encoding="utf-8")
    cfg = Config(run_dir=str(tmp_path / "run"),
                 data=DataConfig(corpus=CorpusConfig(path=str(corpus)), valid_size=20, test_size=20, max_source_tokens=22,
                                 max_length_ratio=6.0),
                 tokenizer=TokenizerConfig(vocab_size=300, character_coverage=1.0))
    tokenizers = train_tokenizers([s for s, _ in PAIRS], [t for _, t in PAIRS], cfg.tokenizer)
    return cfg, tokenizers, corpus


def _no_reading(monkeypatch):
    def refuse(*args, **kwargs):
        raise AssertionError("the corpus was read again")
    monkeypatch.setattr(prepare_module, "read_splits", refuse)


def test_the_prepared_pairs_are_the_tokenized_and_filtered_split(setting):
    cfg, tokenizers, _ = setting
    prepared = prepare_data(cfg, tokenizers, log=lambda message: None)
    splits = prepare_module.read_splits(cfg, log=lambda message: None)
    kept = [e for e in encode_pairs(splits.train, tokenizers) if 1 <= len(e.src) <= 22 and 1 <= len(e.tgt) <= 128
            and max(len(e.src), len(e.tgt)) / min(len(e.src), len(e.tgt)) <= cfg.data.max_length_ratio]
    assert 0 < len(prepared.train) == len(kept) < len(splits.train)
    assert [(e.src, e.tgt) for e in prepared.train] == [(e.src, e.tgt) for e in kept]
    assert prepared.valid == splits.valid and prepared.test == splits.test
    assert isinstance(prepared.train.src_ids, np.memmap), "opened memory-mapped"
    # Batches planned from the length arrays are those planned from the examples themselves.
    for shuffle in (False, True):
        assert ([b.tolist() for b in token_batches(prepared.train, 200, shuffle, seed=3, epoch=2)]
                == [b.tolist() for b in token_batches(kept, 200, shuffle, seed=3, epoch=2)])
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
    other = train_tokenizers([s for s, _ in PAIRS], [t for _, t in PAIRS], dataclasses.replace(cfg.tokenizer, vocab_size=310))
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
    original = TokenizedPairs.save

    def killed_midway(self, directory):
        np.save(directory / "src_ids.npy", self.src_ids)  # part of the arrays, then the end
        raise KeyboardInterrupt

    monkeypatch.setattr(TokenizedPairs, "save", killed_midway)
    with pytest.raises(KeyboardInterrupt):
        prepare_data(cfg, tokenizers, log=lambda message: None)
    monkeypatch.setattr(TokenizedPairs, "save", original)
    cache = prepare_module.cache_dir(cfg)
    assert os.listdir(cache) == [] and open_prepared(cache, entry_name(cfg.data, tokenizers)) is None
    # An entry without its manifest (a copy cut short, say) is not one either, nor one whose arrays
    # are damaged: each is prepared again.
    name = entry_name(cfg.data, tokenizers)
    (cache / name).mkdir()
    (cache / name / "src_ids.npy").write_bytes(b"half")
    assert open_prepared(cache, name) is None
    prepared = prepare_data(cfg, tokenizers, log=lambda message: None)
    assert prepared.directory == cache / name and len(prepared.train) > 0
    (cache / name / "tgt_offsets.npy").write_bytes(b"damaged")
    assert open_prepared(cache, name) is None and not (cache / name).exists()
    assert len(prepare_data(cfg, tokenizers, log=lambda message: None).train) == len(prepared.train)


def test_malformed_lines_are_counted_by_reason_when_the_tokenizer_is_trained_first(setting, tmp_path):
    from attn_cli.data.prepare import tokenizers_and_data

    cfg, _, corpus = setting
    with corpus.open("a", encoding="utf-8") as more:
        more.write("no tab on this line\n\tno source\n")
    _, prepared = tokenizers_and_data(cfg, log=lambda message: None)
    assert sum(prepared.stats["skipped_lines"].values()) == 2, prepared.stats["skipped_lines"]
