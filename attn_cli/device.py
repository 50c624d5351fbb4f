"""The device attn runs on, and a model built there only when it fits.

`resolve_device` turns a setting (auto, cpu, cuda, cuda:N) into a torch device, or a one-line error
naming the setting. A config (or a checkpoint's) can describe a model far larger than memory;
allocating it anyway ends in an allocator's traceback, or, because Linux hands out memory it does
not have, in the out-of-memory killer halfway through initialisation, with no message at all. So
`allocate_model` first builds the model on the meta device, which allocates nothing, to count what
it needs. Training, translating and exporting all build their models through here.
"""

from __future__ import annotations

import os

import torch

from attn_cli.config import DEVICE_PATTERN, ConfigError, ModelConfig
from attn_cli.errors import UserError
from attn_cli.model import Transformer, build_model


def resolve_device(name: str, option: str = "train.device") -> torch.device:
    """The torch device for `name`; `option` is what the user set it with, for the error message."""
    if not DEVICE_PATTERN.fullmatch(name):
        raise ConfigError(f"{name!r} is not a device; use auto, cpu, cuda or cuda:N", option)
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if name.startswith("cuda"):
        index = int(name.partition(":")[2] or 0)
        if index >= torch.cuda.device_count():
            raise ConfigError(f"{name} but {torch.cuda.device_count()} CUDA GPUs are visible; use auto or cpu", option)
    return torch.device(name)


FP32_BYTES = 4
# Training keeps, besides the weights, their gradients and AdamW's two moments.
TRAINING_COPIES = 4


class ModelSizeError(UserError, MemoryError):
    pass


def _gigabytes(count: int) -> str:
    return f"{count / 2**30:,.1f} GB"


def memory_of(device: torch.device) -> int:
    """The bytes `device` has in all: physical memory for the CPU, the GPU's own for CUDA."""
    if device.type == "cuda":
        return torch.cuda.get_device_properties(device).total_memory
    return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")


def allocate_model(
    cfg: ModelConfig, src_vocab_size: int, tgt_vocab_size: int, device: torch.device, training: bool, fix: str
) -> Transformer:
    """build_model on `device`, refused when its weights (and, for training, their gradients and
    optimizer moments) would not fit; `fix` says what the user can change."""
    with torch.device("meta"):  # shapes only: nothing is allocated
        shape = build_model(cfg, src_vocab_size, tgt_vocab_size)
    parameters = sum(p.numel() for p in shape.parameters())
    weights = FP32_BYTES * (parameters + sum(b.numel() for b in shape.buffers()))
    needed = weights + (TRAINING_COPIES - 1) * FP32_BYTES * parameters if training else weights
    what = f"a model of {parameters:,} parameters needs {_gigabytes(needed)}" + (
        " for its weights, gradients and AdamW moments" if training else " for its weights"
    )
    for place, size in ((torch.device("cpu"), weights), (device, needed)):  # built on the CPU, then moved
        available = memory_of(place)
        if size > available:
            raise ModelSizeError(
                f"{what}, more than the {_gigabytes(available)} this machine's "
                f"{'GPU' if place.type == 'cuda' else 'memory'} has; {fix}"
            )
    try:
        return build_model(cfg, src_vocab_size, tgt_vocab_size).to(device)
    except (MemoryError, RuntimeError) as error:  # torch.OutOfMemoryError is a RuntimeError
        cause = str(error).splitlines()[0] if str(error) else type(error).__name__
        if isinstance(error, RuntimeError) and not any(word in cause.lower() for word in ("alloc", "out of memory")):
            raise  # not a failed allocation: a bug, shown as one
        raise ModelSizeError(f"{what}, and allocating it failed ({cause}); {fix}") from None
