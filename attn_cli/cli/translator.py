"""What translate and eval share: the decoding flags, and what they decode with: a checkpoint,
several checkpoints decoding as an ensemble, or a directory `attn export` wrote.
The decoding and training modules (torch) are imported by the functions that use them, so that the
flags' help answers at once."""

from __future__ import annotations

import inspect
import typing
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Optional

import typer

from attn_cli.cli.common import Command, stderr, tell
from attn_cli.config import Config, ConfigError, DecodeConfig
from attn_cli.errors import UserError

if TYPE_CHECKING:
    from attn_cli.checkpoint import Checkpoint
    from attn_cli.data.tokenizer import Tokenizers
    from attn_cli.decoding.ensemble import Ensemble
    from attn_cli.decoding.translate import Translation
    from attn_cli.export.exported import ExportedModel
    from attn_cli.model import Transformer

# --run and --checkpoint of both commands: repeated, they name the members of an ensemble.
RunsOption = typer.Option(
    None,
    "--run",
    help="Run directory (default: runs/en-zh, the run_dir of en-zh.yaml). "
    "Repeat to decode with an ensemble of the runs' best checkpoints: --run runs/a --run runs/b.",
)
CheckpointsOption = typer.Option(
    None,
    "--checkpoint",
    help="Checkpoint file (default: RUN/checkpoints/best.pt). "
    "Repeat to decode with an ensemble: --checkpoint a.pt --checkpoint b.pt.",
)


def decoding_flags(*keys: str) -> Callable[[Command], Command]:
    """A command that takes these decoding options (attn_cli/decoding/options.py) as flags, each
    given to its `**decode_flags` by its decode key, None when not given (the checkpoint's config
    value stays). Typer reads a command's flags from its signature, so they join the signature
    here, made from the one declaration of the options: their names, help, types and ranges."""
    from attn_cli.decoding.options import OPTIONS_BY_KEY

    types = typing.get_type_hints(DecodeConfig)

    def add_flags(command: Command) -> Command:
        signature = inspect.signature(command)
        kept = [p for p in signature.parameters.values() if p.kind is not inspect.Parameter.VAR_KEYWORD]
        flags = []
        for key in keys:
            option = OPTIONS_BY_KEY[key]
            default = typer.Option(None, *option.flags, min=option.minimum, help=option.help)
            annotation = Optional[types[key]]
            flags.append(inspect.Parameter(key, inspect.Parameter.KEYWORD_ONLY, default=default, annotation=annotation))
        command.__signature__ = signature.replace(parameters=kept + flags)
        return command

    return add_flags


ModelOption = typer.Option(
    None, "--model", "-m", help="A model directory written by `attn export` (decoded by CTranslate2)."
)
ThreadsOption = typer.Option(
    None,
    "--threads",
    min=1,
    max=1024,
    help="CPU threads: torch's for a checkpoint (default: "
    "torch's choice), CTranslate2's intra-op threads for --model (default 1).",
)


def decode_options(decode: DecodeConfig, flags: Mapping[str, Any]) -> DecodeConfig:
    """The checkpoint's decode settings with the flags the user gave (None = not given). A problem
    names this command's flags, not config keys: "--n-best: 4 is more than --beam=2"."""
    from attn_cli.decoding.options import flag_names, override_decode

    try:
        return override_decode(decode, flags)
    except ConfigError as error:
        raise UserError(error.describe(flag_names())) from None


@dataclass
class Loaded:
    """What a command decodes with: checkpoints (several decode as an ensemble, scored by the mean of
    their log-probabilities) or an exported model."""

    paths: list[Path]  # the checkpoint files, or the exported model's directory
    checkpoints: list[Checkpoint] = field(default_factory=list)  # empty for an exported model
    exported: Optional[ExportedModel] = None

    @property
    def config(self) -> Config:
        """The first checkpoint's: its decode settings and languages are the command's."""
        return self.exported.config if self.exported is not None else self.checkpoints[0].config

    @property
    def tokenizers(self) -> Tokenizers:
        """The first checkpoint's, which every other one shares (`load_for_decoding` checks)."""
        return self.exported.tokenizers if self.exported is not None else self.checkpoints[0].tokenizers

    @property
    def is_ensemble(self) -> bool:
        return len(self.checkpoints) > 1

    @property
    def model(self) -> Transformer | Ensemble:
        """The checkpoint's model, or the ensemble of the checkpoints' models."""
        from attn_cli.decoding.ensemble import Ensemble

        models = [checkpoint.model for checkpoint in self.checkpoints]
        return Ensemble(models) if len(models) > 1 else models[0]

    @property
    def max_source_tokens(self) -> int:
        """The longest source every model takes: the source's EOS takes one position."""
        configs = [self.exported.config] if self.exported is not None else [c.config for c in self.checkpoints]
        return min(config.model.max_sequence_tokens for config in configs)


def load_for_decoding(
    runs: Sequence[Path], checkpoints: Sequence[Path], model: Path | None, device: str, threads: int | None = None
) -> Loaded:
    """The exported model at `model`, or else the checkpoints that --run and --checkpoint pick, on the
    device that --device names (a bad name is reported as --device's). Checkpoints that do not share
    one tokenizer are refused: their token ids mean different pieces."""
    import torch

    from attn_cli.checkpoint import load_checkpoint, require_shared_tokenizers
    from attn_cli.device import resolve_device

    resolved = resolve_device(device, "--device")
    if model is None:
        if threads is not None:
            torch.set_num_threads(threads)
        paths = _checkpoint_paths(runs, checkpoints)
        loaded = [load_checkpoint(path, resolved) for path in paths]
        require_shared_tokenizers([(str(path), checkpoint.tokenizers) for path, checkpoint in zip(paths, loaded)])
        return Loaded(paths, loaded)
    if checkpoints:
        raise UserError("--model and --checkpoint each name a model; give one of them")
    if len(runs) > 1:
        raise UserError(
            "--model cannot join an ensemble; decode an exported model alone, or ensemble checkpoints "
            "with --run A --run B"
        )
    from attn_cli.export.exported import load_exported

    # One thread unless told: on small CPUs CTranslate2's intra-op threads slowed it down rather than
    # sped it up (docs/benchmarks.md).
    return Loaded(
        [model], exported=load_exported(model, f"{resolved.type}:{resolved.index or 0}", threads=threads or 1)
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


class Translator:
    """What a command decodes with, and its decode options."""

    def __init__(self, loaded: Loaded, options: DecodeConfig):
        self.loaded, self.options = loaded, options
        if loaded.exported is not None and options.no_stutter:
            # CTranslate2 searches on its own: attn's output rules cannot join its search.
            from attn_cli.decoding.translate import output_constraints

            rules = " and ".join(c.rule for c in output_constraints(loaded.tokenizers.target, options))
            tell(
                f"warning: --model decodes with CTranslate2, which cannot apply {rules} as attn's own search "
                f"does, so outputs may differ from --run's; use --run or --checkpoint to apply them, or "
                f"--allow-stutter to decode without decode.no_stutter"
            )

    @property
    def exported(self) -> bool:
        return self.loaded.exported is not None

    def __call__(
        self, sentences: Sequence[str], prefixes: Optional[Sequence[str]] = None, on_batch=None
    ) -> list[Translation]:
        """Translations of `sentences`, each beginning with its prefix when `prefixes` are given."""
        from attn_cli.decoding.translate import translate_sentences

        loaded, exported, search = self.loaded, self.loaded.exported, None
        if exported is not None:
            if prefixes is not None and any(prefix.strip() for prefix in prefixes):
                raise UserError(
                    "a prefix needs a checkpoint: attn forces prefixes in its own search, not "
                    "CTranslate2's; use --run or --checkpoint instead of --model"
                )
            prefixes = None

            def search(src):
                return exported.search(src, self.options)

        model = loaded.model if exported is None else None
        return translate_sentences(
            model,
            loaded.tokenizers,
            sentences,
            self.options,
            loaded.max_source_tokens,
            loaded.config.data.tgt_lang,
            on_batch,
            search=search,
            prefixes=prefixes,
        )

    def translate_with_progress(
        self, sentences: Sequence[str], prefixes: Optional[Sequence[str]] = None
    ) -> list[Translation]:
        """Translate, with a progress bar on stderr that goes away when done."""
        from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeRemainingColumn

        with Progress(
            TextColumn("{task.description}"),
            BarColumn(),
            MofNCompleteColumn(),
            TimeRemainingColumn(),
            console=stderr,
            transient=True,
        ) as progress:
            task = progress.add_task("translating", total=None)
            return self(
                sentences, prefixes, on_batch=lambda done, total: progress.update(task, completed=done, total=total)
            )
