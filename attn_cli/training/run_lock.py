"""One writer per run directory: an advisory lock on RUN/.lock, held while `attn train` or
`attn tokenizer` works in it."""

from __future__ import annotations

import contextlib
import fcntl
import os
import time
from typing import Iterator

from attn_cli.config import ConfigError
from attn_cli.paths import RunPaths


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
