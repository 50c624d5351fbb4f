"""What keeps a training run's files sound while it works: one writer per run directory, and stops
asked for by a signal honoured only between updates.

Run lock: an advisory lock on RUN/.lock, held while `attn train`, `attn prepare` or `attn tokenizer`
works in the directory; a second process there is refused with the holder's PID, and the kernel
drops the lock when the process dies, however it dies.

Signals: SIGINT (Ctrl-C) and SIGTERM (what `kill`, schedulers and container runtimes send) both ask
the training loop to stop. The handler only records the request; the loop stops at the next
boundary between updates and saves last.pt there, so the checkpoint never holds a half-applied
update and resuming from it is exact. A second signal stops at once, for a user who will not wait.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import signal
import threading
import time
from typing import Iterator, Optional

from attn_cli.config import ConfigError
from attn_cli.paths import RunPaths


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


@contextlib.contextmanager
def run_directory_lock(paths: RunPaths, held: bool = True) -> Iterator[None]:
    """Within, this process alone writes into `paths.root`; a second `attn train` there is refused
    with the holder's PID. The kernel drops the lock when the process dies, however it dies, so a
    crashed run never leaves the directory locked. `held=False` (torchrun ranks other than 0, which
    train under rank 0's lock) takes no lock."""
    if not held:
        yield
        return
    try:
        paths.root.mkdir(parents=True, exist_ok=True)
        lock = open(paths.root / ".lock", "a+", encoding="utf-8")
    except OSError as error:  # a file of that name, a read-only place
        raise ConfigError(
            f"{paths.root} cannot be a run directory: {error.strerror or error}; "
            "give another path with --set run_dir=...",
            "run_dir",
        ) from None
    with lock:
        try:
            fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = _holder(lock)
            raise ConfigError(
                f"{paths.root} is in use by another attn process (PID {holder}); wait for "
                "it to finish, or work in another directory with --set run_dir=...",
                "run_dir",
            ) from None
        lock.seek(0)
        lock.truncate()
        lock.write(f"{os.getpid()}\n")
        lock.flush()
        yield  # closing the file releases the lock


def _holder(lock) -> str:
    """The PID in the lock file. The holder writes it right after taking the lock: a reader that
    comes between the two finds the file empty, so it looks again for a moment before giving up."""
    for _ in range(50):
        lock.seek(0)
        holder = lock.read().strip()
        if holder:
            return holder
        time.sleep(0.02)
    return "unknown"
