"""A wheel of attn works without the repository: it carries the built-in configs and the corpus."""

import os
import subprocess
import sys
from pathlib import Path

from conftest import REPO


def run(command: list, cwd: Path) -> str:
    # PYTHONPATH could lead the venv's Python back to this checkout.
    env = {key: value for key, value in os.environ.items() if key != "PYTHONPATH"}
    result = subprocess.run([str(part) for part in command], cwd=cwd, env=env, capture_output=True, text=True)
    assert result.returncode == 0, f"{command}:\n{result.stdout}\n{result.stderr}"
    return result.stdout + result.stderr


def test_a_wheel_trains_translates_and_evaluates_in_an_empty_directory(tmp_path):
    wheels = tmp_path / "wheels"
    # --no-build-isolation: build with the setuptools at hand instead of fetching one.
    run(
        [sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "--quiet", "-w", wheels, REPO],
        tmp_path,
    )
    (wheel,) = wheels.glob("attn_cli-*.whl")
    # The venv sees this Python's packages (torch and the rest), but attn only from the wheel.
    venv = tmp_path / "venv"
    run([sys.executable, "-m", "venv", "--system-site-packages", venv], tmp_path)
    run([venv / "bin" / "python", "-m", "pip", "install", "--quiet", "--no-deps", "--no-index", wheel], tmp_path)
    empty = tmp_path / "somewhere"
    empty.mkdir()
    location = run([venv / "bin" / "python", "-c", "import attn_cli; print(attn_cli.__file__)"], empty)
    assert location.strip().startswith(str(venv)), location

    attn = venv / "bin" / "attn"
    run([attn, "train", "--config", "tiny.yaml", "--set", "train.max_steps=20"], empty)
    assert (empty / "runs" / "tiny" / "checkpoints" / "last.pt").is_file()
    translated = subprocess.run(
        [attn, "translate", "--run", "runs/tiny", "I love machine learning"], cwd=empty, capture_output=True, text=True
    )
    assert translated.returncode == 0 and translated.stdout.count("\n") == 1, translated.stderr  # one line per input
    assert "BLEU =" in run([attn, "eval", "--bleu", "--run", "runs/tiny"], empty)
