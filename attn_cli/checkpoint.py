"""Self-describing checkpoints: written atomically, loaded without running code, averaged.

A checkpoint holds the config, both tokenizer models, the model weights, step, epoch, metrics and
the training pairs' lengths (data/lengths.py), so it alone rebuilds a translator; a training run's
checkpoints also keep what resuming it exactly needs (`training_state`, written and read by
attn_cli/training/state.py). Saving writes a temporary
file in the same directory and renames it over the old one (attn_cli/files.py): a crash mid-save
never leaves a broken checkpoint behind. This is the layer below decoding and export: translating,
exporting and serving load models from here and never import the training package.

Averaging the last few checkpoints of a run smooths out the noise of the final updates and usually
translates a little better than any one of them (Vaswani et al., 2017, averaged the last 5 or 20).
The mean is taken in fp32 whatever the stored dtype; integer buffers (counters, ids) cannot be
averaged and are taken from the newest checkpoint.
"""

from __future__ import annotations

import pickle
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Optional, Sequence

import torch

from attn_cli.config import Config, config_from_dict, config_to_dict, default_run_dir
from attn_cli.data.lengths import LengthModel
from attn_cli.data.tokenizer import Tokenizers
from attn_cli.device import allocate_model
from attn_cli.errors import UserError
from attn_cli.files import write_error, written_whole
from attn_cli.model import Transformer
from attn_cli.paths import RunPaths

FORMAT_VERSION = 1


class CheckpointError(UserError, RuntimeError):
    pass


@dataclass
class Checkpoint:
    config: Config
    tokenizers: Tokenizers
    model: Transformer
    step: int = 0
    epoch: int = 0
    metrics: dict = field(default_factory=dict)
    training_state: dict = field(default_factory=dict)  # what resuming needs: training/state.py
    lengths: Optional[LengthModel] = None  # the training pairs' lengths; None for an import or an older run


def save_checkpoint(
    path: str | Path,
    config: Config,
    tokenizers: Tokenizers,
    model: Transformer,
    step: int,
    epoch: int,
    metrics: Optional[dict] = None,
    training_state: Optional[dict] = None,
    lengths: Optional[LengthModel] = None,
) -> None:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    payload = {
        "format_version": FORMAT_VERSION,
        "config": config_to_dict(config),
        "tokenizers": tokenizers.to_state(),
        "model": {name: tensor.detach().cpu() for name, tensor in model.state_dict().items()},
        "step": step,
        "epoch": epoch,
        "metrics": metrics or {},
        "training_state": training_state or {},
        **({"lengths": torch.from_numpy(lengths.counts.copy())} if lengths is not None else {}),
    }
    try:
        with written_whole(path, binary=True) as handle:
            torch.save(payload, handle)
    except RuntimeError as error:
        cause = _write_failure(error)
        if cause is None:
            raise
        raise write_error(path, cause) from None


def _write_failure(error: RuntimeError) -> Optional[str]:
    """Why torch's writer failed, when it did: it reports the OSError it met (a full disk) as a
    RuntimeError of its own, with that OSError chained or only its own words. None: another error."""
    link: Optional[BaseException] = error
    while link is not None:
        if isinstance(link, OSError):
            return link.strerror or str(link)
        link = link.__cause__ or link.__context__
    words = str(error).strip()
    if "PytorchStreamWriter" in words or "inline_container" in words:
        return words.splitlines()[0]
    return None


def _fuse_attention_projections(state: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """Checkpoints written before attention fused its projections hold separate q/k/v matrices:
    stack them into the fused ones (qkv_proj for self-attention, kv_proj for cross-attention)."""
    state = dict(state)
    for name in [n for n in state if n.endswith(".k_proj.weight")]:
        prefix = name[: -len("k_proj.weight")]
        fused, parts = (
            ("kv_proj", ("k_proj", "v_proj"))
            if "cross_attention" in prefix
            else ("qkv_proj", ("q_proj", "k_proj", "v_proj"))
        )
        for kind in ("weight", "bias"):
            state[f"{prefix}{fused}.{kind}"] = torch.cat([state.pop(f"{prefix}{part}.{kind}") for part in parts])
    return state


def find_checkpoint(run: Optional[Path], checkpoint: Optional[Path]) -> Path:
    """The checkpoint translate and eval load: `checkpoint` when given, else the run's best.pt, else
    its last.pt; without a run, those of the default config's run."""
    if checkpoint is not None:
        if not checkpoint.is_file():
            raise CheckpointError(f"checkpoint not found: {checkpoint}")
        return checkpoint
    paths = RunPaths.of(run if run is not None else default_run_dir())
    for candidate in (paths.best_checkpoint, paths.last_checkpoint):
        if candidate.is_file():
            return candidate
    raise CheckpointError(
        f"no checkpoint in {paths.checkpoint_dir} (looked for best.pt and last.pt); "
        f"train one with `attn train --config en-zh.yaml`, or pass --run DIR or --checkpoint PATH"
    )


def load_checkpoint(path: str | Path, device: str | torch.device = "cpu") -> Checkpoint:
    path = Path(path)
    if not path.is_file():
        raise CheckpointError(f"no checkpoint at {path}")
    try:
        # weights_only: unpickling builds tensors and plain data only, so no file can run code here.
        payload: dict[str, Any] = torch.load(path, map_location="cpu", weights_only=True)
    except pickle.UnpicklingError:
        raise CheckpointError(
            f"{path} is not an attn checkpoint: it holds objects other than tensors and plain "
            "data, which attn never loads (nothing in the file was run)"
        ) from None
    except Exception as error:  # a truncated or foreign file
        raise CheckpointError(f"{path} is not a readable attn checkpoint: {_why_unreadable(path, error)}") from None
    if not isinstance(payload, dict) or payload.get("format_version") != FORMAT_VERSION:
        raise CheckpointError(f"{path} is not an attn checkpoint of format {FORMAT_VERSION}")
    try:
        config = config_from_dict(payload["config"])
        tokenizers = Tokenizers.from_state(payload["tokenizers"])
        model = allocate_model(
            config.model,
            tokenizers.source.vocab_size,
            tokenizers.target.vocab_size,
            torch.device("cpu"),
            training=False,
            fix=f"{path} is not a model this machine can load",
        )
        model.load_state_dict(_fuse_attention_projections(payload["model"]))
        loaded = Checkpoint(
            config,
            tokenizers,
            model,
            payload["step"],
            payload["epoch"],
            payload["metrics"],
            payload["training_state"],
            LengthModel.from_counts(_numpy(payload.get("lengths"))),
        )
    except KeyError as missing:
        raise CheckpointError(f"{path} is an incomplete attn checkpoint: it has no {missing}") from None
    except (TypeError, ValueError, RuntimeError) as error:  # parts of the wrong type or shape
        raise CheckpointError(f"{path} is a damaged attn checkpoint: {str(error).splitlines()[0]}") from None
    model.to(device).eval()
    return loaded


def _numpy(tensor: Optional[torch.Tensor]):
    return None if tensor is None else tensor.numpy()


def _why_unreadable(path: Path, error: Exception) -> str:
    """What torch's loader, whose messages are about its internals, found wrong with the file."""
    with path.open("rb") as handle:
        start = handle.read(4)
    if not start:
        return "the file is empty"
    if start != b"PK\x03\x04":  # torch.save writes a zip archive
        return "it is not a file torch.save wrote (those are zip archives)"
    detail = str(error).strip().splitlines()[0] if str(error).strip() else type(error).__name__
    return f"it is cut short or damaged ({detail})"


def keep_newest_step_checkpoints(paths: RunPaths, keep: int) -> None:
    """Delete all but the `keep` (>= 1) newest step-numbered checkpoints; best.pt and last.pt stay."""
    for old in paths.step_checkpoints()[:-keep]:
        old.unlink(missing_ok=True)


def require_shared_tokenizers(named: Sequence[tuple[str, Tokenizers]]) -> None:
    """Refuse models whose tokenizers differ: token ids would mean different pieces, so
    averaging their distributions would mix unrelated tokens. `named` pairs a name for the user (a
    checkpoint path) with that model's tokenizers."""
    (first_name, first), *others = named
    for name, tokenizers in others:
        if tokenizers.to_state() != first.to_state():  # the models, and any vocabulary and source prefix
            raise UserError(
                f"{first_name} and {name} use different tokenizers, so they cannot decode as an ensemble; "
                f"ensemble checkpoints that share one (of the same run, or of runs trained with the same "
                f"tokenizer/ folder)"
            )


StateDict = dict[str, torch.Tensor]


def average_state_dicts(states: Sequence[StateDict]) -> StateDict:
    """The elementwise mean of floating-point entries; other entries from the last (newest) state."""
    newest = states[-1]
    averaged = {}
    for name, tensor in newest.items():
        if not tensor.is_floating_point():
            averaged[name] = tensor.clone()
            continue
        total = torch.zeros(tensor.shape, dtype=torch.float32)
        for state in states:
            total += state[name].float()
        averaged[name] = (total / len(states)).to(tensor.dtype)
    return averaged


def average_checkpoints(paths: Sequence[Path], output: Path) -> Checkpoint:
    """Average the weights of `paths` (oldest first) into a new checkpoint at `output`.

    The result keeps the newest checkpoint's config, tokenizers, step and epoch, and no training
    state: it is for translating and scoring, not for resuming.
    """
    if not paths:
        raise CheckpointError("no checkpoints to average")
    newest = load_checkpoint(paths[-1])
    states, steps = [], []
    for path in paths:
        loaded = newest if path == paths[-1] else load_checkpoint(path)
        if loaded.config.model != newest.config.model:
            raise CheckpointError(
                f"{path} has a different model config than {paths[-1]}; only checkpoints of one run can be averaged"
            )
        states.append(loaded.model.state_dict())
        steps.append(loaded.step)
    newest.model.load_state_dict(average_state_dicts(states))
    metrics = {"averaged_steps": steps}
    save_checkpoint(
        output, newest.config, newest.tokenizers, newest.model, newest.step, newest.epoch, metrics, None, newest.lengths
    )
    newest.metrics = metrics
    return newest
