"""The engine a command decodes with, from what its flags name: a directory `attn export` wrote
(--model), or checkpoints (--run, --checkpoint; several decode as an ensemble). `attn translate`,
`attn eval` and `attn serve` load through here, so that a model decodes alike in all three.

Errors name the command-line flags that choose what is loaded. Imports the engine it loads and no
other: torch for checkpoints, CTranslate2 for an export.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Optional

from attn_cli.errors import UserError

if TYPE_CHECKING:
    from attn_cli.decoding.engine import Engine
    from attn_cli.engines.pytorch import TorchEngine


def load_engine(
    runs: Sequence[Path], checkpoints: Sequence[Path], model: Optional[Path], device: str, threads: Optional[int] = None
) -> Engine:
    """The exported model at `model`, or else the checkpoints that --run and --checkpoint pick, on the
    device that --device names. `threads` are torch's for checkpoints (None: torch's choice) and
    CTranslate2's intra-op threads for an export (None: one, which on small CPUs is faster than more;
    docs/benchmarks.md)."""
    if model is None:
        return load_checkpoints(_checkpoint_paths(runs, checkpoints), device, threads)
    if checkpoints:
        raise UserError("--model and --checkpoint each name a model; give one of them")
    if len(runs) > 1:
        raise UserError(
            "--model cannot join an ensemble; decode an exported model alone, or ensemble checkpoints "
            "with --run A --run B"
        )
    from attn_cli.engines.ctranslate2 import load_exported

    return load_exported(model, device, threads=threads or 1)


def load_checkpoints(paths: Sequence[Path], device: str, threads: Optional[int] = None) -> TorchEngine:
    """The checkpoints at `paths` as one engine (several: an ensemble). Checkpoints that do not share
    one tokenizer are refused: their token ids mean different pieces."""
    import torch

    from attn_cli.checkpoint import load_checkpoint, require_shared_tokenizers
    from attn_cli.device import resolve_device
    from attn_cli.engines.pytorch import TorchEngine

    resolved = resolve_device(device, "--device")
    if threads is not None:
        torch.set_num_threads(threads)
    loaded = [load_checkpoint(path, resolved) for path in paths]
    require_shared_tokenizers([(str(path), checkpoint.tokenizers) for path, checkpoint in zip(paths, loaded)])
    return TorchEngine(
        [checkpoint.model for checkpoint in loaded],
        loaded[0].tokenizers,
        [c.config for c in loaded],
        paths,
        loaded[0].lengths,
    )


def _checkpoint_paths(runs: Sequence[Path], checkpoints: Sequence[Path]) -> list[Path]:
    """Each --checkpoint when there are any (one --run beside them names only eval's test split, as
    before ensembles), else the best checkpoint of each --run, else the default run's."""
    from attn_cli.checkpoint import find_checkpoint

    if checkpoints and len(runs) > 1:
        raise UserError(
            "an ensemble is several --checkpoint or several --run, not both; name every member as a --checkpoint FILE"
        )
    if checkpoints:
        return [find_checkpoint(None, checkpoint) for checkpoint in checkpoints]
    return [find_checkpoint(run, None) for run in runs] or [find_checkpoint(None, None)]
