"""Which config a resumed run continues with.

A run resumes with the config it was trained with. Settings that only say how long to go on, where
to run, or how often to report may change (extending train.max_steps is the usual reason to
resume); anything that shaped the model, its tokenizer, the data order or the optimizer may not,
because the saved state would no longer fit it.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Iterator

from attn_cli.config import Config, ConfigError, config_to_dict

# YAML paths (and whole sections) that a resumed run may change.
RESUMABLE = (
    "run_dir",
    "train.device",
    "train.threads",
    "train.precision",
    "train.compile",
    "train.gradient_checkpointing",
    "train.max_epochs",
    "train.max_steps",
    "train.max_minutes",
    "train.valid_every",
    "train.log_every",
    "train.max_nonfinite_steps",
    "train.keep_last",
    "train.early_stopping",
    "decode",
)


def _may_change(path: str) -> bool:
    return any(path == allowed or path.startswith(allowed + ".") for allowed in RESUMABLE)


def differences(saved: Any, given: Any, path: str = "") -> Iterator[tuple[str, Any, Any]]:
    """(YAML path, saved value, given value) for every leaf that differs."""
    if isinstance(saved, dict) and isinstance(given, dict):
        for key in saved.keys() | given.keys():
            yield from differences(saved.get(key), given.get(key), f"{path}.{key}" if path else key)
    elif saved != given:
        yield path, saved, given


def resume_config(given: Config, saved: Config, checkpoint: Path) -> tuple[Config, list[str]]:
    """The config to resume with, and one line per changed setting for the log.

    `given` is what the user asked for now (config file and --set), `saved` what the run was
    trained with; a change outside RESUMABLE raises ConfigError naming the key.
    """
    changes = []
    for path, old, new in sorted(differences(config_to_dict(saved), config_to_dict(given))):
        if not _may_change(path):
            raise ConfigError(
                f"{new!r} differs from {old!r} in {checkpoint}, the run being resumed; a resumed run keeps "
                f"its model, tokenizer, data and optimizer settings. Resume with the run's own config "
                f"(--config {Path(given.run_dir) / 'config.yaml'}) and --set only train.max_steps, max_epochs, "
                f"max_minutes, device, precision and the like, or start a new run_dir",
                path,
            )
        changes.append(f"{path}: {old!r} -> {new!r}")
    return given, changes
