"""Stopping training on a signal without losing work.

SIGINT (Ctrl-C) and SIGTERM (what `kill`, schedulers and container runtimes send) both ask the
training loop to stop. The handler only records the request; the loop stops at the next boundary
between updates and saves last.pt there, so the checkpoint never holds a half-applied update and
resuming from it is exact. A second signal stops at once, for a user who will not wait.
"""

from __future__ import annotations

import contextlib
import signal
import threading
from typing import Iterator, Optional


class TrainingInterrupted(KeyboardInterrupt):
    """A stop request honoured at an update boundary; takes the same path as Ctrl-C."""


class StopRequest:
    def __init__(self) -> None:
        self.signal_name: Optional[str] = None  # e.g. "SIGTERM" once one arrived


@contextlib.contextmanager
def stop_requests(
    signals: tuple[signal.Signals, ...] = (signal.SIGINT, signal.SIGTERM), second_stops_at_once: bool = True
) -> Iterator[StopRequest]:
    """Record these signals as a stop request while the block runs; the old handlers come back after.
    Without `second_stops_at_once`, later signals only repeat the request."""
    request = StopRequest()
    if threading.current_thread() is not threading.main_thread():
        yield request  # only the main thread may install handlers; signals keep their old meaning
        return

    def record(signum, frame) -> None:
        if request.signal_name is not None:
            if second_stops_at_once:
                raise KeyboardInterrupt  # the second signal: stop now, mid-update if need be
            return
        request.signal_name = signal.Signals(signum).name

    previous = {number: signal.getsignal(number) for number in signals}
    for number in signals:
        signal.signal(number, record)
    try:
        yield request
    finally:
        for number, handler in previous.items():
            signal.signal(number, handler)
