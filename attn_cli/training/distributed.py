"""Training on several processes with DistributedDataParallel, as started by torchrun.

torchrun gives each process RANK, WORLD_SIZE and LOCAL_RANK (and MASTER_ADDR/MASTER_PORT). Without
them training runs as one process, and every method of `Ranks` is then a no-op that returns its
input, so the trainer has a single code path.

Every process builds the same global batches (same seed, same epoch) and trains on its share of each
one's examples; DDP averages the gradients over the processes. The loss is scaled so that the
update equals that of one process over the whole global batch, whatever the number of processes.
"""

from __future__ import annotations

import contextlib
import os
from dataclasses import dataclass
from datetime import timedelta
from typing import Any, Iterator, Optional, TypeVar

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel

from attn_cli.config import ConfigError

T = TypeVar("T")

# Rank 0 validates (BLEU decoding can take minutes) while the others wait in a collective; the
# default timeout would abort them on a large validation set.
COLLECTIVE_TIMEOUT = timedelta(hours=1)


@dataclass(frozen=True)
class Ranks:
    """The processes training together, seen from one of them."""

    rank: int = 0
    world_size: int = 1
    local_rank: int = 0  # this process's index on its machine: its GPU
    device: torch.device = torch.device("cpu")

    @property
    def is_main(self) -> bool:
        """Rank 0 writes files, validates and talks to the user."""
        return self.rank == 0

    @property
    def distributed(self) -> bool:
        return self.world_size > 1

    def share(self, positions: list[int]) -> list[int]:
        """This process's examples of a global batch; empty when the batch has fewer examples than processes."""
        return positions[self.rank :: self.world_size]

    def sum(self, value: float) -> float:
        """The sum of `value` over all processes, on every process."""
        if not self.distributed:
            return value
        tensor = torch.tensor([value], dtype=torch.float64, device=self.device)
        dist.all_reduce(tensor, op=dist.ReduceOp.SUM)
        return tensor.item()

    def max(self, value: int) -> int:
        """The largest `value` of all processes, on every process: how they agree on a stop."""
        if not self.distributed:
            return value
        tensor = torch.tensor([value], dtype=torch.int64, device=self.device)
        dist.all_reduce(tensor, op=dist.ReduceOp.MAX)
        return int(tensor.item())

    def from_main(self, value: T) -> T:
        """Rank 0's `value` (any picklable object), on every process."""
        if not self.distributed:
            return value
        holder = [value]
        dist.broadcast_object_list(holder, src=0)
        return holder[0]

    def gather(self, value: Any) -> list:
        """Every process's `value`, in rank order, on every process."""
        if not self.distributed:
            return [value]
        values: list = [None] * self.world_size
        dist.all_gather_object(values, value)
        return values

    def replicate(self, model: torch.nn.Module) -> torch.nn.Module:
        """The module to run the training forward through: DDP around `model` when distributed."""
        if not self.distributed:
            return model
        return DistributedDataParallel(model, device_ids=[self.device.index] if self.device.type == "cuda" else None)

    @staticmethod
    def gradient_sync(replica: torch.nn.Module, sync: bool):
        """A context for one batch's forward and backward: with `sync` False, DDP keeps the gradients
        local (the batches of an update before its last one), sparing an all-reduce per batch."""
        if sync or not isinstance(replica, DistributedDataParallel):
            return contextlib.nullcontext()
        return replica.no_sync()


SINGLE_PROCESS = Ranks()


def torchrun_environment(environ: Optional[dict] = None) -> Optional[tuple[int, int, int]]:
    """(rank, world size, local rank) when torchrun started this process with more than one; else None."""
    environ = os.environ if environ is None else environ
    if int(environ.get("WORLD_SIZE", "1")) <= 1:
        return None
    return int(environ["RANK"]), int(environ["WORLD_SIZE"]), int(environ.get("LOCAL_RANK", "0"))


def is_main_process() -> bool:
    """Whether this process talks to the user; known before any process group exists."""
    environment = torchrun_environment()
    return environment is None or environment[0] == 0


def process_device(setting: str, local_rank: int, world_size: int, option: str = "train.device") -> torch.device:
    """The device of one of `world_size` processes: its own GPU (cuda:LOCAL_RANK), or the CPU."""
    if setting == "cpu" or (setting == "auto" and not torch.cuda.is_available()):
        return torch.device("cpu")
    if setting not in ("auto", "cuda"):
        raise ConfigError(
            f"{setting} names one GPU, but torchrun started {world_size} processes; "
            f"use auto or cuda, and each process takes cuda:LOCAL_RANK",
            option,
        )
    if local_rank >= torch.cuda.device_count():
        raise ConfigError(
            f"process {local_rank} on this machine needs cuda:{local_rank}, but "
            f"{torch.cuda.device_count()} GPUs are visible; start at most that many with "
            f"torchrun --nproc_per_node",
            option,
        )
    return torch.device("cuda", local_rank)


@contextlib.contextmanager
def process_group(device_setting: str) -> Iterator[Ranks]:
    """The processes of this training run, joined for the duration of the block: gloo on the CPU,
    NCCL on GPUs. A single process when not started by torchrun."""
    environment = torchrun_environment()
    if environment is None:
        yield SINGLE_PROCESS
        return
    rank, world_size, local_rank = environment
    device = process_device(device_setting, local_rank, world_size)
    if device.type == "cuda":
        torch.cuda.set_device(device)  # NCCL and the object collectives use the current device
    dist.init_process_group(
        "nccl" if device.type == "cuda" else "gloo", rank=rank, world_size=world_size, timeout=COLLECTIVE_TIMEOUT
    )
    try:
        yield Ranks(rank, world_size, local_rank, device)
    finally:
        dist.destroy_process_group()
