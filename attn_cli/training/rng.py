"""Every random number generator training draws from, captured and restored as one state, so a
resumed run draws the same dropout masks as a run that never stopped."""

from __future__ import annotations

import random

import torch


def capture_rng_state() -> dict:
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
