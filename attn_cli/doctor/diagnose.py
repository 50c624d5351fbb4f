"""Running every check on a config, or on a checkpoint and the config it was trained with."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Optional, Sequence

import torch

from attn_cli.checkpoint import Checkpoint, find_checkpoint, load_checkpoint
from attn_cli.config import (
    Config,
    ConfigError,
    apply_override,
    config_from_dict,
    config_to_dict,
    find_config,
    load_config,
)
from attn_cli.data.corpus import DataError
from attn_cli.data.prepared import PreparedData, entry_name, open_prepared
from attn_cli.data.tokenizer import Tokenizers
from attn_cli.doctor.checks import Check
from attn_cli.doctor.config_checks import config_checks, invalid_config_check
from attn_cli.doctor.data_checks import data_checks, prepared_token_counts, scan_corpus
from attn_cli.doctor.environment import environment_checks, memory_check
from attn_cli.doctor.model_checks import model_checks
from attn_cli.doctor.probes import probe_batch, read_test_pairs
from attn_cli.errors import UserError
from attn_cli.paths import RunPaths


@dataclass
class Subject:
    """What is checked: a config, the run directory where its tokenizer, prepared data and test
    split are looked for, and the checkpoint when there is one."""

    cfg: Config
    run: RunPaths
    tokenizers: Optional[Tokenizers]
    checkpoint: Optional[Checkpoint] = None


def diagnose_config(config: Path, overrides: Sequence[str] = (), memory_gb: Optional[float] = None) -> list[Check]:
    """The checks of a config; one failed check when it does not load. A missing file raises ConfigError."""
    path = find_config(config)
    try:
        cfg = load_config(path, list(overrides))
    except ConfigError as error:
        return [invalid_config_check(error)]
    run = RunPaths.of(cfg.run_dir)
    return diagnose(Subject(cfg, run, _saved_tokenizers(cfg, run)), memory_gb)


def diagnose_checkpoint(
    run: Optional[Path], checkpoint: Optional[Path], overrides: Sequence[str] = (), memory_gb: Optional[float] = None
) -> list[Check]:
    """The checks of a checkpoint (`checkpoint`, else the run's best.pt or last.pt) with its own config."""
    path = find_checkpoint(run, checkpoint)
    loaded = load_checkpoint(path)
    cfg = loaded.config
    if overrides:  # e.g. data.corpus.path, when the run was trained from another directory
        values = config_to_dict(cfg)
        for override in overrides:
            apply_override(values, override)
        cfg = config_from_dict(values)
    paths = RunPaths.of(run) if run is not None and checkpoint is None else RunPaths.of_checkpoint(path)
    return diagnose(Subject(cfg, paths, loaded.tokenizers, loaded), memory_gb)


def diagnose(subject: Subject, memory_gb: Optional[float]) -> list[Check]:
    cfg, tokenizers = subject.cfg, subject.tokenizers
    checks, device = environment_checks(cfg)
    prepared = _prepared(subject)
    scan, data_problem = None, None
    try:
        scan = scan_corpus(cfg, tokenizers, prepared)
    except DataError as error:
        data_problem = str(error)
    tokens = (
        scan.tokens
        if scan is not None
        else (prepared_token_counts(tokenizers, prepared) if prepared is not None and tokenizers is not None else None)
    )
    checks += config_checks(cfg, tokens, tokenizers)
    checks.append(_memory(subject, device, memory_gb))
    checks += data_checks(cfg, scan) if scan is not None else [_unreadable_data(subject, data_problem)]
    if subject.checkpoint is not None:
        checks += _model(subject)
    return checks


def _saved_tokenizers(cfg: Config, run: RunPaths) -> Optional[Tokenizers]:
    """The run's tokenizer when it has one that fits the config (a config before its first run has none)."""
    try:
        if not Tokenizers.exists(run.tokenizer_dir):
            return None
        tokenizers = Tokenizers.load(run.tokenizer_dir)
    except UserError:
        return None
    sizes = {tokenizers.source.vocab_size, tokenizers.target.vocab_size}
    fits = tokenizers.joint == cfg.tokenizer.joint and tokenizers.source_prefix == cfg.tokenizer.source_prefix
    return tokenizers if fits and sizes == {cfg.tokenizer.vocab_size} else None


def _prepared(subject: Subject) -> Optional[PreparedData]:
    """The run's prepared training data for this config and tokenizer, opened read-only; None when there is none."""
    if subject.tokenizers is None:
        return None
    cfg = subject.cfg
    cache = Path(cfg.data.cache_dir) if cfg.data.cache_dir else subject.run.prepared_dir
    try:
        return open_prepared(cache, entry_name(cfg.data, subject.tokenizers), remove_damaged=False)
    except (OSError, KeyError, UserError):  # a corpus that is gone: nothing prepared can be matched to it
        return None


def _memory(subject: Subject, device: Optional[torch.device], memory_gb: Optional[float]) -> Check:
    cfg = subject.cfg
    if device is None:
        return Check("memory", "training step", "skip", "train.device names no device here", "set train.device: auto")
    if subject.tokenizers is not None:
        sizes = subject.tokenizers.source.vocab_size, subject.tokenizers.target.vocab_size
    else:
        sizes = cfg.tokenizer.vocab_size, cfg.tokenizer.vocab_size
    return memory_check(cfg, *sizes, device, memory_gb)


def _unreadable_data(subject: Subject, problem: Optional[str]) -> Check:
    """The corpus cannot be read from here: training would fail (config), or only the data goes
    unchecked (a checkpoint trained elsewhere, whose corpus path is relative to another directory)."""
    status = "warn" if subject.checkpoint is not None else "fail"
    return Check(
        "data",
        "corpus readable",
        status,
        problem or "data.corpus cannot be read",
        "run doctor from the directory the run was trained in, or --set data.corpus.path=FILE",
    )


def _model(subject: Subject) -> list[Check]:
    cfg, checkpoint = subject.cfg, subject.checkpoint
    test = read_test_pairs(*subject.run.held_out_files("test", cfg.data.directions[0], len(cfg.data.directions) > 1))
    probe = probe_batch(checkpoint.tokenizers, test, cfg.model.position_limit, f"{subject.run.data_dir}/test")
    model = checkpoint.model.float().to("cpu")  # fp32 on the CPU: the comparisons rest on fp32 rounding
    return model_checks(model, probe)
