"""The one precision switch: `train.precision` becomes one autocast context and one gradient scaler.

fp32 runs without autocast; bf16 and fp16 run the forward pass under autocast. Only fp16 needs
loss scaling (its small exponent range underflows gradients), so the scaler is enabled for fp16
alone and is a no-op otherwise. `auto` picks bf16 where the device runs it fast, fp16 with scaling
on CUDA GPUs older than Ampere, and fp32 everywhere else.
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass
from pathlib import Path

import torch

_CPU_BF16_FLAGS = ("amx_bf16", "avx512_bf16")  # /proc/cpuinfo flags of CPUs with native bf16 math


@dataclass(frozen=True)
class Precision:
    name: str  # fp32, bf16 or fp16: what runs, never "auto"
    reason: str  # why auto chose it; empty when the config named it

    def autocast(self, device: torch.device):
        if self.name == "fp32":
            return contextlib.nullcontext()
        dtype = torch.bfloat16 if self.name == "bf16" else torch.float16
        return torch.autocast(device_type=device.type, dtype=dtype)

    def grad_scaler(self, device: torch.device) -> torch.amp.GradScaler:
        return torch.amp.GradScaler(device.type, enabled=self.name == "fp16")

    def describe(self) -> str:
        return f"{self.name} (auto: {self.reason})" if self.reason else self.name


def cpu_bf16_flags(cpuinfo: Path = Path("/proc/cpuinfo")) -> list[str]:
    """The bf16 instruction-set flags this CPU reports; empty where /proc/cpuinfo does not exist."""
    try:
        text = cpuinfo.read_text(encoding="utf-8", errors="replace")
    except OSError:
        return []
    flags = set()
    for line in text.splitlines():
        if line.startswith("flags"):
            flags.update(line.partition(":")[2].split())
    return [flag for flag in _CPU_BF16_FLAGS if flag in flags]


def slow_here(name: str, device: torch.device) -> str:
    """Why precision `name` runs slowly on `device` (its arithmetic emulated), or "" where it runs fast."""
    if name == "fp32":
        return ""
    if device.type == "cuda":
        major, minor = torch.cuda.get_device_capability(device)
        if name == "bf16" and major < 8:
            return f"CUDA compute capability {major}.{minor} emulates bf16"
        return ""
    if name == "fp16":
        return "CPUs emulate fp16"
    if device.type == "cpu" and not cpu_bf16_flags():
        return f"this CPU ({torch.backends.cpu.get_cpu_capability()}) has no AMX or AVX-512 BF16 and emulates bf16"
    return ""


def resolve_precision(setting: str, device: torch.device) -> Precision:
    """The precision to run for `train.precision` on `device`."""
    if setting != "auto":
        return Precision(setting, "")
    if device.type == "cuda":
        major, minor = torch.cuda.get_device_capability(device)
        # Ampere (8.0) and later have bf16 tensor cores; older GPUs only emulate bf16, slowly.
        if major >= 8:
            return Precision("bf16", f"CUDA compute capability {major}.{minor} has bf16 tensor cores")
        return Precision("fp16", f"CUDA compute capability {major}.{minor} lacks fast bf16; fp16 with loss scaling")
    if device.type == "cpu":
        flags = cpu_bf16_flags()
        if flags:
            return Precision("bf16", f"the CPU has {' and '.join(flags)}")
        capability = torch.backends.cpu.get_cpu_capability()
        return Precision("fp32", f"the CPU ({capability}) has no AMX or AVX-512 BF16")
    return Precision("fp32", f"no fast reduced precision known for {device.type}")
