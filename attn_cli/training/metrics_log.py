"""Where training metrics go: RUN/metrics.jsonl always, and RUN/tensorboard/ as well when
TensorBoard is installed (`pip install attn-cli[tensorboard]`); without it that part is skipped."""

from __future__ import annotations

import json
import os
from typing import Any, Optional

from attn_cli.files import WriteError
from attn_cli.paths import RunPaths


def _tensorboard_writer(paths: RunPaths, purge_step: Optional[int]) -> Any:
    try:
        from torch.utils.tensorboard import SummaryWriter  # needs the tensorboard package
    except ImportError:
        return None
    # purge_step drops events a resumed run is about to write again.
    return SummaryWriter(str(paths.tensorboard_dir), purge_step=purge_step)


class MetricsLog:
    def __init__(self, paths: RunPaths, resumed_at: Optional[int] = None):
        self.paths = paths
        self._writer = _tensorboard_writer(paths, resumed_at)

    @property
    def tensorboard(self) -> bool:
        return self._writer is not None

    def validation(self, metrics: dict) -> None:
        """One line of metrics.jsonl, and valid/loss, valid/ppl, valid/bleu in TensorBoard."""
        self._append(json.dumps(metrics) + "\n")
        if self._writer is not None:
            for key, value in metrics.items():
                if key.startswith("valid_"):
                    self._writer.add_scalar(f"valid/{key.removeprefix('valid_')}", value, metrics["step"])
            self._writer.flush()  # validations are rare; make them visible at once

    def _append(self, line: str) -> None:
        """Add one line whole or not at all: what a failed write (a full disk) put down is cut back
        off, so the log never ends in half a line."""
        log = self.paths.metrics_log
        data = line.encode("utf-8")
        descriptor = os.open(log, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o666)
        try:
            size = os.lseek(descriptor, 0, os.SEEK_END)
            try:
                while data:
                    data = data[os.write(descriptor, data) :]
            except OSError as error:
                os.ftruncate(descriptor, size)
                raise WriteError(
                    f"cannot write {log}: {error.strerror or error}; the lines before are intact"
                ) from None
        finally:
            os.close(descriptor)

    def training(self, step: int, loss: float, learning_rate: float, tokens_per_second: float) -> None:
        if self._writer is not None:
            self._writer.add_scalar("train/loss", loss, step)
            self._writer.add_scalar("train/lr", learning_rate, step)
            self._writer.add_scalar("train/tokens_per_second", tokens_per_second, step)

    def close(self) -> None:
        if self._writer is not None:
            self._writer.close()
