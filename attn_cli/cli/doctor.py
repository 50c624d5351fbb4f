"""`attn doctor`: check a config, or a trained model, for the mistakes that make a Transformer fail silently."""

from __future__ import annotations

from pathlib import Path
from typing import List, Optional

import typer
from rich.console import Console

from attn_cli.cli.common import CheckpointOption, SetOption
from attn_cli.config import DEFAULT_CONFIG
from attn_cli.errors import UserError


def doctor(
    config: Optional[Path] = typer.Option(
        None,
        "--config",
        "-c",
        help="YAML config file, or a built-in one by name "
        "(default: en-zh.yaml, unless --run or --checkpoint is given).",
    ),
    run: Optional[Path] = typer.Option(
        None,
        "--run",
        help="Check this run's best checkpoint (else last.pt) and the "
        "config it was trained with, model checks included.",
    ),
    checkpoint: Optional[Path] = CheckpointOption,
    set_: Optional[List[str]] = SetOption,
    memory_gb: Optional[float] = typer.Option(
        None,
        "--memory-gb",
        min=0.001,
        help="Check a training step against this many GB instead of this machine's device (planning for another one).",
    ),
    as_json: bool = typer.Option(False, "--json", help="Print the checks as JSON on stdout instead of a table."),
) -> None:
    """Check the environment, a config, a training step's memory, the data and (with --run or
    --checkpoint) the model itself for the mistakes that make a Transformer fail silently: a missing
    1/sqrt(d_head), missing positions, masks that leak the future or hide too much, a cache that does
    not follow the decoded length, heads too small, a batch too large for memory.

    Prints one row per check: pass, warn or fail, what it found and the fix. Exits with status 1 when
    a check fails (0 with warnings). See docs/doctor.md.

    Example:

      attn doctor --config en-zh.yaml

      attn doctor --run runs/en-zh

      attn doctor --config big.yaml --memory-gb 24 --json

      attn doctor --checkpoint runs/en-zh/checkpoints/last.pt --set data.corpus.path=cmn.txt
    """
    # torch and the checks: imported when run, not for --help
    from attn_cli.doctor.checks import as_json as checks_as_json
    from attn_cli.doctor.checks import failed, print_table
    from attn_cli.doctor.diagnose import diagnose_checkpoint, diagnose_config

    if config is not None and (run is not None or checkpoint is not None):
        raise UserError("give --config, or --run / --checkpoint (whose config is the checkpoint's), not both")
    if run is not None or checkpoint is not None:
        checks = diagnose_checkpoint(run, checkpoint, set_ or [], memory_gb)
    else:
        checks = diagnose_config(config if config is not None else DEFAULT_CONFIG, set_ or [], memory_gb)
    if as_json:
        print(checks_as_json(checks))
    else:
        print_table(checks, Console())
    if failed(checks):
        raise typer.Exit(code=1)
