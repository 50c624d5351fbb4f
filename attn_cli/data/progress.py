"""Progress of the data stages (reading, splitting, sampling, tokenizing): a Rich bar with pairs/s
and the time left on a terminal, and one line per finished stage in a log file or pipe."""

from __future__ import annotations

import time
from typing import Callable, Iterable, Iterator, Optional, TypeVar

from rich.console import Console
from rich.progress import (
    BarColumn,
    MofNCompleteColumn,
    Progress,
    ProgressColumn,
    Task,
    TextColumn,
    TimeElapsedColumn,
    TimeRemainingColumn,
)
from rich.text import Text

T = TypeVar("T")

# Items between two updates of a bar: updating per item would cost more than reading a pair.
_UPDATE_EVERY = 4096


class _Rate(ProgressColumn):
    def render(self, task: Task) -> Text:
        speed = task.finished_speed or task.speed
        return Text(f"{speed:,.0f} pairs/s" if speed else "", style="progress.data.speed")


class StageProgress:
    """`track(items, description, total)` yields `items` unchanged while showing how far it got."""

    def __init__(self, log: Callable[[str], None], console: Optional[Console] = None):
        self.log = log
        self.console = console or Console(stderr=True)

    def track(self, items: Iterable[T], description: str, total: Optional[int] = None) -> Iterator[T]:
        started, count = time.perf_counter(), 0
        progress = None
        if self.console.is_terminal:
            progress = Progress(
                TextColumn("{task.description}"),
                BarColumn(),
                MofNCompleteColumn(),
                _Rate(),
                TimeElapsedColumn(),
                TimeRemainingColumn(),
                console=self.console,
                transient=True,
            )
            progress.start()
            task = progress.add_task(description, total=total)
        try:
            for count, item in enumerate(items, 1):
                if progress is not None and count % _UPDATE_EVERY == 0:
                    progress.update(task, completed=count)
                yield item
        finally:
            if progress is not None:
                progress.stop()
        seconds = time.perf_counter() - started
        self.log(f"{description}: {count:,} pairs in {seconds:.1f} s ({count / max(seconds, 1e-9):,.0f} pairs/s)")
