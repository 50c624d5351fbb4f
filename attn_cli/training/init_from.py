"""Starting a new run from another run's weights (`train.init_from`): fine-tuning on new data.

The new run takes the checkpoint's weights and tokenizer, and nothing else: its optimizer, learning
rate schedule (warmup included), data order and step count start afresh, on the new config's corpus.
The model and tokenizer settings must be the checkpoint's, as the weights fit no other shape and
the tokenizer is never trained again; the first that differs is refused by its key.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Optional

from attn_cli.config import Config, ConfigError, config_to_dict
from attn_cli.data.tokenizer import Tokenizers
from attn_cli.model import Transformer
from attn_cli.training.checkpoint import Checkpoint, find_checkpoint, load_checkpoint
from attn_cli.training.resume import differences

# The sections a fine-tuned run must share with the checkpoint it starts from.
_FIXED_SECTIONS = ("model", "tokenizer")


@dataclass
class StartingPoint:
    path: Path  # the checkpoint file
    checkpoint: Checkpoint

    @property
    def tokenizers(self) -> Tokenizers:
        return self.checkpoint.tokenizers

    @property
    def model(self) -> Transformer:
        return self.checkpoint.model


def starting_point(cfg: Config) -> Optional[StartingPoint]:
    """The checkpoint `train.init_from` names (a file, or a run directory's best.pt, else its
    last.pt), checked against `cfg`; None when it names none."""
    if cfg.train.init_from is None:
        return None
    given = Path(cfg.train.init_from)
    if not given.exists():
        raise ConfigError(f"{given} does not exist; name a checkpoint file or a run directory", "train.init_from")
    path = find_checkpoint(given, None) if given.is_dir() else given
    checkpoint = load_checkpoint(path)
    theirs, ours = config_to_dict(checkpoint.config), config_to_dict(cfg)
    for section in _FIXED_SECTIONS:
        for key, their_value, our_value in sorted(differences(theirs[section], ours[section], section)):
            raise ConfigError(
                f"{our_value!r} differs from {their_value!r} in {path}, the checkpoint train.init_from "
                f"starts from; a run started from a checkpoint keeps its model and tokenizer: set "
                f"{key}: {their_value!r}",
                key,
            )
    return StartingPoint(path, checkpoint)
