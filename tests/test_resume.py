"""A run stopped and resumed ends exactly where the run that never stopped ends."""

import json
import os
import signal

import pytest
import torch
from support.runs import tiny_config, train_tiny

from attn_cli.config import ConfigError
from attn_cli.training.state import resume_config

# Dropout on, so the resumed run must also continue the random number streams; two batches per
# update, so the position inside the epoch counts batches, not steps; pairs recased and joined, so
# each epoch's recased and joined pairs must be drawn again alike.
SETTINGS = [
    "model.dropout=0.1",
    "train.accumulate=2",
    "train.valid_every=10",
    "train.valid_bleu=false",
    "train.join.rate=0.3",
    "train.casing.upper=0.1",
    "train.casing.title=0.1",
]


def train(run_dir, *settings, resume=False):
    return train_tiny(run_dir, *SETTINGS, *settings, resume=resume)


def checkpoint(run_dir, name="last.pt"):
    return torch.load(run_dir / "checkpoints" / name, weights_only=False)


def metrics_without_time(run_dir):
    lines = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    return [{k: v for k, v in m.items() if k != "elapsed"} for m in lines]


def assert_same_tensors(left, right):
    if isinstance(left, torch.Tensor):
        assert torch.equal(left, right)
    elif isinstance(left, dict):
        assert left.keys() == right.keys()
        for key in left:
            assert_same_tensors(left[key], right[key])
    elif isinstance(left, (list, tuple)):
        assert len(left) == len(right)
        for a, b in zip(left, right):
            assert_same_tensors(a, b)
    else:
        assert left == right


@pytest.fixture(scope="module")
def straight_run(tmp_path_factory):
    """30 steps that never stopped: what every stopped and resumed run must reproduce."""
    run_dir = tmp_path_factory.mktemp("straight")
    result = train(run_dir, "train.max_steps=30")
    assert result.exit_code == 0, result.output
    return run_dir


def assert_same_run(actual_dir, expected_dir):
    expected, actual = checkpoint(expected_dir), checkpoint(actual_dir)
    assert (actual["step"], actual["epoch"]) == (expected["step"], expected["epoch"]) == (30, expected["epoch"])
    assert_same_tensors(actual["model"], expected["model"])
    assert_same_tensors(actual["training_state"]["optimizer"], expected["training_state"]["optimizer"])
    assert actual["training_state"]["batches_done"] == expected["training_state"]["batches_done"]
    assert checkpoint(actual_dir, "best.pt")["step"] == checkpoint(expected_dir, "best.pt")["step"]


@pytest.mark.slow  # three training runs
def test_stopping_and_resuming_gives_bitwise_the_uninterrupted_run(straight_run, tmp_path, monkeypatch):
    resumed = tmp_path / "resumed"
    first = train(resumed, "train.max_steps=15")  # stops mid-epoch, between validations
    assert first.exit_code == 0, first.output
    stopped = checkpoint(resumed)
    assert stopped["step"] == 15 and 0 < stopped["training_state"]["batches_done"]

    # A resume that fails to start leaves the run's config as it was, and a metrics line that a
    # kill cut short does not stop the next one.
    from attn_cli.data import prepare
    from attn_cli.data.corpus import DataError
    from attn_cli.training import setup

    def data_gone(*args, **kwargs):
        raise DataError("data gone")

    config_before = (resumed / "config.yaml").read_bytes()
    with monkeypatch.context() as failing:
        failing.setattr(setup, "tokenizers_and_data", data_gone)
        failed = train(resumed, "train.max_steps=30", resume=True)
    assert failed.exit_code == 2 and "data gone" in failed.output
    assert (resumed / "config.yaml").read_bytes() == config_before
    with (resumed / "metrics.jsonl").open("a") as log:
        log.write('{"step": 20, "valid_lo')

    with monkeypatch.context() as prepared_once:  # the resume trains on the data prepared at the start
        prepared_once.setattr(prepare, "read_split", data_gone)
        second = train(resumed, "train.max_steps=30", resume=True)
    assert second.exit_code == 0, second.output
    assert "resume: train.max_steps: 15 -> 30" in second.output

    assert_same_run(resumed, straight_run)
    # The resumed run's metrics: 10 and the stop at 15 from the first part, then 20 and 30.
    assert [m["step"] for m in metrics_without_time(resumed)] == [10, 15, 20, 30]
    assert [m for m in metrics_without_time(resumed) if m["step"] != 15] == metrics_without_time(straight_run)


def test_resume_without_a_last_checkpoint_says_so(tmp_path):
    result = train(tmp_path / "empty", resume=True)
    assert result.exit_code == 2
    assert "nothing to resume" in result.output and "without --resume" in result.output


@pytest.mark.slow  # two training runs
def test_a_run_stopped_while_writing_its_first_last_pt_resumes_from_its_best_and_ends_exactly(straight_run, tmp_path):
    """last.pt is written after best.pt at each validation: a kill between them at the first
    validation leaves best.pt alone, which holds the same resume state."""
    run_dir = tmp_path / "cut"
    assert train(run_dir, "train.max_steps=10").exit_code == 0
    (run_dir / "checkpoints" / "last.pt").unlink()  # as a kill before it was renamed into place leaves it
    refused = train(run_dir, "train.max_steps=30")
    assert refused.exit_code == 2 and "--resume" in refused.output
    result = train(run_dir, "train.max_steps=30", resume=True)
    assert result.exit_code == 0, result.output
    assert "continuing from" in result.output and "best.pt, of step 10" in result.output
    assert_same_run(run_dir, straight_run)


def test_resume_allows_a_longer_run_and_refuses_a_different_model(tmp_path):
    saved = tiny_config(run_dir=tmp_path)
    longer = tiny_config("train.max_steps=400", run_dir=tmp_path)
    resumed, changes = resume_config(longer, saved, tmp_path / "last.pt")
    assert resumed.train.max_steps == 400 and changes == ["train.max_steps: 40 -> 400"]

    wider = tiny_config("model.d_model=64", run_dir=tmp_path)
    with pytest.raises(ConfigError, match=r"^model\.d_model: 64 differs from 32 in .*--config .*config\.yaml"):
        resume_config(wider, saved, tmp_path / "last.pt")
    reseeded = tiny_config("train.seed=2", run_dir=tmp_path)
    with pytest.raises(ConfigError, match=r"^train\.seed: 2 differs from 1"):
        resume_config(reseeded, saved, tmp_path / "last.pt")


@pytest.mark.slow  # two training runs
def test_sigterm_saves_at_an_update_boundary_and_resumes_exactly(straight_run, tmp_path, monkeypatch):
    from attn_cli.training.trainer import Trainer

    real_step = Trainer.train_step

    def terminated_during_step_8(self, batches):
        if self.state.step == 7:  # the signal lands mid-update; the update still completes
            os.kill(os.getpid(), signal.SIGTERM)
        return real_step(self, batches)

    monkeypatch.setattr(Trainer, "train_step", terminated_during_step_8)
    handler_before = signal.getsignal(signal.SIGTERM)
    resumed = tmp_path / "resumed"
    stopped = train(resumed, "train.max_steps=30")
    assert stopped.exit_code == 2, f"{stopped.output}\n{stopped.exception!r}"
    assert "interrupted by SIGTERM" in stopped.output and "--resume" in stopped.output
    assert signal.getsignal(signal.SIGTERM) is handler_before, "the handler must be restored"
    assert checkpoint(resumed)["step"] == 8

    monkeypatch.setattr(Trainer, "train_step", real_step)
    result = train(resumed, "train.max_steps=30", resume=True)
    assert result.exit_code == 0, f"{result.output}\n{result.exception!r}"  # once seen failing under load, unexplained
    assert_same_run(resumed, straight_run)
