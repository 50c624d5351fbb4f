"""Where training metrics go: RUN/metrics.jsonl always, and RUN/tensorboard/ as well when
TensorBoard is installed (`pip install attn-cli[tensorboard]`); without it that part is skipped."""

from __future__ import annotations

import json
from typing import Any, Optional

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
        with self.paths.metrics_log.open("a", encoding="utf-8") as log:
            log.write(json.dumps(metrics) + "\n")
        if self._writer is not None:
            for key, value in metrics.items():
                if key.startswith("valid_"):
                    self._writer.add_scalar(f"valid/{key.removeprefix('valid_')}", value, metrics["step"])
            self._writer.flush()  # validations are rare; make them visible at once

    def training(self, step: int, loss: float, learning_rate: float, tokens_per_second: float) -> None:
        if self._writer is not None:
            self._writer.add_scalar("train/loss", loss, step)
            self._writer.add_scalar("train/lr", learning_rate, step)
            self._writer.add_scalar("train/tokens_per_second", tokens_per_second, step)

    def close(self) -> None:
        if self._writer is not None:
            self._writer.close()
