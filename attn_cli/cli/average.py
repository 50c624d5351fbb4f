"""`attn average`: average the weights of a run's newest step checkpoints."""

from __future__ import annotations

from pathlib import Path
from typing import Optional

import typer

from attn_cli.cli.common import RunOption, tell
from attn_cli.config import default_run_dir
from attn_cli.errors import UserError
from attn_cli.paths import RunPaths


def average(
    run: Optional[Path] = RunOption,
    last: int = typer.Option(5, "--last", min=1, help="How many of the newest step checkpoints to average."),
    output: Optional[Path] = typer.Option(
        None, "--output", "-o", help="Where to write it (default: RUN/checkpoints/average-lastN.pt)."
    ),
) -> None:
    """Average the weights of a run's newest step checkpoints into one checkpoint.

    The run must keep step checkpoints: train with train.keep_last set to at least --last.

    Example:

      attn average --run runs/en-zh --last 5

      attn average --run runs/en-zh --last 5 --output avg.pt && attn eval --checkpoint avg.pt
    """
    from attn_cli.checkpoint import average_checkpoints  # torch: imported when run, not for --help

    paths = RunPaths.of(run if run is not None else default_run_dir())
    found = paths.step_checkpoints()
    if len(found) < last:
        held = f" ({', '.join(p.name for p in found)})" if found else ""
        raise UserError(
            f"--last {last} needs {last} step checkpoints, but {paths.checkpoint_dir} holds {len(found)}"
            f"{held}; train with train.keep_last: {last} or more, or lower --last"
        )
    output = output if output is not None else paths.average_checkpoint(last)
    averaged = average_checkpoints(found[-last:], output)
    steps = ", ".join(f"{step:,}" for step in averaged.metrics["averaged_steps"])
    tell(
        f"averaged the weights of steps {steps} into {output}; use it with "
        f"`attn translate --checkpoint {output}` or `attn eval --checkpoint {output}`"
    )
