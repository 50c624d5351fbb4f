"""The Typer app: one command per module, each registered with the shared error handler."""

from __future__ import annotations

import typer

from attn_cli import package_version
from attn_cli.cli.average import average
from attn_cli.cli.backtranslate import backtranslate
from attn_cli.cli.common import reports_user_errors
from attn_cli.cli.distill import distill
from attn_cli.cli.doctor import doctor
from attn_cli.cli.eval import evaluate
from attn_cli.cli.export import export
from attn_cli.cli.importing import import_hf
from attn_cli.cli.prepare import prepare
from attn_cli.cli.serve import serve
from attn_cli.cli.tokenizer import tokenizer
from attn_cli.cli.train import train
from attn_cli.cli.translate import translate

app = typer.Typer(
    name="attn",
    help="Train and run Transformer translation models.\n\n"
    "Example:\n\n"
    "  attn train --config en-zh.yaml\n\n"
    '  attn translate "I love machine learning"\n\n'
    "  attn eval --bleu",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)


def _print_version(wanted: bool) -> None:
    if wanted:
        typer.echo(f"attn {package_version()}")
        raise typer.Exit()


@app.callback()
def _options(
    version: bool = typer.Option(
        False, "--version", callback=_print_version, is_eager=True, help="Print attn's version and exit."
    ),
) -> None:
    # No docstring: the app's help above stays the help of `attn --help`.
    pass


# Registered here rather than decorated in each module, so that no command can miss the handler.
for name, command in [
    ("train", train),
    ("prepare", prepare),
    ("tokenizer", tokenizer),
    ("translate", translate),
    ("eval", evaluate),
    ("backtranslate", backtranslate),
    ("distill", distill),
    ("average", average),
    ("export", export),
    ("serve", serve),
    ("doctor", doctor),
]:
    app.command(name=name)(reports_user_errors(command))

# `attn import hf ...`: one source of models so far, named so that others can join it.
import_app = typer.Typer(help="Import a model trained elsewhere as an attn run.", no_args_is_help=True)
import_app.command(name="hf")(reports_user_errors(import_hf))
app.add_typer(import_app, name="import")


def main() -> None:
    app()


if __name__ == "__main__":
    main()
