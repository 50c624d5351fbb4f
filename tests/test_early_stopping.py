"""Early stopping ends training after `patience` validations that do not beat the best, and says so;
"best" has one rule, shared by best.pt and early stopping."""

import pytest
from support.runs import tiny_config, train_tiny

from attn_cli.checkpoint import Checkpoint
from attn_cli.config import ConfigError, EarlyStoppingConfig, TrainConfig
from attn_cli.training.state import TrainState, best_metric


def feed(state, values, key, metric, train=None):
    """Record one validation per value; whether training stops after each."""
    stops = []
    for i, value in enumerate(values):
        state.step = 100 * (i + 1)
        state.record_validation({"step": state.step, key: value}, metric)
        stops.append(state.should_stop_early(train) if train else False)
    return stops


def stopping(metric, patience):
    return TrainConfig(early_stopping=EarlyStoppingConfig(metric, patience))


def test_bleu_must_rise_and_loss_must_fall_within_the_patience():
    # A tie is no improvement.
    bleu2 = stopping("bleu", 2)
    assert feed(TrainState(), [10.0, 12.0, 12.0, 11.0], "valid_bleu", "bleu", bleu2) == [False] * 3 + [True]
    assert feed(TrainState(), [10.0, 9.0, 11.0, 10.0], "valid_bleu", "bleu", bleu2) == [False] * 4
    loss1 = stopping("loss", 1)
    assert feed(TrainState(), [3.0, 2.5, 2.6], "valid_loss", "loss", loss1) == [False, False, True]


def test_the_best_metric_is_the_early_stopping_one_or_else_bleu():
    assert best_metric(TrainConfig()) == "bleu"
    assert best_metric(TrainConfig(valid_bleu=False)) == "loss"
    assert best_metric(stopping("loss", 3)) == "loss"
    assert best_metric(stopping("bleu", 3)) == "bleu"


def test_best_checkpoint_and_early_stopping_agree_when_stopping_on_the_loss():
    """With early stopping on the loss and BLEU validated too, best.pt is chosen by the loss: the
    validation with the best BLEU but a worse loss is not the best."""
    state, train = TrainState(), stopping("loss", 2)
    first = {"step": 100, "valid_loss": 2.0, "valid_bleu": 10.0}
    assert state.record_validation(first, best_metric(train))
    assert not state.record_validation({"step": 200, "valid_loss": 2.5, "valid_bleu": 20.0}, best_metric(train))
    assert state.best_metrics == first and state.stale_validations == 1


def test_a_bleu_tie_is_broken_by_the_lower_loss():
    state = TrainState()
    assert state.record_validation({"step": 1, "valid_bleu": 10.0, "valid_loss": 3.0}, "bleu")
    assert not state.record_validation({"step": 2, "valid_bleu": 10.0, "valid_loss": 3.5}, "bleu")
    assert state.record_validation({"step": 3, "valid_bleu": 10.0, "valid_loss": 2.5}, "bleu")


def test_the_count_survives_a_checkpoint_and_the_reason_names_the_best():
    train = stopping("loss", 3)
    state = TrainState()
    feed(state, [3.0, 2.0, 2.5, 2.4], "valid_loss", "loss")
    saved = {"batches_done": 0, **_optimization_free(state)}
    resumed = TrainState.from_checkpoint(Checkpoint(None, None, None, state.step, 1, {}, saved))
    assert resumed == TrainState(state.step, 1, 0, 0.0, state.validated_step, state.best_metrics, 2, 0)
    resumed.step = 500
    resumed.record_validation({"step": 500, "valid_loss": 2.1}, "loss")
    assert resumed.should_stop_early(train)
    reason = resumed.early_stopping_reason(train)
    assert "not improved for 3 validations" in reason and "2.000, was at step 200" in reason


def _optimization_free(state):
    """What to_checkpoint writes of the state itself (the optimizer's parts are others' to test)."""
    return {
        "elapsed": 0.0,
        "validated_step": state.validated_step,
        "best_metrics": state.best_metrics,
        "stale_validations": state.stale_validations,
        "nonfinite_steps": state.nonfinite_steps,
    }


def test_a_checkpoint_of_the_earlier_format_keeps_its_early_stopping_count():
    old = {"batches_done": 3, "elapsed": 5.0, "validated_step": 40, "best_metrics": {"step": 20}}
    old.update(nonfinite_steps=1, early_stopping={"metric": "loss", "best": 2.0, "best_step": 20, "stale": 2})
    assert TrainState.from_checkpoint(Checkpoint(None, None, None, 40, 2, {}, old)).stale_validations == 2


def test_bleu_early_stopping_needs_validation_bleu():
    with pytest.raises(ConfigError, match=r"train\.early_stopping\.metric: 'bleu' needs train\.valid_bleu: true"):
        tiny_config("train.valid_bleu=false", "train.early_stopping={patience: 2}")
    with pytest.raises(ConfigError, match=r"train\.early_stopping\.patience: 0 must be >= 1"):
        tiny_config("train.early_stopping={metric: loss, patience: 0}")


@pytest.mark.slow  # a training run
def test_training_stops_once_validation_stops_improving(tmp_path, monkeypatch):
    from attn_cli.training.trainer import Trainer

    monkeypatch.setattr(Trainer, "validation_loss", lambda self: 4.0)  # a plateau from the first validation
    result = train_tiny(
        tmp_path, "train.valid_every=5", "train.valid_bleu=false", "train.early_stopping={metric: loss, patience: 2}"
    )
    assert result.exit_code == 0, result.output
    assert "early stopping: validation loss has not improved for 2 validations" in result.output
    assert "trained 15 steps" in result.output  # best at 5, no better at 10 and 15, of max_steps 40
