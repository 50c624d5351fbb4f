"""What the benchmark scripts record about the machine they ran on."""

from __future__ import annotations

import os
import platform
import time
from pathlib import Path

import torch


def machine_info() -> dict:
    cpu = platform.processor() or platform.machine()
    cpuinfo = Path("/proc/cpuinfo")
    if cpuinfo.exists():
        names = [line.split(":", 1)[1].strip() for line in cpuinfo.read_text().splitlines() if line.startswith("model name")]
        cpu = names[0] if names else cpu
    return {"cpu": cpu, "logical_cpus": os.cpu_count(), "platform": platform.platform(), "python": platform.python_version()}


def memory_read_gb_s(megabytes: int = 400, repeats: int = 5) -> float:
    """How fast torch's threads read memory: the best of `repeats` sums over a float32 tensor far
    larger than a core's caches, in GB/s. A decoding step at batch 1 reads every weight once; where
    a large shared L3 cache keeps part of the weights, a step can read them faster than this."""
    data = torch.ones(megabytes * 1_000_000 // 4)
    data.sum()
    best = float("inf")
    for _ in range(repeats):
        started = time.perf_counter()
        data.sum()
        best = min(best, time.perf_counter() - started)
    return data.numel() * 4 / best / 1e9
