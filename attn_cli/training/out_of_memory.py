"""A training step that runs out of memory: recognised, and told as one line that names the batch
that did not fit and says what to change (the advice of `attn doctor`'s memory check)."""

from __future__ import annotations

from collections.abc import Sequence

import torch

from attn_cli.config import TrainConfig
from attn_cli.data.batching import Batch
from attn_cli.errors import UserError
from attn_cli.paths import RunPaths
from attn_cli.training.memory import memory_advice

# How allocators say it: CUDA's torch.OutOfMemoryError, and the CPU allocator's RuntimeError
# ("DefaultCPUAllocator: can't allocate memory: ...", "... not enough memory: ...").
_OUT_OF_MEMORY_WORDS = ("out of memory", "can't allocate memory", "not enough memory")


class TrainingOutOfMemory(UserError, MemoryError):
    """A training step needed more memory than the device has; the message says which batch and what to change."""


def is_out_of_memory(error: BaseException) -> bool:
    """Whether `error` is a failed allocation, rather than a bug that must keep its traceback."""
    if isinstance(error, (torch.OutOfMemoryError, MemoryError)):
        return True
    first_line = str(error).strip().splitlines()[0].lower() if str(error).strip() else ""
    return isinstance(error, RuntimeError) and any(words in first_line for words in _OUT_OF_MEMORY_WORDS)


def describe_batches(batches: Sequence[Batch]) -> str:
    """The batch (or, for an update of several, the largest) as rows x longest source / target tokens."""

    def size(batch: Batch) -> str:
        rows, source = batch.src.shape
        return f"{rows:,} rows x {source:,} source / {batch.tgt_in.shape[1]:,} target tokens"

    if len(batches) == 1:
        return f"the batch of {size(batches[0])}"
    largest = max(batches, key=lambda batch: batch.src.numel() + batch.tgt_in.numel())
    return f"one of the update's {len(batches)} batches (the largest: {size(largest)})"


def out_of_memory_message(
    what_failed: str, device: torch.device, train: TrainConfig, paths: RunPaths, saved_step: int | None
) -> str:
    """The line a run that ran out of memory ends with; `saved_step` is the step last.pt was saved
    at, None when it could not be saved."""
    saved = (
        f"last.pt holds the state before it (step {saved_step:,}): {paths.last_checkpoint}"
        if saved_step is not None
        else "no checkpoint was saved"
    )
    # Gradient checkpointing and precision may change on --resume; the batch size may not (it shapes the data order).
    resumable = [
        setting
        for setting, done in (
            ("train.gradient_checkpointing=true", train.gradient_checkpointing),
            ("train.precision=bf16", train.precision in ("bf16", "fp16")),
        )
        if not done
    ]
    resume = (
        f"; continue with `attn train --config {paths.config} --resume --set {resumable[0]}`"
        if resumable and saved_step is not None
        else ""
    )
    return (
        f"out of memory on {device}: {what_failed} did not fit; {saved}; "
        f"{memory_advice(train)}{resume} (a smaller train.max_tokens needs a new run_dir); "
        f"`attn doctor --config {paths.config}` estimates a step's memory"
    )
