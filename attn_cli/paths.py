"""Where a run keeps its files. One place, so train, translate and eval agree."""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from attn_cli.languages import Direction

_STEP_CHECKPOINT = re.compile(r"step-(\d+)\.pt")


@dataclass(frozen=True)
class RunPaths:
    root: Path

    @classmethod
    def of(cls, run_dir: str | Path) -> "RunPaths":
        return cls(Path(run_dir))

    @classmethod
    def of_checkpoint(cls, checkpoint: str | Path) -> "RunPaths":
        """The run a checkpoint belongs to: checkpoints live in RUN/checkpoints/."""
        return cls(Path(checkpoint).parent.parent)

    # The run directory's layout, a path each. config.yaml: the resolved config, overrides applied;
    # data/: the valid and test splits as plain text, one sentence a line; data/prepared/: the
    # training data tokenized once (attn_cli/data/prepared.py).
    config = property(lambda self: self.root / "config.yaml")
    tokenizer_dir = property(lambda self: self.root / "tokenizer")
    data_dir = property(lambda self: self.root / "data")
    prepared_dir = property(lambda self: self.data_dir / "prepared")
    checkpoint_dir = property(lambda self: self.root / "checkpoints")
    best_checkpoint = property(lambda self: self.checkpoint_dir / "best.pt")
    last_checkpoint = property(lambda self: self.checkpoint_dir / "last.pt")
    metrics_log = property(lambda self: self.root / "metrics.jsonl")
    tensorboard_dir = property(lambda self: self.root / "tensorboard")

    def split_file(self, split: str, language: str) -> Path:
        return self.data_dir / f"{split}.{language}"

    def held_out_files(self, split: str, direction: Direction, several: bool) -> tuple[Path, Path]:
        """The source and reference files of a split ("valid", "test") in one direction: test.en and
        test.zh; for a model of `several` directions, test.en-zh.en and test.en-zh.zh."""
        if not several:
            return self.split_file(split, direction.source), self.split_file(split, direction.target)
        return tuple(self.data_dir / f"{split}.{direction}.{language}" for language in direction)

    def step_checkpoint(self, step: int) -> Path:
        return self.checkpoint_dir / f"step-{step:06d}.pt"  # zero-padded, so a listing sorts by step

    def step_checkpoints(self) -> list[Path]:
        """The step-numbered checkpoints (train.keep_last), oldest first."""
        if not self.checkpoint_dir.is_dir():
            return []
        found = [
            (int(match.group(1)), path)
            for path in self.checkpoint_dir.iterdir()
            if (match := _STEP_CHECKPOINT.fullmatch(path.name))
        ]
        return [path for _, path in sorted(found)]

    def average_checkpoint(self, count: int) -> Path:
        return self.checkpoint_dir / f"average-last{count}.pt"


def hypotheses_file(made_by: Sequence[Path], source: Path) -> Path:
    """Where `attn eval` keeps the translations of `source`: next to the checkpoint (or exported model)
    that made them; an ensemble's next to its first checkpoint, named after all of them
    (best+last.test.en.hyp), so that no member's own hypotheses are overwritten."""
    return made_by[0].with_name(f"{'+'.join(path.stem for path in made_by)}.{source.name}.hyp")
