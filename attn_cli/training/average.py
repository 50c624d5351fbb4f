"""Checkpoint averaging: one model whose weights are the mean of several checkpoints' weights.

Averaging the last few checkpoints of a run smooths out the noise of the final updates and
usually translates a little better than any one of them (Vaswani et al., 2017, averaged the last
5 or 20). The mean is taken in fp32 whatever the stored dtype; integer buffers (counters, ids)
cannot be averaged and are taken from the newest checkpoint.
"""

from __future__ import annotations

from pathlib import Path
from typing import Sequence

import torch

from attn_cli.training.checkpoint import Checkpoint, CheckpointError, load_checkpoint, save_checkpoint

StateDict = dict[str, torch.Tensor]


def average_state_dicts(states: Sequence[StateDict]) -> StateDict:
    """The elementwise mean of floating-point entries; other entries from the last (newest) state."""
    newest = states[-1]
    averaged = {}
    for name, tensor in newest.items():
        if not tensor.is_floating_point():
            averaged[name] = tensor.clone()
            continue
        total = torch.zeros(tensor.shape, dtype=torch.float32)
        for state in states:
            total += state[name].float()
        averaged[name] = (total / len(states)).to(tensor.dtype)
    return averaged


def average_checkpoints(paths: Sequence[Path], output: Path) -> Checkpoint:
    """Average the weights of `paths` (oldest first) into a new checkpoint at `output`.

    The result keeps the newest checkpoint's config, tokenizers, step and epoch, and no training
    state: it is for translating and scoring, not for resuming.
    """
    if not paths:
        raise CheckpointError("no checkpoints to average")
    newest = load_checkpoint(paths[-1])
    states, steps = [], []
    for path in paths:
        loaded = newest if path == paths[-1] else load_checkpoint(path)
        if loaded.config.model != newest.config.model:
            raise CheckpointError(
                f"{path} has a different model config than {paths[-1]}; only checkpoints of one run can be averaged"
            )
        states.append(loaded.model.state_dict())
        steps.append(loaded.step)
    newest.model.load_state_dict(average_state_dicts(states))
    metrics = {"averaged_steps": steps}
    save_checkpoint(output, newest.config, newest.tokenizers, newest.model, newest.step, newest.epoch, metrics)
    newest.metrics = metrics
    return newest
