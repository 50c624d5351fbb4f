"""What a training run starts from: the device, seeds, learning-rate schedule, encoded examples,
and the resume point or the refusal to overwrite a finished run."""

from __future__ import annotations

import json
import math
import random
from pathlib import Path

import torch

from attn_cli.config import DEVICE_PATTERN, ConfigError
from attn_cli.data.batching import Example
from attn_cli.data.tokenizer import Tokenizers
from attn_cli.paths import RunPaths
from attn_cli.training.checkpoint import Checkpoint, CheckpointError, load_checkpoint


def resolve_device(name: str, option: str = "train.device") -> torch.device:
    """The torch device for `name`; `option` is what the user set it with, for the error message."""
    if not DEVICE_PATTERN.fullmatch(name):
        raise ConfigError(f"{option}: {name!r} is not a device; use auto, cpu, cuda or cuda:N")
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if name.startswith("cuda"):
        index = int(name.partition(":")[2] or 0)
        if index >= torch.cuda.device_count():
            raise ConfigError(f"{option}: {name} but {torch.cuda.device_count()} CUDA GPUs are visible; use auto or cpu")
    return torch.device(name)


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
    return seed * 1000003 + rank


def encode_examples(pairs, tokenizers: Tokenizers) -> list[Example]:
    """Token ids of each (source, target) pair, numbered in corpus order."""
    sources = tokenizers.source.encode([p[0] for p in pairs])
    targets = tokenizers.target.encode([p[1] for p in pairs])
    return [Example(i, s, t) for i, (s, t) in enumerate(zip(sources, targets))]


def _refuse_to_overwrite(paths: RunPaths) -> None:
    """A new run must never silently replace the checkpoints of a finished one."""
    existing = [p for p in (paths.best_checkpoint, paths.last_checkpoint) if p.is_file()]
    if existing:
        raise ConfigError(f"run_dir: {paths.root} already holds checkpoints ({', '.join(p.name for p in existing)}); "
                          f"continue it with --resume, train into another one (--set run_dir=...) or delete "
                          f"{paths.checkpoint_dir} to start over")


def _load_resume_point(paths: RunPaths, device: torch.device) -> Checkpoint:
    """The run's last.pt, which --resume continues from; refused when it is missing or holds no
    resume state, rather than silently starting over."""
    if not paths.last_checkpoint.is_file():
        raise CheckpointError(f"nothing to resume: no {paths.last_checkpoint}; train without --resume to start the run")
    checkpoint = load_checkpoint(paths.last_checkpoint, device)
    if "batches_done" not in checkpoint.training_state:
        raise CheckpointError(f"{paths.last_checkpoint} holds no resume state (an older attn wrote it); "
                              f"start a new run_dir")
    return checkpoint


def _keep_metrics_up_to(log: Path, step: int) -> None:
    """Drop metrics lines written after the checkpoint a run resumes from; the resumed run writes them again."""
    if log.is_file():
        lines = log.read_text(encoding="utf-8").splitlines(keepends=True)
        log.write_text("".join(line for line in lines if json.loads(line)["step"] <= step), encoding="utf-8")
