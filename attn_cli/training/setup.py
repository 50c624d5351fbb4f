"""What a training run starts from: the resume point and the config it continues with, the run
directory, the tokenizers and encoded data, the model, optimizer, schedule and DDP wrapper.
`setup_training` gathers them into a `TrainingSetup`, which `Trainer` (trainer.py) runs the loop on."""

from __future__ import annotations

import json
import math
import random
from dataclasses import dataclass, field
from pathlib import Path
from typing import Optional

import torch

from attn_cli.checkpoint import Checkpoint
from attn_cli.config import Config, ConfigError, config_to_yaml, derived_seed
from attn_cli.data.batching import Example
from attn_cli.data.corpus import DataError, HeldOut
from attn_cli.data.lengths import LengthModel
from attn_cli.data.prepare import encode_pairs, open_data, tokenizers_and_data
from attn_cli.data.prepared import PreparedData, TokenizedPairs
from attn_cli.data.tokenizer import Tokenizers
from attn_cli.device import allocate_model, resolve_device
from attn_cli.files import remove_stale_temporaries, write_whole
from attn_cli.model import Transformer
from attn_cli.paths import RunPaths
from attn_cli.training.distributed import SINGLE_PROCESS, Ranks
from attn_cli.training.precision import Precision, resolve_precision, slow_here
from attn_cli.training.progress import TrainingDisplay
from attn_cli.training.state import (
    StartingPoint,
    TrainState,
    load_resume_point,
    restore_optimization,
    restore_rng_state,
    resume_config,
    starting_point,
)
from attn_cli.training.step import NonfiniteGuard, TrainingObjective, TrainingStep, adamw


def inverse_sqrt_schedule(warmup_steps: int):
    """Linear warmup to the peak learning rate, then decay with 1/sqrt(step)."""

    def factor(step: int) -> float:
        step = max(step, 1)
        return min(step / warmup_steps, math.sqrt(warmup_steps / step))

    return factor


def set_seed(seed: int) -> None:
    """Seed Python's and torch's global generators, which tokenizer training, weight initialisation
    and dropout draw from."""
    random.seed(seed)
    torch.manual_seed(seed)


def dropout_seed(seed: int, rank: int) -> int:
    """The seed of process `rank`'s random streams once the model is built: each process draws its
    own dropout masks. Rank 0 is never reseeded, so one process runs exactly as without torchrun."""
    return derived_seed(seed, rank)


def _refuse_to_overwrite(paths: RunPaths) -> None:
    """A new run must never silently replace the checkpoints of a finished one."""
    existing = [p for p in (paths.best_checkpoint, paths.last_checkpoint) if p.is_file()]
    if existing:
        raise ConfigError(
            f"{paths.root} already holds checkpoints ({', '.join(p.name for p in existing)}); "
            f"continue it with --resume, train into another one (--set run_dir=...) or delete "
            f"{paths.checkpoint_dir} to start over",
            "run_dir",
        )


def _keep_metrics_up_to(log: Path, step: int) -> None:
    """Drop metrics lines written after the checkpoint a run resumes from (the resumed run writes
    them again), and a line a kill cut short."""
    if log.is_file():
        kept = [
            line
            for line in log.read_text(encoding="utf-8").splitlines(keepends=True)
            if _metrics_step(line) is not None and _metrics_step(line) <= step
        ]
        write_whole(log, "".join(kept))


def _metrics_step(line: str) -> Optional[int]:
    """The step of a metrics line; None for one that is not whole (no newline yet, or not JSON)."""
    if not line.endswith("\n"):
        return None
    try:
        return json.loads(line)["step"]
    except (ValueError, KeyError, TypeError):
        return None


@dataclass
class TrainingSetup:
    """Everything the training loop needs, read, built or restored by `setup_training`."""

    cfg: Config  # the config the run trains with: for a resumed run, its own with the changes resuming allows
    display: TrainingDisplay
    ranks: Ranks
    paths: RunPaths
    device: torch.device
    tokenizers: Tokenizers
    train_examples: TokenizedPairs  # those the length filters kept, memory-mapped
    lengths: LengthModel  # their lengths, kept in every checkpoint for the search's output bounds
    valid_examples: list[Example]  # those the model can embed whole, for the validation loss
    valid_pairs: HeldOut  # the validation split's texts by direction, for BLEU
    model: Transformer  # the plain module, the one saved and decoded with
    optimizer: torch.optim.Optimizer
    scheduler: torch.optim.lr_scheduler.LambdaLR
    scaler: torch.amp.GradScaler
    precision: Precision
    update: TrainingStep
    nonfinite: NonfiniteGuard
    corpus_sizes: tuple[int, ...] = ()  # train_examples' pairs of each directed corpus, stored in that order
    state: TrainState = field(default_factory=TrainState)  # where the run stands: a resumed run's own


def setup_training(
    cfg: Config, display: TrainingDisplay, resume: bool = False, ranks: Ranks = SINGLE_PROCESS
) -> TrainingSetup:
    """Everything a run trains from, in an order that keeps runs repeatable and resumes exact (the
    seeds are set at fixed points). Every process of a torchrun run calls it; rank 0 alone writes files."""
    paths = RunPaths.of(cfg.run_dir)
    device = ranks.device if ranks.distributed else resolve_device(cfg.train.device)
    resumed, resumed_from = load_resume_point(paths, device) if resume else (None, None)
    cfg = _run_config(cfg, paths, resumed, display)
    if resumed_from is not None and resumed_from != paths.last_checkpoint:
        display.log(
            f"resume: no last.pt (the run was stopped during its first save); continuing from "
            f"{resumed_from}, of step {resumed.step}"
        )
    # A resumed fine-tuning run continues from its own last.pt, not from where it started.
    start = starting_point(cfg) if resumed is None else None
    if cfg.train.threads is not None:
        torch.set_num_threads(cfg.train.threads)
    if ranks.is_main:
        _prepare_run_dir(paths, resumed)

    set_seed(cfg.train.seed)
    prepared, tokenizers = _data_and_tokenizers(cfg, resumed or start, display, ranks)
    if not len(prepared.train):
        raise DataError(
            "no training pairs left after the length filters; raise data.max_source_tokens, "
            "data.max_target_tokens or data.max_length_ratio"
        )
    valid_examples = _valid_examples(cfg, prepared, tokenizers)

    set_seed(cfg.train.seed)  # the same initial weights whatever the tokenizer training consumed
    model = (
        resumed.model.to(device)
        if resumed is not None
        else allocate_model(
            cfg.model,
            tokenizers.source.vocab_size,
            tokenizers.target.vocab_size,
            device,
            training=True,
            fix="lower model.d_model, model.ffn_dim, the layer counts or tokenizer.vocab_size",
        )
    )
    if start is not None:
        model.load_state_dict(start.model.state_dict())
        display.log(
            f"init_from: the weights and tokenizer of {start.path} (step {start.checkpoint.step:,}); "
            f"a new optimizer, schedule and data order"
        )
    model.gradient_checkpointing = cfg.train.gradient_checkpointing
    if ranks.rank:
        set_seed(dropout_seed(cfg.train.seed, ranks.rank))
    optimizer = adamw(model.parameters(), cfg.train.lr, cfg.train.betas, cfg.train.weight_decay)
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, inverse_sqrt_schedule(cfg.train.warmup_steps))
    precision = resolve_precision(cfg.train.precision, device)
    scaler = precision.grad_scaler(device)
    # The DDP and compiled wrappers share the parameters; the plain module stays the one saved and decoded with.
    replica = ranks.replicate(TrainingObjective(model, cfg.train.label_smoothing))
    objective = torch.compile(replica) if cfg.train.compile else replica
    update = TrainingStep(
        model, objective, optimizer, scheduler, scaler, precision, device, cfg.train.clip_norm, ranks, replica
    )
    setup = TrainingSetup(
        cfg,
        display,
        ranks,
        paths,
        device,
        tokenizers,
        prepared.train,
        LengthModel.fit(prepared.train.src_lengths, prepared.train.tgt_lengths),
        valid_examples,
        prepared.valid,
        model,
        optimizer,
        scheduler,
        scaler,
        precision,
        update,
        NonfiniteGuard(cfg.train.max_nonfinite_steps),
        tuple(prepared.corpus_sizes),
    )
    if resumed is not None:
        _restore(setup, resumed)
    if ranks.is_main:  # last: a run, or a resume, that fails to start leaves the run's config as it was
        write_whole(paths.config, config_to_yaml(cfg))
    _log_setup(setup)
    return setup


def _run_config(cfg: Config, paths: RunPaths, resumed: Optional[Checkpoint], display: TrainingDisplay) -> Config:
    """The config to train with: a resumed run's own, with the changes resuming allows (each logged);
    for a new run `cfg` itself, once it is clear that no finished run would be overwritten."""
    if resumed is not None:
        cfg, changes = resume_config(cfg, resumed.config, paths.last_checkpoint)
        for change in changes:
            display.log(f"resume: {change}")
    else:
        _refuse_to_overwrite(paths)
    return cfg


def _prepare_run_dir(paths: RunPaths, resumed: Optional[Checkpoint]) -> None:
    """Clear what a killed process left and keep only the metrics the run will not write again; rank 0's job."""
    paths.root.mkdir(parents=True, exist_ok=True)
    # Under the run directory's lock no other process writes here: a temporary file is what a
    # write cut short by a kill left behind.
    for directory in (paths.root, paths.checkpoint_dir, paths.tokenizer_dir, paths.data_dir, paths.prepared_dir):
        remove_stale_temporaries(directory)
    if resumed is not None:
        _keep_metrics_up_to(paths.metrics_log, resumed.step)
    else:
        paths.metrics_log.unlink(missing_ok=True)  # metrics of an unfinished earlier attempt


def _data_and_tokenizers(
    cfg: Config, earlier: Optional[Checkpoint | StartingPoint], display: TrainingDisplay, ranks: Ranks
) -> tuple[PreparedData, Tokenizers]:
    """The prepared training data and the tokenizers. A resumed run keeps its checkpoint's
    tokenizers, the ones its weights were trained with, as does a run started from another's
    checkpoint (train.init_from), and a restarted one its saved tokenizer: none reads the corpus
    again when its data was prepared before. Rank 0 prepares, and the other processes open what it wrote."""
    given = earlier.tokenizers if earlier is not None else None
    if not ranks.is_main:
        state = ranks.from_main(None)  # sent once rank 0 has prepared the data
        tokenizers = given if given is not None else Tokenizers.from_state(state)
        return open_data(cfg, tokenizers), tokenizers
    if isinstance(earlier, StartingPoint):
        given.save(RunPaths.of(cfg.run_dir).tokenizer_dir)  # the run's own, as if trained here: never retrained
    tokenizers, prepared = tokenizers_and_data(cfg, display.log, given, display.shown_removed)
    ranks.from_main(tokenizers.to_state())
    return prepared, tokenizers


def _valid_examples(cfg: Config, prepared: PreparedData, tokenizers: Tokenizers) -> list[Example]:
    """The validation examples whose every token the model can embed (the validation loss needs them all)."""
    position_limit = cfg.model.position_limit
    examples = [
        example
        for direction, pairs in prepared.valid.items()
        for example in encode_pairs(pairs, tokenizers, direction.target)
        if position_limit is None or max(len(example.src), len(example.tgt)) <= position_limit
    ]
    return [Example(number, example.src, example.tgt) for number, example in enumerate(examples)]


def _restore(setup: TrainingSetup, resumed: Checkpoint) -> None:
    """Continue exactly where `resumed` left off: the optimizer, schedule and scaler states, the run's
    state, then this process's random streams."""
    restore_optimization(resumed.training_state, setup.optimizer, setup.scheduler, setup.scaler)
    setup.state = TrainState.from_checkpoint(resumed)
    # Last: nothing after this may draw random numbers before training.
    rng_by_rank = resumed.training_state.get("rng_by_rank") or [resumed.training_state["rng"]]
    if len(rng_by_rank) != setup.ranks.world_size:
        setup.display.log(
            f"resume: the run had {len(rng_by_rank)} processes and now has {setup.ranks.world_size}; "
            f"updates still cover the same batches, but dropout masks differ from an "
            f"uninterrupted run"
        )
    if setup.ranks.rank < len(rng_by_rank):
        restore_rng_state(rng_by_rank[setup.ranks.rank])


def _log_setup(setup: TrainingSetup) -> None:
    """The model's size, device and precision, and the effective batch, for the log."""
    parameters = sum(p.numel() for p in setup.model.parameters())
    setup.display.log(
        f"model: {parameters / 1e6:.1f}M parameters on {setup.device}, "
        f"{setup.precision.describe()}; {len(setup.train_examples):,} training pairs"
    )
    slow = slow_here(setup.precision.name, setup.device)
    if slow:  # emulated arithmetic: a run that would take minutes takes hours
        fast = resolve_precision("auto", setup.device).name
        setup.display.log(
            f"warning: train.precision {setup.precision.name} runs many times slower than it should here: {slow}; "
            f"set train.precision: auto ({fast})"
        )
    train = setup.cfg.train
    shared = f", shared by {setup.ranks.world_size} processes" if setup.ranks.distributed else ""
    setup.display.log(
        f"effective batch: up to {train.max_tokens * train.accumulate:,} tokens per update "
        f"(train.max_tokens {train.max_tokens:,} x train.accumulate {train.accumulate}){shared}"
    )
