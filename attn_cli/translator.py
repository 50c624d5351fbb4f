"""What a translation is made with: checkpoints (several decode as an ensemble), or a directory
`attn export` wrote, loaded once and used for many translations. `attn translate`, `attn eval` and
`attn serve` load through here, so that a model decodes alike in all three.

Errors name the command-line flags (--run, --checkpoint, --model) that choose what is loaded."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Optional

from attn_cli.config import Config, DecodeConfig
from attn_cli.errors import UserError

if TYPE_CHECKING:
    from attn_cli.checkpoint import Checkpoint
    from attn_cli.data.tokenizer import Tokenizers
    from attn_cli.decoding.ensemble import Ensemble
    from attn_cli.decoding.glossary import Term
    from attn_cli.decoding.translate import Translation
    from attn_cli.export.exported import ExportedModel
    from attn_cli.model import Transformer


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


def translate(
    loaded: Loaded,
    sentences: Sequence[str],
    options: DecodeConfig,
    prefixes: Optional[Sequence[str]] = None,
    on_batch: Optional[Callable[[int, int], None]] = None,
    glossaries: Optional[Sequence[Sequence[Term]]] = None,
) -> list[Translation]:
    """Translations of `sentences` with what was loaded, each beginning with its prefix when
    `prefixes` are given and using the terms of its glossary (one list per sentence) where they
    apply: both in a checkpoint's own search only, for CTranslate2 takes neither."""
    from attn_cli.decoding.translate import translate_sentences

    exported, search = loaded.exported, None
    if exported is not None:
        if prefixes is not None and any(prefix.strip() for prefix in prefixes):
            raise UserError(
                "a prefix needs a checkpoint: attn forces prefixes in its own search, not "
                "CTranslate2's; use --run or --checkpoint instead of --model"
            )
        if glossaries is not None and any(glossaries):
            raise UserError(
                "a glossary needs a checkpoint: attn places terms in its own constrained search, which "
                "CTranslate2 has not; use --run or --checkpoint instead of --model"
            )
        prefixes = glossaries = None

        def search(src):
            return exported.search(src, options)

    return translate_sentences(
        loaded.model if exported is None else None,
        loaded.tokenizers,
        sentences,
        options,
        loaded.max_source_tokens,
        loaded.config.data.tgt_lang,
        on_batch,
        search=search,
        prefixes=prefixes,
        glossaries=glossaries,
        source_language=loaded.config.data.src_lang,
    )
