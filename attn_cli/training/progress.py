"""What a training run shows and keeps: the live display, one Rich panel that redraws in place on a
terminal and plain log lines when the output is a file or a pipe (CI logs, `nohup`); and the metrics
log, RUN/metrics.jsonl always and RUN/tensorboard/ as well when TensorBoard is installed
(`pip install attn-cli[tensorboard]`)."""

from __future__ import annotations

import json
import math
import os
import time
from dataclasses import dataclass
from typing import Any, Optional

from rich.console import Console
from rich.live import Live
from rich.table import Table

from attn_cli.files import WriteError
from attn_cli.paths import RunPaths


def format_duration(seconds: Optional[float]) -> str:
    if seconds is None or not math.isfinite(seconds):
        return "?"
    seconds = int(max(seconds, 0))
    hours, rest = divmod(seconds, 3600)
    return f"{hours}:{rest // 60:02d}:{rest % 60:02d}"


@dataclass
class TrainingStatus:
    step: int
    epoch: int
    loss: float
    learning_rate: float
    tokens_per_second: float
    elapsed: float
    eta: Optional[float]
    best: str = ""
    skipped: int = 0  # updates skipped for a non-finite loss or gradients

    @property
    def perplexity(self) -> float:
        return math.exp(min(self.loss, 50.0))

    def line(self) -> str:
        return (
            f"step {self.step:,}  epoch {self.epoch}  loss {self.loss:.3f}  ppl {self.perplexity:.1f}  "
            f"lr {self.learning_rate:.2e}  {self.tokens_per_second:,.0f} tok/s  "
            f"elapsed {format_duration(self.elapsed)}  eta {format_duration(self.eta)}"
            + (f"  skipped {self.skipped} non-finite" if self.skipped else "")
        )


class TrainingDisplay:
    """Use as a context manager; `update` at every log step, `log` for lasting messages."""

    def __init__(self, console: Optional[Console] = None, quiet: bool = False, shown_removed: int = 3):
        self.console = console or Console(stderr=True, soft_wrap=True)
        self.quiet = quiet
        self.shown_removed = shown_removed  # pairs shown per data.filters rule when the data is prepared
        self._live: Optional[Live] = None
        self._last_plain = 0.0

    def __enter__(self) -> "TrainingDisplay":
        if self.console.is_terminal and not self.quiet:
            self._live = Live(console=self.console, refresh_per_second=4, transient=False)
            self._live.__enter__()
        return self

    def __exit__(self, *exc) -> None:
        if self._live is not None:
            self._live.__exit__(*exc)

    def log(self, message: str) -> None:
        if not self.quiet:
            self.console.print(message, highlight=False)

    def update(self, status: TrainingStatus) -> None:
        if self.quiet:
            return
        if self._live is not None:
            self._live.update(self._table(status))
        elif time.monotonic() - self._last_plain >= 30:  # a log file gets a line every 30 s
            self._last_plain = time.monotonic()
            self.console.print(status.line(), highlight=False)

    @staticmethod
    def _table(status: TrainingStatus) -> Table:
        table = Table(title="attn train", show_header=True, header_style="bold")
        for column in ("step", "epoch", "loss", "ppl", "lr", "tok/s", "elapsed", "ETA", "best", "skipped"):
            table.add_column(column, justify="right")
        table.add_row(
            f"{status.step:,}",
            str(status.epoch),
            f"{status.loss:.3f}",
            f"{status.perplexity:.1f}",
            f"{status.learning_rate:.2e}",
            f"{status.tokens_per_second:,.0f}",
            format_duration(status.elapsed),
            format_duration(status.eta),
            status.best or "-",
            str(status.skipped),
        )
        return table


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
