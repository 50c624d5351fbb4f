"""The checks of the machine a run would train on: torch, the device train.device resolves to,
reduced precision, the attention kernels and threads (section "environment"), and whether a
training step's estimated memory (training/memory.py) fits in the device's, or in --memory-gb
(section "memory"). Together because they ask one question: can this machine run this config,
and how fast."""

from __future__ import annotations

import os
import platform
from pathlib import Path
from typing import Optional

import torch

from attn_cli.config import Config, ConfigError
from attn_cli.device import resolve_device
from attn_cli.doctor.checks import Check
from attn_cli.training.memory import estimate_step_memory, gigabytes, memory_advice
from attn_cli.training.precision import cpu_bf16_flags, resolve_precision, slow_here

SECTION = "environment"


def environment_checks(cfg: Config) -> tuple[list[Check], Optional[torch.device]]:
    """The checks, and the device train.device resolves to (None when it resolves to none)."""
    checks = [
        Check(
            SECTION,
            "torch",
            "pass",
            f"torch {torch.__version__}, Python {platform.python_version()}",
            numbers={"torch": torch.__version__},
        )
    ]
    try:
        device = resolve_device(cfg.train.device)
    except ConfigError as error:
        checks.append(Check(SECTION, "device", "fail", str(error), "set train.device: auto"))
        return checks, None
    checks += [_device(cfg, device), _precision(cfg, device), _attention_kernels(device), _threads(cfg)]
    return checks, device


def _device(cfg: Config, device: torch.device) -> Check:
    setting = f"train.device: {cfg.train.device} -> {device}"
    if device.type == "cuda":
        properties = torch.cuda.get_device_properties(device)
        found = (
            f"{setting}: {properties.name}, {properties.total_memory / 2**30:,.1f} GB, "
            f"compute capability {properties.major}.{properties.minor}"
        )
        return Check(
            SECTION,
            "device",
            "pass",
            found,
            numbers={"device": str(device), "name": properties.name, "memory_bytes": properties.total_memory},
        )
    gpu = "no CUDA GPU visible" if not torch.cuda.is_available() else f"{torch.cuda.device_count()} CUDA GPUs unused"
    fix = "set train.device: auto" if torch.cuda.is_available() else ""
    return Check(SECTION, "device", "warn" if fix else "pass", f"{setting} ({gpu})", fix, {"device": str(device)})


def _precision(cfg: Config, device: torch.device) -> Check:
    """What reduced precision the device runs fast, and whether train.precision asks for a slow one."""
    auto = resolve_precision("auto", device)
    if device.type == "cuda":
        fast_bf16 = not slow_here("bf16", device)
        support = f"bf16 {'fast' if fast_bf16 else 'emulated (slow)'}, fp16 fast (with loss scaling)"
    else:
        flags = cpu_bf16_flags()
        support = (
            f"bf16 fast ({' and '.join(flags)})"
            if flags
            else f"bf16 emulated (no AMX or AVX-512 BF16; CPU capability {torch.backends.cpu.get_cpu_capability()})"
        )
        support += "; fp16 slow on CPUs"
    chosen = resolve_precision(cfg.train.precision, device).name
    found = f"train.precision: {cfg.train.precision}; {support}; auto picks {auto.name}"
    numbers = {"precision": chosen, "auto": auto.name}
    if slow_here(chosen, device):
        return Check(
            SECTION,
            "precision",
            "warn",
            found + f": {chosen} runs slowly here",
            f"set train.precision: auto ({auto.name})",
            numbers,
        )
    return Check(SECTION, "precision", "pass", found, "", numbers)


def _attention_kernels(device: torch.device) -> Check:
    """Which scaled_dot_product_attention kernels can run; those that keep no (length x length)
    weights for backward are what makes long sequences fit."""
    if device.type == "cuda":
        backends = {
            "flash": torch.backends.cuda.flash_sdp_enabled() and torch.backends.cuda.is_flash_attention_available(),
            "memory-efficient": torch.backends.cuda.mem_efficient_sdp_enabled(),
            "cuDNN": torch.backends.cuda.cudnn_sdp_enabled(),
            "math": torch.backends.cuda.math_sdp_enabled(),
        }
        enabled = [name for name, on in backends.items() if on]
        found = (
            f"SDPA backends enabled: {', '.join(enabled) or 'none'}; attn passes padding masks, which the "
            f"memory-efficient and cuDNN kernels take (flash takes none)"
        )
        if not backends["memory-efficient"]:
            return Check(
                SECTION,
                "attention kernels",
                "warn",
                found + "; the math kernel keeps every score tensor",
                "install a torch build with CUDA memory-efficient attention, or set train.gradient_checkpointing: true",
                backends,
            )
        return Check(SECTION, "attention kernels", "pass", found, "", backends)
    found = (
        "CPU: SDPA runs its fused flash kernel for fp32 (no score tensor kept for backward), the math kernel "
        "as fallback; bf16 on the CPU takes attn's explicit formula, which keeps the weights"
    )
    return Check(
        SECTION, "attention kernels", "pass", found, "", {"cpu_capability": torch.backends.cpu.get_cpu_capability()}
    )


def _threads(cfg: Config) -> Check:
    """Torch's threads against the cores this process may run on: more threads than cores only
    makes them wait for each other."""
    usable = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
    threads = cfg.train.threads or torch.get_num_threads()
    origin = "train.threads" if cfg.train.threads else "torch's default"
    found = f"{threads} threads ({origin}), {usable} usable cores of {os.cpu_count()}"
    numbers = {"threads": threads, "usable_cores": usable, "cpu_count": os.cpu_count()}
    if threads > usable:
        return Check(
            SECTION, "threads", "warn", found + ": more threads than cores", f"set train.threads: {usable}", numbers
        )
    return Check(SECTION, "threads", "pass", found, "", numbers)


# The memory check: a training step's estimated memory against the device's.

MEMORY_SECTION = "memory"
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
    return Check(MEMORY_SECTION, "training step", status, found, memory_advice(cfg.train), numbers)
