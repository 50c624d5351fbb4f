"""`attn backtranslate`: a file translated into a corpus, each non-empty line once, as `attn
translate` translates it; stopped by kill -9 halfway and run again, it ends with the corpus an
uninterrupted run writes."""

import json
import os
import signal
import subprocess
import sys
import time

import pytest
from support.runs import REPO

from attn_cli.config import CorpusConfig
from attn_cli.data.corpus import read_corpus

SENTENCES = [f"Tom has {n} books and {n + 1} pens." for n in range(120)]


def write_input(path, lines):
    path.write_text("".join(line + "\n" for line in lines), encoding="utf-8")
    return path


def arguments(model, source, output, *flags):
    """`attn backtranslate`'s arguments with the checkpoint `model`: a random model, which writes
    something for every line (a tiny trained one ends most outputs at once)."""
    return ["backtranslate", "--checkpoint", str(model), "-i", str(source), "-o", str(output), "--beam", "1", *flags]


def backtranslate(model, source, output, *flags):
    """The command in a process of its own."""
    return subprocess.run(
        [sys.executable, "-m", "attn_cli", *arguments(model, source, output, *flags)],
        capture_output=True,
        text=True,
        cwd=REPO,
        timeout=600,
    )


def backtranslate_here(model, source, output, *flags):
    """The same command run in this process (CliRunner): what it writes and refuses, without the
    seconds a new process takes to start."""
    from typer.testing import CliRunner

    from attn_cli.cli.app import app

    return CliRunner().invoke(app, arguments(model, source, output, *flags))


def test_each_line_is_translated_once_as_translate_gives_it(served_checkpoint, tmp_path):
    from attn_cli.config import DecodeConfig
    from attn_cli.decoding.pipeline import translate
    from attn_cli.decoding.records import Source
    from attn_cli.decoding.synthetic import translate_file
    from attn_cli.engines.load import load_engine

    lines = ["sentence number 1", "", "sentence\tnumber 22", "  ", "sentence number 3", "sentence number 4"]
    source = write_input(tmp_path / "mono.en", lines)
    engine = load_engine([], [served_checkpoint], None, "cpu")
    options = DecodeConfig(beam_size=1, max_len_a=0.0, max_len_b=8)
    progress = translate_file(engine, options, source, tmp_path / "bt.tsv", chunk_lines=2)
    wanted = ["sentence number 1", "sentence number 22", "sentence number 3", "sentence number 4"]
    alone = [" ".join(t.text.split()) for t in translate(engine, [Source(w) for w in wanted], options)]
    expected = [(made, original) for made, original in zip(alone, wanted) if made]
    assert expected  # the random model writes something for most lines
    assert read_corpus(CorpusConfig(path=str(tmp_path / "bt.tsv"))) == expected
    assert (progress.lines, progress.empty, progress.done) == (6, len(wanted) - len(expected), True)


@pytest.mark.slow  # three runs of the command in processes of their own, one killed
def test_killed_halfway_and_run_again_every_line_is_translated_once(served_checkpoint, tmp_path):
    source = write_input(tmp_path / "mono.en", SENTENCES)
    straight = backtranslate(served_checkpoint, source, tmp_path / "straight.tsv", "--chunk-lines", "5")
    assert straight.returncode == 0, straight.stderr

    output = tmp_path / "bt.tsv"
    progress = tmp_path / "bt.tsv.progress.json"
    command = [sys.executable, "-m", "attn_cli", *arguments(served_checkpoint, source, output, "--chunk-lines", "5")]
    process = subprocess.Popen(command, cwd=REPO, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.monotonic() + 300
    while time.monotonic() < deadline:
        if progress.is_file() and 20 <= json.loads(progress.read_text() or "{}").get("lines", 0):
            break
        time.sleep(0.05)
    os.kill(process.pid, signal.SIGKILL)
    process.wait()
    stopped = json.loads(progress.read_text())
    assert 20 <= stopped["lines"] < len(SENTENCES) and not stopped["done"]
    with output.open("ab") as corpus:  # a chunk written after the last record, cut short
        corpus.write("half a line wri".encode())

    again = backtranslate(served_checkpoint, source, output, "--chunk-lines", "5")
    assert again.returncode == 0, again.stderr
    assert output.read_bytes() == (tmp_path / "straight.tsv").read_bytes()
    assert [original for _, original in read_corpus(CorpusConfig(path=str(output)))] == SENTENCES


@pytest.mark.parametrize("change", ["foreign output", "other input", "other settings"])
def test_work_that_is_not_this_one_is_not_continued(served_checkpoint, tmp_path, change):
    source = write_input(tmp_path / "mono.en", SENTENCES[:3])
    output = tmp_path / "bt.tsv"
    if change == "foreign output":
        output.write_text("somebody's\tcorpus\n", encoding="utf-8")
        expected = "not written by an earlier run"
    else:
        assert backtranslate_here(served_checkpoint, source, output).exit_code == 0
        if change == "other input":
            write_input(source, SENTENCES[:4])
        expected = "another input file, another model or other decoding settings"
    flags = ["--beam", "2"] if change == "other settings" else []
    refused = backtranslate_here(served_checkpoint, source, output, *flags)
    assert refused.exit_code != 0 and expected in refused.stderr
    assert "\n" not in refused.stderr.strip()
