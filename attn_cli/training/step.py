"""One optimizer update: forward and backward under the precision's autocast, gradient scaling,
clipping, the optimizer and schedule steps, and the guard against non-finite losses and gradients."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Callable

import torch
from torch import nn

from attn_cli.data.collate import Batch
from attn_cli.errors import UserError
from attn_cli.model import Transformer
from attn_cli.training.distributed import SINGLE_PROCESS, Ranks
from attn_cli.training.loss import projected_label_smoothed_loss
from attn_cli.training.precision import Precision


class TrainingDiverged(UserError, RuntimeError):
    """Too many non-finite losses in a row; the message says what to change."""


def adamw(parameters, lr: float, betas: tuple[float, float], weight_decay: float) -> torch.optim.AdamW:
    """AdamW updating all parameters in one fused kernel when they live on the CPU or a CUDA device,
    as Transformers' Trainer does by default, instead of PyTorch's default loop over the parameters
    (docs/benchmarks.md has the figures)."""
    parameters = list(parameters)
    fused = bool(parameters) and parameters[0].device.type in ("cpu", "cuda")
    return torch.optim.AdamW(parameters, lr=lr, betas=betas, weight_decay=weight_decay, fused=fused)


class TrainingObjective(nn.Module):
    """The training forward: a batch's summed label-smoothed loss over its target tokens.

    A module of its own so that DistributedDataParallel and torch.compile wrap the loss together
    with the model: the loss projects the decoder's hidden states itself and never builds the
    logits (see `attn_cli.training.loss`). Its parameters are the model's.
    """

    def __init__(self, model: Transformer, label_smoothing: float):
        super().__init__()
        self.model = model
        self.label_smoothing = label_smoothing

    def forward(self, src: torch.Tensor, tgt_in: torch.Tensor, tgt_out: torch.Tensor) -> torch.Tensor:
        hidden = self.model.decode_hidden(tgt_in, self.model.encode(src))
        return projected_label_smoothed_loss(
            hidden, self.model.output_weight, tgt_out, self.label_smoothing, self.model.output_bias
        )


@dataclass
class StepResult:
    loss: float  # mean loss per target token
    target_tokens: int
    applied: bool  # False: the loss or (with clipping, or in fp16) the gradients were not finite; parameters untouched


class TrainingStep:
    """Turns batches into one update of the parameters.

    `objective` maps (src, tgt_in, tgt_out) to the summed loss: a `TrainingObjective`, or its
    DistributedDataParallel or torch.compile wrapper; `model` owns the parameters. With several
    processes, `replica` is the DistributedDataParallel module `objective` runs through, and each
    process passes its own share of the update's batches.
    """

    def __init__(
        self,
        model: torch.nn.Module,
        objective: Callable,
        optimizer: torch.optim.Optimizer,
        scheduler: torch.optim.lr_scheduler.LRScheduler,
        scaler: torch.amp.GradScaler,
        precision: Precision,
        device: torch.device,
        clip_norm: float,
        ranks: Ranks = SINGLE_PROCESS,
        replica: torch.nn.Module | None = None,
    ):
        self.model = model
        self.objective = objective
        self.ranks = ranks
        self.replica = replica if replica is not None else model
        self.optimizer = optimizer
        self.scheduler = scheduler
        self.scaler = scaler
        self.precision = precision
        self.device = device
        self.clip_norm = clip_norm

    def __call__(self, batches: list[Batch]) -> StepResult:
        """One update from the summed gradients of `batches`.

        Each batch's summed loss is divided by the target tokens of all the batches together, so
        the gradient is that of the mean loss over every token: several batches give the update
        that their union in one batch would. With several processes the tokens are those of every
        process's batches, and the loss is multiplied by the number of processes because DDP averages
        the gradients over them: the update is that of one process over all the batches.
        """
        self.model.train()
        tokens = int(self.ranks.sum(sum(batch.num_target_tokens for batch in batches)))
        loss_total = 0.0
        for index, batch in enumerate(batches):
            with self.ranks.gradient_sync(self.replica, sync=index == len(batches) - 1):
                with self.precision.autocast(self.device):
                    loss_sum = self.objective(batch.src, batch.tgt_in, batch.tgt_out)
                self.scaler.scale(loss_sum * self.ranks.world_size / tokens).backward()
            loss_total += loss_sum.item()
        # Every process sees the same total, so all of them skip a non-finite update together.
        loss_total = self.ranks.sum(loss_total)
        if not math.isfinite(loss_total):
            # An update from a non-finite loss would poison every parameter it touches.
            self.optimizer.zero_grad(set_to_none=True)
            return StepResult(loss_total / tokens, tokens, applied=False)
        if self.clip_norm > 0:
            self.scaler.unscale_(self.optimizer)  # clip the true gradients, not the scaled ones
            norm = torch.nn.utils.clip_grad_norm_(self.model.parameters(), self.clip_norm)
            # A finite loss can still have non-finite gradients (an overflow in the backward). In
            # fp16 the scaler skips those updates and lowers its scale (below); otherwise they are
            # skipped here. The gradients are already summed over processes, so every process decides alike.
            if not self.scaler.is_enabled() and not math.isfinite(norm.item()):
                self.optimizer.zero_grad(set_to_none=True)
                return StepResult(loss_total / tokens, tokens, applied=False)
        scale = self.scaler.get_scale()
        self.scaler.step(self.optimizer)  # skips the update when fp16 gradients overflowed
        self.scaler.update()
        self.optimizer.zero_grad(set_to_none=True)
        # The scaler lowers its scale exactly when it found overflowed gradients and skipped the
        # update: that is no update, so the schedule does not advance and the step is not counted.
        if self.scaler.get_scale() < scale:
            return StepResult(loss_total / tokens, tokens, applied=False)
        self.scheduler.step()
        return StepResult(loss_total / tokens, tokens, applied=True)


class NonfiniteGuard:
    """Stops training when `limit` skipped steps come in a row (the run's state counts them all)."""

    def __init__(self, limit: int):
        self.limit = limit
        self.in_a_row = 0

    def record(self, result: StepResult, step: int) -> None:
        if result.applied:
            self.in_a_row = 0
            return
        self.in_a_row += 1
        if self.in_a_row >= self.limit:
            raise TrainingDiverged(
                f"training stopped: {self.in_a_row} steps in a row had a non-finite loss or gradients "
                f"(after step {step:,}; "
                f"train.max_nonfinite_steps={self.limit}); lower train.lr, use train.precision: bf16 or fp32 "
                f"instead of fp16, or raise train.warmup_steps"
            )
