"""`attn tokenizer`: train a run's SentencePiece tokenizer on its own."""

from __future__ import annotations

from pathlib import Path
from typing import List, Optional

import typer

from attn_cli.cli.common import ConfigOption, SetOption, stderr, tell
from attn_cli.config import load_config
from attn_cli.paths import RunPaths


def tokenizer(
    config: Path = ConfigOption,
    set_: Optional[List[str]] = SetOption,
    retrain: bool = typer.Option(False, "--retrain", help="Replace the run's tokenizer if it has one."),
) -> None:
    """Train the run's SentencePiece tokenizer on its own.

    Example:

      attn tokenizer --config en-zh.yaml --set tokenizer.vocab_size=16000 --retrain
    """
    # sentencepiece and datasets: imported when run, not for --help
    from attn_cli.data.prepare import read_split, train_or_load_tokenizers, write_splits
    from attn_cli.training.guards import run_directory_lock

    cfg = load_config(config, set_ or [])
    with run_directory_lock(RunPaths.of(cfg.run_dir)):  # never under a training run's feet
        split = read_split(cfg, stderr.print)
        write_splits(cfg, split)
        tokenizers = train_or_load_tokenizers(cfg, split, stderr.print, retrain=retrain)
    sample = next(split.train_pairs(), ("Hello, world.", "你好，世界。"))
    tell(
        f"example: {' '.join(tokenizers.source.encode_pieces([sample[0]])[0])}  |  "
        f"{' '.join(tokenizers.target.encode_pieces([sample[1]])[0])}"
    )
