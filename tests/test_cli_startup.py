"""The command line starts at once: `attn --version`, `attn --help` and each command's --help import
none of the heavy modules (torch, sentencepiece, sacrebleu, datasets), which the commands import
when they run; and the error handler still shows the library's errors as one line without them."""

import importlib
import importlib.metadata
import json
import os
import subprocess
import sys

import pytest
import typer
from support.runs import REPO
from typer.testing import CliRunner

import attn_cli
from attn_cli.cli.app import app
from attn_cli.cli.common import reports_user_errors

HEAVY = ("torch", "sentencepiece", "sacrebleu", "datasets")
COMMANDS = ("train", "tokenizer", "translate", "eval", "backtranslate", "average", "doctor")


def _installed_version() -> str:
    try:
        return importlib.metadata.version("attn-cli")
    except importlib.metadata.PackageNotFoundError:
        return "0+unknown"


def _heavy_modules_after(code: str) -> list[str]:
    """The heavy modules a fresh interpreter has imported after running `code` (this checkout's attn)."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")]))}
    script = f"{code}\nimport json, sys\nprint(json.dumps([m for m in {HEAVY!r} if m in sys.modules]))"
    result = subprocess.run([sys.executable, "-c", script], cwd=REPO, env=env, capture_output=True, text=True)
    assert result.returncode == 0, result.stderr
    return json.loads(result.stdout.splitlines()[-1])


def test_version_prints_the_package_version():
    result = CliRunner().invoke(app, ["--version"])
    assert result.exit_code == 0, result.output
    assert result.stdout == f"attn {_installed_version()}\n"
    assert attn_cli.__version__ == _installed_version()


def test_version_from_the_command_line():
    result = subprocess.run([sys.executable, "-m", "attn_cli", "--version"], cwd=REPO, capture_output=True, text=True)
    assert result.returncode == 0, result.stderr
    assert result.stdout == f"attn {_installed_version()}\n"


def test_version_without_package_metadata(monkeypatch):
    def not_installed(name):
        raise importlib.metadata.PackageNotFoundError(name)

    monkeypatch.setattr(importlib.metadata, "version", not_installed)
    assert attn_cli.package_version() == "0+unknown"
    assert CliRunner().invoke(app, ["--version"]).stdout == "attn 0+unknown\n"


def test_importing_the_command_line_imports_no_heavy_module():
    assert _heavy_modules_after("import attn_cli.cli") == []
    assert _heavy_modules_after("from attn_cli.cli import app, main") == []


@pytest.mark.parametrize(
    "args",
    [["--help"], ["--version"], []] + [[command, "--help"] for command in COMMANDS],
    ids=lambda args: " ".join(args) or "no-arguments",
)
def test_help_and_version_import_no_heavy_module(args):
    code = (
        "from typer.testing import CliRunner\n"
        "from attn_cli.cli.app import app\n"
        f"result = CliRunner().invoke(app, {args!r})\n"
        "assert result.exit_code in (0, 2) and result.output, result.output"
    )  # 2: `attn` alone shows the help
    assert _heavy_modules_after(code) == []


def _library_errors():
    """Each error the library raises for a problem the user can fix, imported as the library names it."""
    places = [
        ("attn_cli.data.corpus", "DataError"),
        ("attn_cli.data.tokenizer", "TokenizerError"),
        ("attn_cli.checkpoint", "CheckpointError"),
        ("attn_cli.training.step", "TrainingDiverged"),
        ("attn_cli.config", "ConfigError"),
    ]
    return [getattr(importlib.import_module(module), name) for module, name in places]


@pytest.mark.parametrize("error_type", _library_errors(), ids=lambda error_type: error_type.__name__)
def test_the_handler_shows_each_library_error_as_one_line(error_type):
    def failing() -> None:
        raise error_type("the problem [bold], and how to fix it")

    one = typer.Typer()
    one.command()(reports_user_errors(failing))
    result = CliRunner().invoke(one, [])
    assert result.exit_code == 2, result.output
    assert result.output == "error: the problem [bold], and how to fix it\n"


def test_a_missing_checkpoint_is_one_line_from_the_real_command(tmp_path):
    missing = tmp_path / "none.pt"
    result = CliRunner().invoke(app, ["translate", "--checkpoint", str(missing), "Hello."])
    assert result.exit_code == 2, result.output
    assert result.output == f"error: checkpoint not found: {missing}\n"


def test_the_translation_pipeline_and_the_ctranslate2_engine_import_no_torch():
    """`attn translate --model EXPORT` decodes with CTranslate2 alone: the records, the pipeline's
    stages, the input and output formats and that engine must not bring torch in."""
    modules = [
        "attn_cli.decoding.pipeline",
        "attn_cli.decoding.io",
        "attn_cli.engines.load",
        "attn_cli.engines.ctranslate2",
        "attn_cli.cli.decoding_flags",
    ]
    assert "torch" not in _heavy_modules_after("\n".join(f"import {module}" for module in modules))
