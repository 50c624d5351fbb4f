"""Validation metrics always reach metrics.jsonl, and TensorBoard only when it is installed."""

import json
import sys
import types

from attn_cli.paths import RunPaths
from attn_cli.training.progress import MetricsLog

METRICS = {"step": 500, "epoch": 2, "elapsed": 61.0, "valid_loss": 2.5, "valid_ppl": 12.2, "valid_bleu": 20.1}


class RecordingWriter:
    def __init__(self, log_dir, purge_step=None):
        self.log_dir, self.purge_step, self.scalars, self.closed = log_dir, purge_step, [], False
        RecordingWriter.made.append(self)

    def add_scalar(self, tag, value, step):
        self.scalars.append((tag, value, step))

    def flush(self):
        pass

    def close(self):
        self.closed = True


def test_without_tensorboard_only_the_json_lines_are_written(tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, "torch.utils.tensorboard", None)  # makes the import fail
    log = MetricsLog(RunPaths.of(tmp_path))
    log.validation(METRICS)
    log.training(510, 2.4, 1e-3, 5000.0)
    log.close()
    assert not log.tensorboard and not (tmp_path / "tensorboard").exists()
    assert [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()] == [METRICS]


def test_with_tensorboard_validation_and_training_scalars_are_written(tmp_path, monkeypatch):
    RecordingWriter.made = []
    monkeypatch.setitem(sys.modules, "torch.utils.tensorboard", types.SimpleNamespace(SummaryWriter=RecordingWriter))
    log = MetricsLog(RunPaths.of(tmp_path), resumed_at=400)
    log.validation(METRICS)
    log.training(510, 2.4, 1e-3, 5000.0)
    log.close()
    (writer,) = RecordingWriter.made
    assert writer.log_dir == str(tmp_path / "tensorboard") and writer.purge_step == 400 and writer.closed
    assert writer.scalars == [
        ("valid/loss", 2.5, 500),
        ("valid/ppl", 12.2, 500),
        ("valid/bleu", 20.1, 500),
        ("train/loss", 2.4, 510),
        ("train/lr", 1e-3, 510),
        ("train/tokens_per_second", 5000.0, 510),
    ]
    assert (tmp_path / "metrics.jsonl").is_file()


def test_a_line_that_fails_halfway_is_cut_back_off(tmp_path, monkeypatch):
    from attn_cli.files import WriteError
    from attn_cli.training import progress as metrics_log

    log = MetricsLog(RunPaths.of(tmp_path))
    log.validation({"step": 10, "valid_loss": 3.0})
    write = metrics_log.os.write

    def half_then_full(descriptor, data):  # what a disk that fills up in the middle of a line does
        write(descriptor, data[: len(data) // 2])
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(metrics_log.os, "write", half_then_full)
    try:
        log.validation({"step": 20, "valid_loss": 2.0})
    except WriteError as error:
        assert "metrics.jsonl: No space left on device; the lines before are intact" in str(error)
    else:
        raise AssertionError("a failed write must not pass silently")
    finally:
        monkeypatch.undo()
    assert [json.loads(line)["step"] for line in (tmp_path / "metrics.jsonl").read_text().splitlines()] == [10]
