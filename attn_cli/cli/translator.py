"""What translate and eval share: the decoding flags, and a model (a checkpoint, or a directory
`attn export` wrote) loaded to translate with them.
The decoding and training modules (torch) are imported by the functions that use them, so that the
flags' help answers at once."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import typer

from attn_cli.cli.common import stderr
from attn_cli.config import ConfigError, DecodeConfig
from attn_cli.errors import UserError

if TYPE_CHECKING:
    from attn_cli.decoding.translate import Translation
    from attn_cli.export.exported import ExportedModel
    from attn_cli.training.checkpoint import Checkpoint

# Decoding flags of both commands; None leaves the checkpoint's config value.
BeamOption = typer.Option(None, "--beam", "-b", min=1, help="Beam size; 1 is greedy decoding (config: decode.beam_size).")
LengthPenaltyOption = typer.Option(None, "--length-penalty", help="GNMT length penalty alpha; 0 turns it off.")
BatchSizeOption = typer.Option(None, "--batch-size", min=1, help="Token budget of one decoding batch (source tokens).")
ModelOption = typer.Option(None, "--model", "-m", help="A model directory written by `attn export` (decoded by CTranslate2).")
ThreadsOption = typer.Option(None, "--threads", min=1, max=1024, help="CPU threads: torch's for a checkpoint (default: "
                             "torch's choice), CTranslate2's intra-op threads for --model (default 1).")

# The flag of each `decode` setting a command can override.
DECODE_FLAGS = {"beam_size": "--beam", "n_best": "--n-best", "length_penalty": "--length-penalty",
                "max_len_a": "--max-len-a", "max_len_b": "--max-len-b", "max_tokens": "--batch-size",
                "sample": "--sample", "temperature": "--temperature", "top_k": "--top-k", "top_p": "--top-p",
                "seed": "--seed"}


def decode_options(decode: DecodeConfig, flags: Mapping[str, Any]) -> DecodeConfig:
    """The checkpoint's decode settings with the flags the user gave (None = not given). A problem
    names this command's flags, not config keys: "--n-best: 4 is more than --beam=2"."""
    from attn_cli.decoding.translate import override_decode

    try:
        return override_decode(decode, flags)
    except ConfigError as error:
        # "decode": None: a problem of the whole section ("max_len_a=... and max_len_b=...") has no prefix.
        names = {"decode": None, **{f"decode.{setting}": DECODE_FLAGS[setting] for setting in flags}}
        raise UserError(error.describe(names)) from None


def load_for_decoding(run: Path | None, checkpoint: Path | None, model: Path | None,
                      device: str, threads: int | None = None) -> Checkpoint | ExportedModel:
    """The exported model at `model`, or else the checkpoint that --run and --checkpoint pick, on the
    device that --device names (a bad name is reported as --device's)."""
    import torch

    from attn_cli.training.checkpoint import find_checkpoint, load_checkpoint
    from attn_cli.training.setup import resolve_device

    resolved = resolve_device(device, "--device")
    if model is None:
        if threads is not None:
            torch.set_num_threads(threads)
        return load_checkpoint(find_checkpoint(run, checkpoint), resolved)
    if checkpoint is not None:
        raise UserError("--model and --checkpoint each name a model; give one of them")
    from attn_cli.export.exported import load_exported

    # One thread unless told: CTranslate2's 2-thread mode ran 1.1 to 15 times slower than its single
    # thread on the 2-core development machine (docs/benchmarks.md), never faster there.
    return load_exported(model, f"{resolved.type}:{resolved.index or 0}", threads=threads or 1)


class Translator:
    """A loaded model with the decode options of this command."""

    def __init__(self, loaded: Checkpoint | ExportedModel, options: DecodeConfig):
        self.loaded, self.options = loaded, options

    @property
    def exported(self) -> bool:
        return not hasattr(self.loaded, "model")

    def __call__(self, sentences: Sequence[str], on_batch=None) -> list[Translation]:
        from attn_cli.decoding.translate import translate_sentences

        cfg = self.loaded.config
        max_source_tokens = cfg.model.max_positions - 1  # the source's EOS takes one position
        if self.exported:
            return translate_sentences(None, self.loaded.tokenizers, sentences, self.options, max_source_tokens,
                                       cfg.data.tgt_lang, on_batch, search=lambda src: self.loaded.search(src, self.options))
        return translate_sentences(self.loaded.model, self.loaded.tokenizers, sentences, self.options,
                                   max_source_tokens, cfg.data.tgt_lang, on_batch)

    def translate_with_progress(self, sentences: Sequence[str]) -> list[Translation]:
        """Translate, with a progress bar on stderr that goes away when done."""
        from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeRemainingColumn

        with Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeRemainingColumn(),
                      console=stderr, transient=True) as progress:
            task = progress.add_task("translating", total=None)
            return self(sentences, on_batch=lambda done, total: progress.update(task, completed=done, total=total))
