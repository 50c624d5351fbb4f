"""`attn train`: train a tokenizer (if the run has none) and a model."""

from __future__ import annotations

from pathlib import Path
from typing import List, Optional

import typer

from attn_cli.cli.common import ConfigOption, SetOption, ShowRemovedOption, stderr, tell
from attn_cli.config import builtin_configs, load_config
from attn_cli.errors import UserError
from attn_cli.paths import RunPaths


def train(
    config: Path = ConfigOption,
    set_: Optional[List[str]] = SetOption,
    resume: bool = typer.Option(
        False,
        "--resume",
        help="Continue the run exactly where RUN/checkpoints/last.pt left off; --set may extend train.max_steps.",
    ),
    show_removed: int = ShowRemovedOption,
    list_configs: bool = typer.Option(
        False,
        "--list-configs",
        help="List the configs that ship with attn (--config finds them by name from any directory) and exit.",
    ),
) -> None:
    """Train a tokenizer (if the run has none) and a Transformer, with validation and checkpoints.

    Example:

      attn train --config en-zh.yaml

      attn train --config tiny.yaml --set train.max_steps=200 --set run_dir=runs/try

      attn train --config runs/try/config.yaml --resume --set train.max_steps=400

      attn train --config en-zh.yaml --set train.init_from=runs/en-zh \
        --set data.corpus.path=medical.tsv --set run_dir=runs/medical

      attn train --list-configs
    """
    if list_configs:
        for name, path in builtin_configs().items():
            first_line = path.read_text(encoding="utf-8").splitlines()[0].lstrip("# ")
            typer.echo(f"{name}: {first_line}")
        return
    # torch: imported when run, not for --help
    from attn_cli.training.distributed import is_main_process
    from attn_cli.training.progress import TrainingDisplay, format_duration
    from attn_cli.training.trainer import train as run_training

    cfg = load_config(config, set_ or [])
    try:
        result = run_training(cfg, TrainingDisplay(stderr, shown_removed=show_removed), resume=resume)
    except KeyboardInterrupt as stop:
        if not is_main_process():
            raise SystemExit(2) from None  # rank 0 says where the checkpoint is, once rank 0 has written it
        raise UserError(_interrupted(RunPaths.of(cfg.run_dir), str(stop))) from None
    if not is_main_process():
        return  # rank 0 of a torchrun run reports for all its processes
    best = result.best_metrics
    score = f", best validation BLEU {best['valid_bleu']:.2f}" if "valid_bleu" in best else ""
    tell(
        f"trained {result.step:,} steps ({result.epoch} epoch{'' if result.epoch == 1 else 's'}) "
        f"in {format_duration(result.elapsed)}{score}; "
        f"checkpoints in {result.paths.checkpoint_dir}"
    )


def _interrupted(paths: RunPaths, signal_name: str) -> str:
    """What a stopped run says: by which signal, and how to continue it."""
    by = f" by {signal_name}" if signal_name else ""
    saved = (
        f"; the last checkpoint is in {paths.last_checkpoint}; continue with "
        f"`attn train --config {paths.config} --resume`"
        if paths.last_checkpoint.is_file()
        else " before the first checkpoint"
    )
    return f"interrupted{by}{saved}"
