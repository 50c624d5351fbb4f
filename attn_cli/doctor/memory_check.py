"""The memory check: a training step's estimated memory (training/memory.py) against the device's."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Optional

import torch

from attn_cli.config import Config
from attn_cli.doctor.checks import Check
from attn_cli.training.memory import estimate_step_memory, gigabytes, memory_advice
from attn_cli.training.precision import resolve_precision

SECTION = "memory"
# Above this share of the memory a step is at risk: the estimate leaves out the allocator's slack,
# the libraries' workspaces and, on a CPU, everything else the machine runs.
WARN_SHARE = 0.7


def available_memory(device: torch.device, meminfo: Path = Path("/proc/meminfo")) -> tuple[int, str]:
    """The bytes a step may use on `device`, and where the number comes from: a GPU's total memory,
    or the memory Linux says it can give without swapping (MemAvailable)."""
    if device.type == "cuda":
        return torch.cuda.get_device_properties(device).total_memory, f"{torch.cuda.get_device_name(device)} total"
    try:
        for line in meminfo.read_text(encoding="utf-8").splitlines():
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) * 1024, "MemAvailable"
    except (OSError, ValueError, IndexError):
        pass
    # Not Linux: physical memory, as allocation.py counts it.
    return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES"), "physical memory"


def memory_check(
    cfg: Config, src_vocab_size: int, tgt_vocab_size: int, device: torch.device, memory_gb: Optional[float]
) -> Check:
    """Fails when the step does not fit, warns above WARN_SHARE; `memory_gb` checks against that
    many GB instead of this machine's device (planning for another machine)."""
    precision = resolve_precision(cfg.train.precision, device).name
    step = estimate_step_memory(cfg, src_vocab_size, tgt_vocab_size, precision, device.type)
    if memory_gb is not None:
        available, origin = int(memory_gb * 2**30), "--memory-gb"
    else:
        available, origin = available_memory(device)
    share = step.total / available
    parts = ", ".join(f"{name} {gigabytes(size)}" for name, size in step.parts().items() if size)
    checkpointing = ", gradient checkpointing" if cfg.train.gradient_checkpointing else ""
    found = (
        f"a step needs about {gigabytes(step.total)} ({share:.0%} of {gigabytes(available)}, {origin}) for the "
        f"worst batch, {step.batch.describe()} in {precision}{checkpointing}: {parts}"
    )
    numbers = {
        "estimate_bytes": step.total,
        "available_bytes": available,
        "share": round(share, 4),
        "rows": step.batch.rows,
        "source_length": step.batch.source_length,
        "target_length": step.batch.target_length,
        "precision": precision,
        "parts": step.parts(),
        "parameters": step.parameters,
    }
    status = "fail" if share > 1 else "warn" if share > WARN_SHARE else "pass"
    return Check(SECTION, "training step", status, found, memory_advice(cfg.train), numbers)
