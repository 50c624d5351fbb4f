"""What translate, eval and serve share on the command line: the --run/--checkpoint/--model and
decoding flags, the engine's refusals in the words of those flags, and a progress bar. The decoding
modules are imported by the functions that use them, so that the flags' help answers at once."""

from __future__ import annotations

import contextlib
import inspect
import typing
from collections.abc import Callable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, Optional

import typer

from attn_cli.cli.common import Command, stderr, tell
from attn_cli.config import ConfigError, DecodeConfig
from attn_cli.decoding.engine import Wording, refusals, target_refusals
from attn_cli.errors import UserError

if TYPE_CHECKING:
    from attn_cli.decoding.engine import Engine
    from attn_cli.decoding.records import Source

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


# The flags of the commands that translate files (eval, backtranslate, distill), grouped as they share them.
SEARCH_FLAGS = (
    "beam_size",
    "length_penalty",
    "no_repeat_ngram",
    "no_stutter",
    "no_loops",
    "learned_lengths",
    "split_clauses",
)
LENGTH_FLAGS = ("max_len_a", "max_len_b")
SAMPLING_FLAGS = ("sample", "temperature", "top_k", "top_p", "seed")

# A refusal (attn_cli/decoding/engine.py) in the command line's words.
WORDING = Wording(
    names={
        "prefix": "--prefix",
        "terms": "--glossary",
        "sample": "--sample",
        "attention": "--show-attention/--attention-out",
        "no_stutter": "--no-stutter",
        "target": "--target",
    },
    fixes={
        "checkpoint": "use --run or --checkpoint instead of --model",
        "one_checkpoint": "give one --run or --checkpoint",
        "beam": "use --beam 2 or more (5 is usual) without --sample",
        "allow_stutter": "use --run or --checkpoint to keep it, or --allow-stutter to decode without it",
        "target": 'give --target LANGUAGE (a JSONL line may give its own "target")',
    },
)


def check_refusals(
    engine: Engine, options: DecodeConfig, sources: Sequence[Source], warn: bool = True, target_required: bool = True
) -> None:
    """A UserError for the first thing the engine refuses of `options` and `sources` (a target
    language it does not write, or none for a model of several when `target_required`); with
    `warn`, a warning for what it does otherwise (CTranslate2 without attn's output rules). A
    command checks its flags once with `warn`, and each batch of input lines without it."""
    found = [
        *target_refusals(engine, sources, required=target_required),
        *refusals(engine.capabilities, options, sources),
    ]
    for refusal in found:
        if not refusal.warning:
            raise UserError(refusal.message(WORDING))
        if warn:
            tell(f"warning: {refusal.message(WORDING)}")


@contextlib.contextmanager
def progress_bar(description: str = "translating") -> Iterator[Callable[[int, int], None]]:
    """An `on_batch(done, total)` that draws a progress bar on stderr, gone when done."""
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeRemainingColumn

    with Progress(
        TextColumn("{task.description}"),
        BarColumn(),
        MofNCompleteColumn(),
        TimeRemainingColumn(),
        console=stderr,
        transient=True,
    ) as progress:
        task = progress.add_task(description, total=None)
        yield lambda done, total: progress.update(task, completed=done, total=total)


def run_of(engine: Engine, run: Optional[Sequence[Path]], model: Optional[Path]):
    """The run whose test split a model is scored on: --run's (an ensemble's first), an exported
    model's (the run its config names), or a checkpoint's own."""
    from attn_cli.paths import RunPaths

    if run:
        return RunPaths.of(run[0])
    if model is not None:
        return RunPaths.of(engine.config.run_dir)
    return RunPaths.of_checkpoint(engine.paths[0])
