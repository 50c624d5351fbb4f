"""Turn a config into what training needs: the corpus split three ways and the tokenizers.

The valid and test splits are written into the run directory as plain text, so `attn eval` and
anyone else can score against exactly the sentences the model never trained on.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

from attn_cli.config import Config, ConfigError
from attn_cli.data.corpus import ReadReport, Splits, load_splits
from attn_cli.files import write_whole
from attn_cli.paths import RunPaths
from attn_cli.data.tokenizer import Tokenizers, train_tokenizers

Log = Callable[[str], None]


@dataclass
class Prepared:
    splits: Splits
    tokenizers: Tokenizers


def read_splits(cfg: Config, log: Log = print) -> Splits:
    report = ReadReport()
    splits = load_splits(cfg.data, report)
    if report.skipped:
        log(report.summary())
    log(f"corpus: {len(splits.train):,} training, {len(splits.valid):,} validation, {len(splits.test):,} test pairs")
    return splits


def write_splits(cfg: Config, splits: Splits) -> None:
    paths = RunPaths.of(cfg.run_dir)
    paths.data_dir.mkdir(parents=True, exist_ok=True)
    for name, pairs in (("valid", splits.valid), ("test", splits.test)):
        for side, language in enumerate((cfg.data.src_lang, cfg.data.tgt_lang)):
            text = "".join(pair[side].replace("\n", " ") + "\n" for pair in pairs)
            write_whole(paths.split_file(name, language), text)


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


def prepare(cfg: Config, log: Log = print) -> Prepared:
    splits = read_splits(cfg, log)
    write_splits(cfg, splits)
    return Prepared(splits, train_or_load_tokenizers(cfg, splits, log))
