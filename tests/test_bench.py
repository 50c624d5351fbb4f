"""Every benchmark in bench/ runs from where it lives: its --help answers, and its --smoke mode runs
end to end on a tiny model and writes its JSON report, so that a refactor cannot break one unseen."""

from __future__ import annotations

import importlib
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
BENCHMARKS = sorted(path.stem for path in (REPO / "bench").glob("*.py") if path.stem not in ("__init__", "toolkit"))


def _bench(name: str, *arguments: str, timeout: float) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")]))}
    return subprocess.run(
        [sys.executable, "-m", f"bench.{name}", *arguments],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def test_there_are_benchmarks():
    assert len(BENCHMARKS) >= 10, BENCHMARKS


@pytest.mark.parametrize("name", BENCHMARKS)
def test_a_benchmark_answers_help(name, capsys, monkeypatch):
    """In this process, so that the modules every benchmark imports are imported once for all."""
    module = importlib.import_module(f"bench.{name}")
    monkeypatch.setattr(sys, "argv", [f"bench.{name}", "--help"])
    with pytest.raises(SystemExit) as exited:
        module.main()
    assert exited.value.code == 0
    shown = capsys.readouterr().out
    assert "--smoke" in shown and "--json" in shown and "python3 -m bench." in shown


@pytest.fixture(scope="module")
def bench_workdir(tmp_path_factory):
    """One work directory for every smoke run, so the tiny run they decode with is trained once."""
    from bench.toolkit import tiny_run

    workdir = tmp_path_factory.mktemp("bench")
    tiny_run(workdir / "tiny")
    return workdir


@pytest.mark.slow
@pytest.mark.parametrize("name", BENCHMARKS)
def test_a_benchmark_runs_in_smoke_mode(name, bench_workdir):
    report = bench_workdir / f"{name}.json"
    result = _bench(name, "--smoke", "--workdir", str(bench_workdir), "--json", str(report), timeout=600)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    written = json.loads(report.read_text(encoding="utf-8"))
    assert written["machine"]["logical_cpus"] >= 1
    assert set(written) - {"machine", "command", "arguments", "finished"}, "the report holds no results"
