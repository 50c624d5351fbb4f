"""`attn prepare`: the data stage of `attn train` alone: read, split, train the tokenizer, tokenize."""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import List, Optional

import typer

from attn_cli.cli.common import ConfigOption, SetOption, ShowRemovedOption, stderr, tell
from attn_cli.config import load_config
from attn_cli.paths import RunPaths


def prepare(
    config: Path = ConfigOption,
    set_: Optional[List[str]] = SetOption,
    as_json: bool = typer.Option(False, "--json", help="Print the statistics as JSON on stdout."),
    show_removed: int = ShowRemovedOption,
) -> None:
    """Prepare a config's training data once, so that every later `attn train` (and every torchrun
    process) opens it memory-mapped instead of reading and tokenizing the corpus again.

    Prints what it found: pairs read and skipped (by reason), removed by data.filters (by rule, with
    examples), dropped by the length filters, per split; token counts and length percentiles.

    Example:

      attn prepare --config en-zh.yaml

      attn prepare --config noisy.yaml --show-removed 10

      attn prepare --config big.yaml --set data.cache_dir=/shared/attn-data

      attn train --config big.yaml --set data.cache_dir=/shared/attn-data
    """
    # sentencepiece, numpy and the corpus readers: imported when run, not for --help
    from attn_cli.data.prepare import removed_examples, tokenizers_and_data
    from attn_cli.training.guards import run_directory_lock

    cfg = load_config(config, set_ or [])
    started = time.perf_counter()
    with run_directory_lock(RunPaths.of(cfg.run_dir)):  # never under a training run's feet
        _, prepared = tokenizers_and_data(cfg, stderr.print, shown_removed=show_removed)
    stats = dict(prepared.stats, directory=str(prepared.directory), seconds=round(time.perf_counter() - started, 1))
    if as_json:
        print(json.dumps(stats, indent=1))
        return
    skipped = ", ".join(f"{count:,} {reason}" for reason, count in stats["skipped_lines"].items()) or "none"
    tell(f"prepared data: {prepared.directory} ({stats['seconds']} s)")
    tell(
        f"  training pairs: {stats['training_pairs_read']:,} read, {stats['dropped_by_length']:,} dropped by the "
        f"length filters, {stats['training_pairs']:,} kept; "
        f"validation {stats['valid_pairs']:,}, test {stats['test_pairs']:,}"
    )
    tell(f"  malformed lines skipped: {skipped}")
    for corpus in stats["corpora"]:
        each = ", ".join(f"{count:,} {rule}" for rule, count in corpus["removed_by_filters"].items()) or "none"
        name = f" from {corpus['name']}" if len(stats["corpora"]) > 1 else ""
        tell(f"  removed by data.filters{name}: {each} (of {corpus['pairs_read']:,} pairs read)")
        for line in removed_examples(corpus["removed_examples"], show_removed):
            tell(f"  {line}")
    for side in ("source", "target"):
        tokens = stats[f"{side}_tokens"]
        if tokens["total"]:
            tell(
                f"  {side} tokens: {tokens['total']:,} in all; per pair median {tokens['p50']:g}, "
                f"90% {tokens['p90']:g}, 99% {tokens['p99']:g}, longest {tokens['max']:,}"
            )
