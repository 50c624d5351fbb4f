"""One optimizer update: a non-finite loss skips it without touching the parameters, and too many
in a row stop training with advice."""

import math

import pytest
import torch
from support.models import parameters_of, random_examples, small_model

from attn_cli.data.collate import collate
from attn_cli.training import step as training_step
from attn_cli.training.precision import resolve_precision
from attn_cli.training.state import load_optimizer_state
from attn_cli.training.step import (
    NonfiniteGuard,
    StepResult,
    TrainingDiverged,
    TrainingObjective,
    TrainingStep,
    adamw,
)

CPU = torch.device("cpu")


def make_step(model, precision="fp32"):
    optimizer = adamw(model.parameters(), 1e-2, (0.9, 0.999), 0.0)  # fused, as attn trains
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda step: 1.0)
    chosen = resolve_precision(precision, CPU)
    return TrainingStep(
        model, TrainingObjective(model, 0.1), optimizer, scheduler, chosen.grad_scaler(CPU), chosen, CPU, clip_norm=1.0
    )


def test_a_nan_loss_skips_the_update_and_leaves_parameters_unchanged(monkeypatch):
    model = small_model()
    step = make_step(model)
    before = parameters_of(model)
    real_loss = training_step.projected_label_smoothed_loss
    monkeypatch.setattr(training_step, "projected_label_smoothed_loss", lambda *args: real_loss(*args) * float("nan"))
    result = step([collate(random_examples(6, seed=0))])
    assert not result.applied
    assert all(torch.equal(before[name], tensor) for name, tensor in model.state_dict().items())
    assert all(p.grad is None for p in model.parameters()), "the poisoned gradients must be dropped"
    assert step.optimizer.state_dict()["state"] == {} and step.scheduler.last_epoch == 0

    monkeypatch.setattr(training_step, "projected_label_smoothed_loss", real_loss)
    assert step([collate(random_examples(6, seed=0))]).applied
    assert not torch.equal(before["tgt_embedding.weight"], model.state_dict()["tgt_embedding.weight"])


@pytest.mark.parametrize("precision", ["fp32", "bf16", "fp16"])
def test_non_finite_gradients_of_a_finite_loss_skip_the_update(precision):
    model = small_model()
    step = make_step(model, precision)
    before = parameters_of(model)
    hook = model.decoder_layers[0].feed_forward[0].bias.register_hook(lambda grad: grad * float("inf"))
    result = step([collate(random_examples(6, seed=0))])
    # In fp16 the gradient scaler finds the overflow and skips the update itself.
    assert math.isfinite(result.loss) and not result.applied
    assert all(torch.equal(before[name], tensor) for name, tensor in model.state_dict().items())
    assert all(p.grad is None for p in model.parameters()) and step.scheduler.last_epoch == 0
    hook.remove()
    assert step([collate(random_examples(6, seed=0))]).applied


def test_fp16_updates_through_the_gradient_scaler():
    model = small_model()
    step = make_step(model, "fp16")
    result = step([collate(random_examples(6, seed=0))])
    assert result.applied and step.scaler.is_enabled()
    assert "scale" in step.scaler.state_dict()
    assert all(torch.isfinite(p).all() for p in model.parameters())


def test_an_fp16_update_the_scaler_skips_is_not_counted_and_leaves_the_schedule():
    model = small_model()
    step = make_step(model, "fp16")
    assert step([collate(random_examples(6, seed=0))]).applied and step.scheduler.last_epoch == 1
    step.scaler.update(2.0**60)  # the next backward overflows in fp16, though the loss is finite
    before, scale = parameters_of(model), step.scaler.get_scale()
    result = step([collate(random_examples(6, seed=1))])
    assert math.isfinite(result.loss) and not result.applied
    assert step.scaler.get_scale() < scale and step.scheduler.last_epoch == 1
    assert all(torch.equal(before[name], tensor) for name, tensor in model.state_dict().items())


def test_enough_nonfinite_losses_in_a_row_stop_training_with_advice():
    guard = NonfiniteGuard(limit=3)
    skipped, applied = StepResult(float("nan"), 10, False), StepResult(1.0, 10, True)
    for result in (skipped, skipped, applied, skipped, skipped):  # a good step resets the count
        guard.record(result, step=5)
    assert guard.in_a_row == 2
    with pytest.raises(TrainingDiverged) as stopped:
        guard.record(skipped, step=5)
    message = str(stopped.value)
    assert "train.max_nonfinite_steps=3" in message
    assert "train.lr" in message and "train.precision" in message and "train.warmup_steps" in message


def test_accumulating_two_batches_gives_the_update_of_their_union():
    # Plain SGD without clipping makes the update proportional to the gradient, so a wrong loss
    # normalisation (say, each batch by its own tokens) changes it; Adam's first step would hide that.
    first, second = random_examples(3, seed=1), random_examples(5, seed=2)
    assert collate(first).num_target_tokens != collate(second).num_target_tokens
    updated = []
    for batches in ([collate(first), collate(second)], [collate(first + second)]):
        torch.manual_seed(0)
        model = small_model()
        optimizer = torch.optim.SGD(model.parameters(), lr=1.0)
        scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda step: 1.0)
        chosen = resolve_precision("fp32", CPU)
        step = TrainingStep(
            model,
            TrainingObjective(model, 0.1),
            optimizer,
            scheduler,
            chosen.grad_scaler(CPU),
            chosen,
            CPU,
            clip_norm=0.0,
        )
        result = step(batches)
        updated.append((parameters_of(model), result))
    (accumulated, accumulated_result), (union, union_result) = updated
    assert accumulated_result.target_tokens == union_result.target_tokens
    assert abs(accumulated_result.loss - union_result.loss) < 1e-5
    for name, tensor in union.items():
        torch.testing.assert_close(accumulated[name], tensor, rtol=1e-5, atol=1e-6, msg=name)


def test_a_resumed_optimizer_keeps_the_fused_kernel_and_the_saved_moments():
    """load_state_dict would take `fused` from the checkpoint: one saved by the plain AdamW loop
    must still resume into the fused kernel, with its moments and step count."""
    model = small_model()
    plain = torch.optim.AdamW(model.parameters(), lr=1e-2)
    batch = collate(random_examples(4, seed=1))
    model(batch.src, batch.tgt_in).sum().backward()
    plain.step()
    resumed = adamw(model.parameters(), 1e-2, (0.9, 0.999), 0.01)
    assert resumed.param_groups[0]["fused"]
    load_optimizer_state(resumed, plain.state_dict())
    assert resumed.param_groups[0]["fused"]
    first = next(model.parameters())
    assert torch.equal(resumed.state[first]["exp_avg"], plain.state[first]["exp_avg"])
    assert float(resumed.state[first]["step"]) == 1.0
    resumed.step()
    assert float(resumed.state[first]["step"]) == 2.0
