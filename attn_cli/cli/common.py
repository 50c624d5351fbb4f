"""What the commands share: the console on stderr, the options that pick a config, run, checkpoint
or device, and the one error handler that shows a problem the user can fix as one red line."""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import TypeVar

import typer
from rich.console import Console
from rich.markup import escape

from attn_cli.config import DEFAULT_CONFIG, ConfigError
from attn_cli.errors import UserError

# Progress, warnings and errors go to stderr, so stdout carries only the results (a pipe's input).
stderr = Console(stderr=True, soft_wrap=True)

ConfigOption = typer.Option(DEFAULT_CONFIG, "--config", "-c", help="YAML config file.")
SetOption = typer.Option(None, "--set", help="Override a config value, e.g. --set train.max_steps=100 (repeatable).")
RunOption = typer.Option(None, "--run", help="Run directory (default: runs/en-zh, the run_dir of en-zh.yaml).")
CheckpointOption = typer.Option(None, "--checkpoint", help="Checkpoint file (default: RUN/checkpoints/best.pt).")
DeviceOption = typer.Option("auto", "--device", help="auto, cpu, cuda or cuda:N.")
ShowRemovedOption = typer.Option(
    3,
    "--show-removed",
    metavar="N",
    min=0,
    max=20,
    help="Show N of the pairs each data.filters rule removes, per corpus (up to 20; 0: the counts alone).",
)

# Problems the user can fix: each message says what, where and how. Anything else is a bug and
# keeps its traceback. The library's own (DataError, TokenizerError, CheckpointError,
# TrainingDiverged) are UserErrors, so that catching them imports neither their modules nor torch;
# ConfigError is not (config.py imports nothing of attn), but config.py is light.
USER_ERRORS = (UserError, ConfigError)

Command = TypeVar("Command", bound=Callable[..., None])


def tell(message: str) -> None:
    """A line on stderr as it is written, without Rich's colouring of numbers and paths."""
    stderr.print(message, highlight=False)


def reports_user_errors(command: Command) -> Command:
    """`command`, with a problem the user can fix shown as one red line on stderr and exit status 2."""

    @functools.wraps(command)  # Typer reads the options and the help from the wrapped signature and docstring
    def run(*args, **kwargs):
        try:
            return command(*args, **kwargs)
        except USER_ERRORS as error:
            # escape: a message quoting a value such as "[bold]" is text, not Rich markup
            stderr.print(f"[bold red]error:[/] {escape(str(error))}", highlight=False)
            raise typer.Exit(code=2) from None

    return run  # type: ignore[return-value]
