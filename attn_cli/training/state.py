"""Where a training run stands and where it starts from: the one training state.

`TrainState` is everything about a run besides its weights and optimizer that continuing it exactly
needs: its position in the data, the training time used, the best validation so far and how many
validations have passed without beating it, the skipped updates. Its checkpoint writer
(`TrainState.to_checkpoint`) and reader (`TrainState.from_checkpoint`, `restore_optimization`) sit
side by side, with the random streams every process draws its dropout masks from.

"Best" has one rule (`best_metric`), used both for best.pt and for early stopping: the validation
metric that `train.early_stopping.metric` names, or validation BLEU when early stopping is off (the
loss when `train.valid_bleu` is off too). A tie in BLEU is broken by the lower validation loss.

A run starts from nothing, from its own last checkpoint (`--resume`, with the config changes that
resuming allows: `resume_config`), or from another run's weights and tokenizer (`train.init_from`:
`starting_point`).
"""

from __future__ import annotations

import random
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Optional

import torch

from attn_cli.checkpoint import Checkpoint, CheckpointError, find_checkpoint, load_checkpoint
from attn_cli.config import Config, ConfigError, TrainConfig, config_to_dict
from attn_cli.data.tokenizer import Tokenizers
from attn_cli.model import Transformer
from attn_cli.paths import RunPaths

# metric name -> (key in the validation metrics, whether higher is better, how to say it)
METRICS = {"bleu": ("valid_bleu", True, "BLEU"), "loss": ("valid_loss", False, "loss")}


def best_metric(train: TrainConfig) -> str:
    """The validation metric that decides the best checkpoint and early stopping alike."""
    if train.early_stopping is not None:
        return train.early_stopping.metric
    return "bleu" if train.valid_bleu else "loss"


@dataclass
class TrainState:
    """A run's progress: nothing done for a new run, the checkpoint's for a resumed one."""

    step: int = 0  # updates applied
    epoch: int = 0  # the epoch in progress; 0 before the first
    batches_done: int = 0  # batches of this epoch already trained on
    elapsed: float = 0.0  # training seconds before this process took the run over
    validated_step: int = 0  # the step of the last validation
    best_metrics: dict = field(default_factory=dict)  # the best validation's metrics (its step among them)
    stale_validations: int = 0  # validations in a row since the best one
    nonfinite_steps: int = 0  # updates skipped for a non-finite loss or gradients

    def record_validation(self, metrics: dict, metric: str) -> bool:
        """Count a validation of this step; whether it is the best so far by `metric` (see `best_metric`)."""
        improved = self._beats_best(metrics, metric)
        if improved:
            self.best_metrics, self.stale_validations = metrics, 0
        else:
            self.stale_validations += 1
        self.validated_step = self.step
        return improved

    def _beats_best(self, metrics: dict, metric: str) -> bool:
        key, higher_is_better, _ = METRICS[metric]
        if not self.best_metrics or key not in metrics or key not in self.best_metrics:
            return True  # the first validation, or nothing to compare on: the newest is the best
        new, best = metrics[key], self.best_metrics[key]
        if new == best and metric == "bleu" and "valid_loss" in metrics:
            return metrics["valid_loss"] < self.best_metrics.get("valid_loss", float("inf"))
        return new > best if higher_is_better else new < best

    def should_stop_early(self, train: TrainConfig) -> bool:
        """Whether `train.early_stopping.patience` validations in a row have not beaten the best."""
        stopping = train.early_stopping
        return stopping is not None and self.stale_validations >= stopping.patience

    def early_stopping_reason(self, train: TrainConfig) -> str:
        key, _, label = METRICS[best_metric(train)]
        return (
            f"early stopping: validation {label} has not improved for {self.stale_validations} validations "
            f"(train.early_stopping.patience={train.early_stopping.patience}); the best, "
            f"{self.best_metrics[key]:.3f}, was at step {self.best_metrics['step']:,}"
        )

    def to_checkpoint(
        self,
        elapsed: float,
        optimizer: torch.optim.Optimizer,
        scheduler: torch.optim.lr_scheduler.LRScheduler,
        scaler: torch.amp.GradScaler,
        rng_by_rank: list[dict],
    ) -> dict:
        """What a checkpoint's `training_state` holds: this state with `elapsed` training seconds so
        far, the optimizer, schedule and scaler states, and every process's random streams ("rng"
        is rank 0's). `from_checkpoint` and `restore_optimization` read it back."""
        return {
            "optimizer": optimizer.state_dict(),
            "scheduler": scheduler.state_dict(),
            "grad_scaler": scaler.state_dict(),
            "rng": rng_by_rank[0],
            "rng_by_rank": rng_by_rank,
            "batches_done": self.batches_done,
            "elapsed": elapsed,
            "validated_step": self.validated_step,
            "best_metrics": self.best_metrics,
            "stale_validations": self.stale_validations,
            "nonfinite_steps": self.nonfinite_steps,
        }

    @classmethod
    def from_checkpoint(cls, checkpoint: Checkpoint) -> TrainState:
        state = checkpoint.training_state
        # Checkpoints written before this state had its own count kept it in early stopping's state.
        stale = state.get("stale_validations", (state.get("early_stopping") or {}).get("stale", 0))
        return cls(
            checkpoint.step,
            checkpoint.epoch,
            state["batches_done"],
            state["elapsed"],
            state["validated_step"],
            state["best_metrics"],
            stale,
            state["nonfinite_steps"],
        )


def restore_optimization(
    training_state: dict,
    optimizer: torch.optim.Optimizer,
    scheduler: torch.optim.lr_scheduler.LRScheduler,
    scaler: torch.amp.GradScaler,
) -> None:
    """Load the optimizer, schedule and scaler states `TrainState.to_checkpoint` saved."""
    load_optimizer_state(optimizer, training_state["optimizer"])
    scheduler.load_state_dict(training_state["scheduler"])
    if scaler.is_enabled() and training_state["grad_scaler"]:  # empty when the run was not fp16 before
        scaler.load_state_dict(training_state["grad_scaler"])


def load_optimizer_state(optimizer: torch.optim.Optimizer, state: dict) -> None:
    """Load a saved optimizer state but keep this optimizer's choice of kernel (`fused`), which
    `load_state_dict` would take from the checkpoint: a run resumed from a checkpoint of the plain
    loop would stay slow, and one saved with the fused kernel could not resume where it is missing."""
    groups = [
        {**saved, "fused": current["fused"]} if "fused" in current else saved
        for saved, current in zip(state["param_groups"], optimizer.param_groups)
    ]
    optimizer.load_state_dict({**state, "param_groups": groups})


# -- random streams -------------------------------------------------------------------------------


def capture_rng_state() -> dict:
    """Every random number generator training draws from, as one state, so that a resumed run draws
    the same dropout masks as a run that never stopped."""
    state = {"python": random.getstate(), "torch": torch.get_rng_state()}
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def restore_rng_state(state: dict) -> None:
    random.setstate(state["python"])
    torch.set_rng_state(state["torch"])
    if torch.cuda.is_available():
        # A resumed run may see fewer GPUs; each one it has gets its own saved state back.
        for index, device_state in enumerate(state.get("cuda", [])[: torch.cuda.device_count()]):
            torch.cuda.set_rng_state(device_state, index)


# -- resuming: the run's own last checkpoint ------------------------------------------------------

# YAML paths (and whole sections) that a resumed run may change: how long to go on, where to run,
# how often to report. Anything that shaped the model, its tokenizer, the data order or the
# optimizer may not, because the saved state would no longer fit it.
RESUMABLE = (
    "run_dir",
    "train.device",
    "train.threads",
    "train.precision",
    "train.compile",
    "train.gradient_checkpointing",
    "train.max_epochs",
    "train.max_steps",
    "train.max_minutes",
    "train.valid_every",
    "train.log_every",
    "train.max_nonfinite_steps",
    "train.keep_last",
    "train.early_stopping",
    "decode",
)


def _may_change(path: str) -> bool:
    return any(path == allowed or path.startswith(allowed + ".") for allowed in RESUMABLE)


def differences(saved: Any, given: Any, path: str = "") -> Iterator[tuple[str, Any, Any]]:
    """(YAML path, saved value, given value) for every leaf that differs."""
    if isinstance(saved, dict) and isinstance(given, dict):
        for key in saved.keys() | given.keys():
            yield from differences(saved.get(key), given.get(key), f"{path}.{key}" if path else key)
    elif saved != given:
        yield path, saved, given


def resume_config(given: Config, saved: Config, checkpoint: Path) -> tuple[Config, list[str]]:
    """The config to resume with, and one line per changed setting for the log.

    `given` is what the user asked for now (config file and --set), `saved` what the run was
    trained with; a change outside RESUMABLE raises ConfigError naming the key.
    """
    changes = []
    for path, old, new in sorted(differences(config_to_dict(saved), config_to_dict(given))):
        if not _may_change(path):
            raise ConfigError(
                f"{new!r} differs from {old!r} in {checkpoint}, the run being resumed; a resumed run keeps "
                f"its model, tokenizer, data and optimizer settings. Resume with the run's own config "
                f"(--config {Path(given.run_dir) / 'config.yaml'}) and --set only train.max_steps, max_epochs, "
                f"max_minutes, device, precision and the like, or start a new run_dir",
                path,
            )
        changes.append(f"{path}: {old!r} -> {new!r}")
    return given, changes


def load_resume_point(paths: RunPaths, device: torch.device) -> tuple[Checkpoint, Path]:
    """The checkpoint --resume continues from, and its path: the run's last.pt; or, when a kill
    during the run's first save left best.pt or a step checkpoint but no last.pt yet (last.pt is
    written last), the newest of those, which hold the same resume state. Refused when there is
    none, or it holds no resume state, rather than silently starting over."""
    if paths.last_checkpoint.is_file():
        path = paths.last_checkpoint
        checkpoint = load_checkpoint(path, device)
    else:
        found = [p for p in (*reversed(paths.step_checkpoints()), paths.best_checkpoint) if p.is_file()]
        if not found:
            raise CheckpointError(
                f"nothing to resume: no {paths.last_checkpoint}; train without --resume to start the run"
            )
        checkpoint, path = max(((load_checkpoint(p, device), p) for p in found), key=lambda loaded: loaded[0].step)
    if "batches_done" not in checkpoint.training_state:
        raise CheckpointError(f"{path} holds no resume state (an older attn wrote it); start a new run_dir")
    return checkpoint, path


# -- fine-tuning: another run's weights (train.init_from) ----------------------------------------

# The sections a fine-tuned run must share with the checkpoint it starts from: the weights fit no
# other shape, and the tokenizer is never trained again.
_FIXED_SECTIONS = ("model", "tokenizer")


@dataclass
class StartingPoint:
    """The checkpoint a new run takes its weights and tokenizer from, and nothing else: its
    optimizer, learning rate schedule (warmup included), data order and step count start afresh."""

    path: Path  # the checkpoint file
    checkpoint: Checkpoint

    @property
    def tokenizers(self) -> Tokenizers:
        return self.checkpoint.tokenizers

    @property
    def model(self) -> Transformer:
        return self.checkpoint.model


def starting_point(cfg: Config) -> Optional[StartingPoint]:
    """The checkpoint `train.init_from` names (a file, or a run directory's best.pt, else its
    last.pt), checked against `cfg`: the first model or tokenizer setting that differs is refused by
    its key. None when it names none."""
    if cfg.train.init_from is None:
        return None
    given = Path(cfg.train.init_from)
    if not given.exists():
        raise ConfigError(f"{given} does not exist; name a checkpoint file or a run directory", "train.init_from")
    path = find_checkpoint(given, None) if given.is_dir() else given
    checkpoint = load_checkpoint(path)
    theirs, ours = config_to_dict(checkpoint.config), config_to_dict(cfg)
    for section in _FIXED_SECTIONS:
        for key, their_value, our_value in sorted(differences(theirs[section], ours[section], section)):
            raise ConfigError(
                f"{our_value!r} differs from {their_value!r} in {path}, the checkpoint train.init_from "
                f"starts from; a run started from a checkpoint keeps its model and tokenizer: set "
                f"{key}: {their_value!r}",
                key,
            )
    return StartingPoint(path, checkpoint)
