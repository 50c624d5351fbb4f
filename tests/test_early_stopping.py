"""Early stopping ends training after `patience` validations without improvement, and says so."""

import pytest
from conftest import tiny_config, train_tiny

from attn_cli.config import ConfigError
from attn_cli.training.early_stopping import EarlyStopping


def feed(stopper, values, key):
    return [stopper.update({"step": 100 * (i + 1), key: value}) for i, value in enumerate(values)]


def test_bleu_must_rise_and_loss_must_fall_within_the_patience():
    # A tie is no improvement.
    assert feed(EarlyStopping("bleu", patience=2), [10.0, 12.0, 12.0, 11.0], "valid_bleu") == [False] * 3 + [True]
    assert feed(EarlyStopping("bleu", patience=2), [10.0, 9.0, 11.0, 10.0], "valid_bleu") == [False] * 4
    assert feed(EarlyStopping("loss", patience=1), [3.0, 2.5, 2.6], "valid_loss") == [False, False, True]


def test_the_count_survives_a_resume_and_the_reason_names_the_best():
    stopper = EarlyStopping("loss", patience=3)
    feed(stopper, [3.0, 2.0, 2.5, 2.4], "valid_loss")
    resumed = EarlyStopping("loss", patience=3)
    resumed.load_state_dict(stopper.state_dict())
    assert resumed.update({"step": 500, "valid_loss": 2.1})
    assert "not improved for 3 validations" in resumed.reason() and "2.000, was at step 200" in resumed.reason()


def test_bleu_early_stopping_needs_validation_bleu():
    with pytest.raises(ConfigError, match=r"train\.early_stopping\.metric: 'bleu' needs train\.valid_bleu: true"):
        tiny_config("train.valid_bleu=false", "train.early_stopping={patience: 2}")
    with pytest.raises(ConfigError, match=r"train\.early_stopping\.patience: 0 must be >= 1"):
        tiny_config("train.early_stopping={metric: loss, patience: 0}")


def test_training_stops_once_validation_stops_improving(tmp_path, monkeypatch):
    from attn_cli.training.trainer import Trainer

    monkeypatch.setattr(Trainer, "validation_loss", lambda self: 4.0)  # a plateau from the first validation
    result = train_tiny(
        tmp_path, "train.valid_every=5", "train.valid_bleu=false", "train.early_stopping={metric: loss, patience: 2}"
    )
    assert result.exit_code == 0, result.output
    assert "early stopping: validation loss has not improved for 2 validations" in result.output
    assert "trained 15 steps" in result.output  # best at 5, no better at 10 and 15, of max_steps 40
