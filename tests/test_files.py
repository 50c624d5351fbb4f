"""Files are written whole or not at all, and what is not a regular file is never replaced."""

import os
import stat
import threading
from pathlib import Path

import pytest

from attn_cli.files import WriteError, remove_stale_temporaries, write_whole, written_whole


def test_a_write_that_fails_leaves_the_previous_file_and_no_temporary(tmp_path):
    target = tmp_path / "config.yaml"
    target.write_text("before\n")
    with pytest.raises(KeyboardInterrupt):
        with written_whole(target) as handle:
            handle.write("half of the new")
            raise KeyboardInterrupt
    with pytest.raises(
        WriteError, match=r"^cannot write .*config.yaml: No space left on device; the previous config.yaml is intact$"
    ):
        with written_whole(target) as handle:
            raise OSError(28, "No space left on device")
    assert target.read_text() == "before\n" and os.listdir(tmp_path) == ["config.yaml"]
    write_whole(target, "after\n")
    assert target.read_text() == "after\n" and os.listdir(tmp_path) == ["config.yaml"]


def test_a_pipe_is_written_in_place_and_stays_a_pipe(tmp_path):
    pipe = tmp_path / "pipe"
    os.mkfifo(pipe)
    received = []
    reader = threading.Thread(target=lambda: received.append(pipe.read_text()))
    reader.start()
    write_whole(pipe, "through the pipe\n")
    reader.join(timeout=10)
    assert received == ["through the pipe\n"] and stat.S_ISFIFO(os.stat(pipe).st_mode)


@pytest.mark.skipif(not Path("/dev/full").is_char_device(), reason="no /dev/full on this system")
def test_a_full_device_is_one_line(monkeypatch):
    from attn_cli import files

    def never(source, target):  # replacing /dev/full would break the machine for everyone
        raise AssertionError(f"{target} must be written in place, never replaced")

    monkeypatch.setattr(files.os, "replace", never)
    with pytest.raises(WriteError, match="^cannot write /dev/full: No space left on device$"):
        write_whole(Path("/dev/full"), "x" * 100_000)


def test_a_directory_is_refused_and_a_link_is_kept(tmp_path):
    with pytest.raises(WriteError, match="it is a directory; give a file path"):
        write_whole(tmp_path, "text")
    real = tmp_path / "real.txt"
    real.write_text("before\n")
    link = tmp_path / "link.txt"
    link.symlink_to(real)
    write_whole(link, "after\n")
    assert link.is_symlink() and real.read_text() == "after\n"


def test_stale_temporaries_are_removed_and_nothing_else(tmp_path):
    (tmp_path / ".last.pt.123.tmp").write_bytes(b"half")
    (tmp_path / ".entry.123.tmp").mkdir()  # a directory half built
    (tmp_path / ".entry.123.tmp" / "src_ids.npy").write_bytes(b"half")
    (tmp_path / "last.pt").write_bytes(b"whole")
    (tmp_path / "notes.tmp").write_bytes(b"the user's own")
    remove_stale_temporaries(tmp_path)
    assert sorted(os.listdir(tmp_path)) == ["last.pt", "notes.tmp"]


@pytest.mark.skipif(not Path("/proc/self/fd").is_dir(), reason="no /proc on this system")
def test_a_name_for_an_open_descriptor_is_appended_to_not_replaced(tmp_path):
    """/dev/stdout redirected to a file with >> is /proc/self/fd/1 pointing to it."""
    target = tmp_path / "log.txt"
    target.write_text("before\n")
    inode = target.stat().st_ino
    with target.open("a") as redirected:
        write_whole(Path(f"/proc/self/fd/{redirected.fileno()}"), "after\n")
    assert target.read_text() == "before\nafter\n" and target.stat().st_ino == inode
