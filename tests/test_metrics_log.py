"""Validation metrics always reach metrics.jsonl, and TensorBoard only when it is installed."""

import json
import sys
import types

from attn_cli.training.metrics_log import MetricsLog
from attn_cli.paths import RunPaths

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
    assert writer.scalars == [("valid/loss", 2.5, 500), ("valid/ppl", 12.2, 500), ("valid/bleu", 20.1, 500),
                              ("train/loss", 2.4, 510), ("train/lr", 1e-3, 510), ("train/tokens_per_second", 5000.0, 510)]
    assert (tmp_path / "metrics.jsonl").is_file()
