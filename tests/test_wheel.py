"""A wheel of attn works without the repository: it carries the built-in configs and the corpus."""

import os
import shutil
import site
import subprocess
import sys
import sysconfig
from pathlib import Path

import pytest
from support.runs import REPO

pytestmark = pytest.mark.slow  # builds a wheel and a virtual environment


def run(command: list, cwd: Path) -> str:
    # PYTHONPATH could lead the venv's Python back to this checkout.
    env = {key: value for key, value in os.environ.items() if key != "PYTHONPATH"}
    result = subprocess.run([str(part) for part in command], cwd=cwd, env=env, capture_output=True, text=True)
    assert result.returncode == 0, f"{command}:\n{result.stdout}\n{result.stderr}"
    return result.stdout + result.stderr


def see_packages_of_this_python(venv: Path) -> None:
    """Give the venv the packages this Python imports from, by a .pth file in its site-packages
    naming their directories. `venv --system-site-packages` would not do: made by a Python that is
    itself a venv's, it shows the base interpreter's packages, not that venv's. Only the directories
    are named, after the venv's own: their .pth files do not run, so an editable install of attn
    there (pip install -e) stays out, and attn comes from the wheel."""
    directories = [sysconfig.get_paths()["purelib"], sysconfig.get_paths()["platlib"], *site.getsitepackages()]
    if site.ENABLE_USER_SITE:  # the user's site-packages, as this Python sees it
        directories.append(site.getusersitepackages())
    lines = [str(Path(d).resolve()) for d in dict.fromkeys(directories) if Path(d).is_dir()]
    purelib = subprocess.run(
        [venv / "bin" / "python", "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout.strip()
    (Path(purelib) / "outer-packages.pth").write_text("\n".join(lines) + "\n", encoding="utf-8")


def test_a_wheel_trains_translates_and_evaluates_in_an_empty_directory(tmp_path):
    wheels = tmp_path / "wheels"
    # Built from a copy without the checkout's build/ folder: setuptools adds to what an earlier
    # build left there and never removes a module that is gone, which a wheel would then carry.
    source = tmp_path / "source"
    leftovers = shutil.ignore_patterns(".git", "build", "dist", "*.egg-info", "runs", "bench_results", "__pycache__")
    shutil.copytree(REPO, source, ignore=leftovers)
    # --no-build-isolation: build with the setuptools at hand instead of fetching one.
    run(
        [sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "--quiet", "-w", wheels, source],
        tmp_path,
    )
    (wheel,) = wheels.glob("attn_cli-*.whl")
    # The venv sees this Python's packages (torch and the rest), but attn only from the wheel.
    venv = tmp_path / "venv"
    run([sys.executable, "-m", "venv", venv], tmp_path)
    see_packages_of_this_python(venv)
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
