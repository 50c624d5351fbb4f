"""Files written whole or not at all.

Every file attn writes (checkpoints, the tokenizer, config.yaml, the data splits, translations)
goes first into a temporary file beside its target, which takes the target's name only once all of
it is on disk. A crash, a Ctrl-C or a full disk therefore leaves the previous file as it was, never
half of a new one that a later run would read; the temporary file is removed on the way out, or,
after a kill -9, by the next run (`remove_stale_temporaries`)."""

from __future__ import annotations

import contextlib
import os
import shutil
import tempfile
from pathlib import Path
from typing import IO, Iterator, Optional

from attn_cli.errors import UserError


class WriteError(UserError):
    """A file could not be written: no space, an I/O error, a read-only filesystem."""


TEMPORARY_SUFFIX = ".tmp"


def _temporary_beside(path: Path) -> Path:
    # Beside the target, so the rename stays on one filesystem; hidden, and with the writer's PID,
    # so two writers never share one.
    return path.with_name(f".{path.name}.{os.getpid()}{TEMPORARY_SUFFIX}")


@contextlib.contextmanager
def written_whole(path: Path, binary: bool = False, label: Optional[str] = None) -> Iterator[IO]:
    """A handle to write `path` through: when the block ends normally the data is flushed to disk
    and renamed over `path`; when it raises, `path` is left as it was. A device or a pipe
    (/dev/stdout) is written directly: there is nothing to keep, and it must stay what it is.

    An OSError of this file (a full disk, say) becomes a one-line WriteError naming `label` (the
    path when None) and the cause; any other error, another file's among them, passes as it is."""
    path = Path(path)
    if path.is_dir():
        raise WriteError(f"cannot write {label or path}: it is a directory; give a file path")
    # A device, a pipe, or a name for an open descriptor (/dev/stdout, whatever it points to): never
    # replaced, for that would cut it off from what the process writes there, or replace the device.
    if str(path.absolute()).startswith(("/dev/", "/proc/")) or (path.exists() and not path.is_file()):
        yield from _written_in_place(path, binary, label)
        return
    if path.is_symlink():  # write where the link points, and keep the link
        path = path.resolve()
    temporary = _temporary_beside(path)
    handle = _open(temporary, binary, path, label)
    try:
        with handle:
            yield handle
            handle.flush()
            os.fsync(handle.fileno())  # on disk before it takes the name: a power cut cannot leave it empty
        os.replace(temporary, path)
    except BaseException as error:
        temporary.unlink(missing_ok=True)
        if _failed_write_of(error, temporary, path):
            raise write_error(path, error.strerror or str(error), label) from None
        raise


def _written_in_place(path: Path, binary: bool, label: Optional[str]) -> Iterator[IO]:
    # Appending: /dev/stdout redirected with >> must keep what the file held.
    handle = _open(path, binary, path, label, append=True)
    try:
        with handle:
            yield handle
    except OSError as error:
        if not _failed_write_of(error, path):
            raise
        raise WriteError(f"cannot write {label or path}: {error.strerror or error}") from None


def _open(file: Path, binary: bool, path: Path, label: Optional[str], append: bool = False) -> IO:
    """`file` opened for writing `path`; a plain open, so the file gets the permissions any new file would."""
    mode = ("a" if append else "w") + ("b" if binary else "")
    try:
        return open(file, mode) if binary else open(file, mode, encoding="utf-8")
    except OSError as error:
        raise WriteError(f"cannot write {label or path}: {error.strerror or error}") from None


def _failed_write_of(error: BaseException, *files: Path) -> bool:
    """Whether `error` is a failed write of one of `files` (a failing write names no file), rather
    than a reader that went away or another file's error."""
    return (
        isinstance(error, OSError)
        and not isinstance(error, BrokenPipeError)
        and error.filename in (None, *(str(file) for file in files))
    )


def write_error(path: Path, cause: str, label: Optional[str] = None) -> WriteError:
    """The one line for a failed write of `path`, saying whether a previous version survives."""
    kept = f"; the previous {path.name} is intact" if path.exists() else ""
    return WriteError(f"cannot write {label or path}: {cause}{kept}")


def write_whole(path: Path, data: str | bytes, label: Optional[str] = None) -> None:
    """Write `data` (text as UTF-8) to `path` whole or not at all."""
    with written_whole(path, binary=isinstance(data, bytes), label=label) as handle:
        handle.write(data)


def require_new_directory(target: Path, option: str = "--output") -> None:
    """Refuse, before any work, a `target` that `directory_built_whole` could not rename into place:
    one that exists and is not an empty directory."""
    if target.exists() and (not target.is_dir() or any(target.iterdir())):
        raise UserError(f"{target} already exists and is not an empty directory; give a new {option}")


@contextlib.contextmanager
def directory_built_whole(target: Path) -> Iterator[Path]:
    """A temporary directory beside `target` to build it in: renamed to `target` when the block ends
    normally (which fails if `target` exists and is not an empty directory), removed when it raises."""
    target.parent.mkdir(parents=True, exist_ok=True)
    building = Path(tempfile.mkdtemp(prefix=f".{target.name}.", suffix=TEMPORARY_SUFFIX, dir=target.parent))
    try:
        yield building
        os.rename(building, target)
    except BaseException:
        shutil.rmtree(building, ignore_errors=True)
        raise


def remove_stale_temporaries(directory: Path) -> None:
    """Remove what writes cut short by a kill left in `directory`: temporary files, and directories
    half built (`directory_built_whole`). Only for a directory no other process writes into at the
    same time (a run directory, under its lock)."""
    if directory.is_dir():
        for stale in directory.glob(f".*{TEMPORARY_SUFFIX}"):
            if stale.is_dir():
                shutil.rmtree(stale, ignore_errors=True)
            else:
                stale.unlink(missing_ok=True)
