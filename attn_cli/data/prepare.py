"""Turn a config into what training needs: the corpus split three ways, the tokenizers, and the
training pairs tokenized and filtered, prepared once (attn_cli/data/prepared.py).

The valid and test splits are written into the run directory as plain text, so `attn eval` and
anyone else can score against exactly the sentences the model never trained on.
"""

from __future__ import annotations

from collections import Counter
from pathlib import Path
from typing import Callable

import numpy as np

from attn_cli.config import Config, ConfigError
from attn_cli.data.batching import Example, filter_by_length
from attn_cli.data.corpus import Pair, ReadReport, Splits, load_splits
from attn_cli.data.prepared import (PreparedData, TokenizedPairs, entry_name, open_prepared, remove_entries_but,
                                    save_prepared)
from attn_cli.files import write_whole
from attn_cli.paths import RunPaths
from attn_cli.data.tokenizer import Tokenizers, train_tokenizers

Log = Callable[[str], None]


def read_splits(cfg: Config, log: Log = print, report: ReadReport | None = None) -> Splits:
    report = report if report is not None else ReadReport()
    splits = load_splits(cfg.data, report)
    if report.skipped:
        log(report.summary())
    log(f"corpus: {len(splits.train):,} training, {len(splits.valid):,} validation, {len(splits.test):,} test pairs")
    return splits


def write_splits(cfg: Config, splits: Splits | PreparedData) -> None:
    paths = RunPaths.of(cfg.run_dir)
    paths.data_dir.mkdir(parents=True, exist_ok=True)
    for name, pairs in (("valid", splits.valid), ("test", splits.test)):
        for side, language in enumerate((cfg.data.src_lang, cfg.data.tgt_lang)):
            text = "".join(pair[side].replace("\n", " ") + "\n" for pair in pairs)
            write_whole(paths.split_file(name, language), text)


def cache_dir(cfg: Config) -> Path:
    """Where prepared data is kept: data.cache_dir, shared by the runs that name it, or the run's own."""
    return Path(cfg.data.cache_dir) if cfg.data.cache_dir else RunPaths.of(cfg.run_dir).prepared_dir


def saved_tokenizers(cfg: Config, log: Log = print) -> Tokenizers | None:
    """The run's tokenizer, when it has one (a restart, `attn tokenizer`): found without reading the corpus."""
    directory = RunPaths.of(cfg.run_dir).tokenizer_dir
    if not Tokenizers.exists(directory):
        return None
    tokenizers = Tokenizers.load(directory)
    _check_reused(tokenizers, cfg, directory)
    log(f"tokenizer: reusing {directory}")
    return tokenizers


def tokenizers_and_data(cfg: Config, log: Log = print,
                        tokenizers: Tokenizers | None = None) -> tuple[Tokenizers, PreparedData]:
    """The tokenizers (`tokenizers`, else the run's saved ones, else trained on the corpus) and the
    prepared data: the data stage of `attn train` and `attn prepare`."""
    tokenizers = tokenizers if tokenizers is not None else saved_tokenizers(cfg, log)
    splits, report = None, ReadReport()
    if tokenizers is None:
        splits = read_splits(cfg, log, report)
        tokenizers = train_or_load_tokenizers(cfg, splits, log)
    return tokenizers, prepare_data(cfg, tokenizers, log, splits, report)


def prepare_data(cfg: Config, tokenizers: Tokenizers, log: Log = print, splits: Splits | None = None,
                 report: ReadReport | None = None) -> PreparedData:
    """The prepared training data for this config and tokenizer: opened when an earlier start
    prepared it, else read (unless `splits` are given, with the `report` of their reading),
    tokenized, filtered and saved. The run's valid and test files are written from it."""
    name = entry_name(cfg.data, tokenizers)
    prepared = open_prepared(cache_dir(cfg), name)
    if prepared is not None:
        log(f"data: reusing {prepared.directory} ({_describe(prepared.stats)})")
    else:
        report = report if report is not None else ReadReport()
        splits = splits if splits is not None else read_splits(cfg, log, report)
        train, dropped = filter_by_length(encode_pairs(splits.train, tokenizers), cfg.data.max_source_tokens,
                                          cfg.data.max_target_tokens, cfg.data.max_length_ratio)
        if dropped:
            log(f"length filter: dropped {dropped:,} of {len(splits.train):,} training pairs")
        pairs = TokenizedPairs.from_examples(train)
        stats = {"training_pairs_read": len(splits.train), "dropped_by_length": dropped, "training_pairs": len(train),
                 "valid_pairs": len(splits.valid), "test_pairs": len(splits.test),
                 "skipped_lines": dict(Counter(skipped.reason for skipped in report.skipped)),
                 "source_tokens": _length_stats(pairs.src_lengths), "target_tokens": _length_stats(pairs.tgt_lengths)}
        prepared = save_prepared(cache_dir(cfg), name, pairs, splits.valid, splits.test, stats)
        log(f"data: prepared in {prepared.directory}")
        if not cfg.data.cache_dir:  # the run's own: what an earlier corpus, filter or tokenizer made is spent
            remove_entries_but(cache_dir(cfg), name)
    write_splits(cfg, prepared)
    return prepared


def open_data(cfg: Config, tokenizers: Tokenizers) -> PreparedData:
    """The data another process prepared for this config and tokenizer (torchrun ranks after rank 0)."""
    prepared = open_prepared(cache_dir(cfg), entry_name(cfg.data, tokenizers))
    if prepared is None:
        raise ConfigError(f"no prepared data in {cache_dir(cfg)} for this config; rank 0 should have written it",
                          "data.cache_dir")
    return prepared


def _length_stats(lengths: np.ndarray) -> dict:
    """The total and the percentiles of the token counts of the training pairs' sides."""
    if not len(lengths):
        return {"total": 0}
    percentiles = np.percentile(lengths, [50, 90, 99]).round(1).tolist()
    return {"total": int(lengths.sum()), "p50": percentiles[0], "p90": percentiles[1], "p99": percentiles[2],
            "max": int(lengths.max())}


def _describe(stats: dict) -> str:
    return (f"{stats['training_pairs']:,} training pairs after the length filters, {stats['valid_pairs']:,} validation, "
            f"{stats['test_pairs']:,} test")


def encode_pairs(pairs: list[Pair], tokenizers: Tokenizers) -> list[Example]:
    """Token ids of each (source, target) pair, numbered in corpus order."""
    sources = tokenizers.source.encode([p[0] for p in pairs])
    targets = tokenizers.target.encode([p[1] for p in pairs])
    return [Example(i, s, t) for i, (s, t) in enumerate(zip(sources, targets))]


def train_or_load_tokenizers(cfg: Config, splits: Splits, log: Log = print, retrain: bool = False) -> Tokenizers:
    """Reuse the run's tokenizer when it has one, so resumed and repeated runs keep their vocabulary."""
    directory = RunPaths.of(cfg.run_dir).tokenizer_dir
    if Tokenizers.exists(directory) and not retrain:
        tokenizers = Tokenizers.load(directory)
        _check_reused(tokenizers, cfg, directory)
        log(f"tokenizer: reusing {directory}")
        return tokenizers
    kind = "joint" if cfg.tokenizer.joint else "separate"
    log(f"tokenizer: training {kind} SentencePiece {cfg.tokenizer.model_type} models, "
        f"vocabulary {cfg.tokenizer.vocab_size:,}, on {len(splits.train):,} training pairs")
    tokenizers = train_tokenizers([p[0] for p in splits.train], [p[1] for p in splits.train],
                                  cfg.tokenizer, seed=cfg.train.seed)
    tokenizers.save(directory)
    log(f"tokenizer: saved to {directory}")
    return tokenizers


def _check_reused(tokenizers: Tokenizers, cfg: Config, directory) -> None:
    """A reused tokenizer must be the one the config describes, or the model is built wrong."""
    sizes = {tokenizers.source.vocab_size, tokenizers.target.vocab_size}
    if tokenizers.joint != cfg.tokenizer.joint or sizes != {cfg.tokenizer.vocab_size}:
        kind = "joint" if tokenizers.joint else "separate"
        raise ConfigError(f"{directory} holds a {kind} tokenizer of {sorted(sizes)} pieces, but the config "
                          f"asks for joint={cfg.tokenizer.joint}, vocab_size={cfg.tokenizer.vocab_size}; "
                          f"run `attn tokenizer --retrain` with this config, or use another run_dir", "tokenizer")
