"""What translate, eval and serve share on the command line: the --run/--checkpoint/--model and
decoding flags, and the `Translator` that decodes with what they load (attn_cli/translator.py).
The decoding modules (torch) are imported by the functions that use them, so that the flags' help
answers at once."""

from __future__ import annotations

import inspect
import typing
from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any, Optional

import typer

from attn_cli.cli.common import Command, stderr, tell
from attn_cli.config import ConfigError, DecodeConfig
from attn_cli.errors import UserError
from attn_cli.translator import Loaded, translate

if TYPE_CHECKING:
    from attn_cli.decoding.glossary import Term
    from attn_cli.decoding.translate import Translation

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
        self,
        sentences: Sequence[str],
        prefixes: Optional[Sequence[str]] = None,
        glossaries: Optional[Sequence[Sequence[Term]]] = None,
        on_batch=None,
    ) -> list[Translation]:
        """Translations of `sentences`, each beginning with its prefix when `prefixes` are given and
        using its glossary's terms (one list per sentence) where they apply."""
        return translate(self.loaded, sentences, self.options, prefixes, on_batch, glossaries)

    def translate_with_progress(
        self,
        sentences: Sequence[str],
        prefixes: Optional[Sequence[str]] = None,
        glossaries: Optional[Sequence[Sequence[Term]]] = None,
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
                sentences,
                prefixes,
                glossaries,
                on_batch=lambda done, total: progress.update(task, completed=done, total=total),
            )
