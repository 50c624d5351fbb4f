"""The `attn` command line: parse, call, print. No logic lives here."""

from __future__ import annotations

from pathlib import Path
from typing import List, Optional

import typer
from rich.console import Console

from attn_cli import commands
from attn_cli.errors import UserError

app = typer.Typer(
    name="attn",
    help="Train and run Transformer translation models.\n\n"
         "Example:\n\n"
         "  attn train --config configs/en-zh.yaml\n\n"
         "  attn translate \"I love machine learning\"\n\n"
         "  attn eval --bleu",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)
_stderr = Console(stderr=True, soft_wrap=True)

ConfigOption = typer.Option(Path("configs/en-zh.yaml"), "--config", "-c", help="YAML config file.")
SetOption = typer.Option(None, "--set", help="Override a config value, e.g. --set train.max_steps=100 (repeatable).")
RunOption = typer.Option(None, "--run", help="Run directory (default: run_dir of configs/en-zh.yaml).")
CheckpointOption = typer.Option(None, "--checkpoint", help="Checkpoint file (default: RUN/checkpoints/best.pt).")
DeviceOption = typer.Option("auto", "--device", help="auto, cpu, cuda or cuda:N.")


def _fail(error: Exception) -> None:
    _stderr.print(f"[bold red]error:[/] {error}", highlight=False)
    raise typer.Exit(code=2)


@app.command()
def train(config: Path = ConfigOption, set_: Optional[List[str]] = SetOption,
          resume: bool = typer.Option(False, "--resume", help="Continue the run exactly where "
                                      "RUN/checkpoints/last.pt left off; --set may extend train.max_steps.")) -> None:
    """Train a tokenizer (if the run has none) and a Transformer, with validation and checkpoints.

    Example:

      attn train --config configs/en-zh.yaml

      attn train --config configs/tiny.yaml --set train.max_steps=200 --set run_dir=runs/try

      attn train --config runs/try/config.yaml --resume --set train.max_steps=400
    """
    try:
        commands.train(config, set_ or [], resume, _stderr)
    except UserError as error:
        _fail(error)


@app.command()
def tokenizer(config: Path = ConfigOption, set_: Optional[List[str]] = SetOption,
              retrain: bool = typer.Option(False, "--retrain", help="Replace the run's tokenizer if it has one.")) -> None:
    """Train the run's SentencePiece tokenizer on its own.

    Example:

      attn tokenizer --config configs/en-zh.yaml --set tokenizer.vocab_size=16000 --retrain
    """
    try:
        commands.tokenizer(config, set_ or [], retrain, _stderr)
    except UserError as error:
        _fail(error)


@app.command()
def translate(
    text: Optional[List[str]] = typer.Argument(None, help="Sentences to translate; none reads stdin, one per line."),
    run: Optional[Path] = RunOption,
    checkpoint: Optional[Path] = CheckpointOption,
    input_file: Optional[Path] = typer.Option(None, "--input", "-i", help="Translate this file, one sentence per line."),
    output_file: Optional[Path] = typer.Option(None, "--output", "-o", help="Write translations here instead of stdout."),
    device: str = DeviceOption,
) -> None:
    """Translate sentences with a trained model (greedy decoding with a KV cache).

    Example:

      attn translate "I love machine learning"

      echo "Where is the station?" | attn translate --run runs/en-zh

      attn translate --input news.en --output news.zh
    """
    try:
        commands.translate(text or [], run, checkpoint, input_file, output_file, device, _stderr)
    except UserError as error:
        _fail(error)


@app.command(name="eval")
def evaluate(
    bleu: bool = typer.Option(True, "--bleu/--no-bleu", help="Report sacreBLEU BLEU and chrF."),
    run: Optional[Path] = RunOption,
    checkpoint: Optional[Path] = CheckpointOption,
    src: Optional[Path] = typer.Option(None, "--src", help="Source sentences (default: the run's test split)."),
    ref: Optional[Path] = typer.Option(None, "--ref", help="Reference translations, line by line with --src."),
    device: str = DeviceOption,
) -> None:
    """Translate a test set and score it with sacreBLEU (BLEU and chrF, with signatures).

    Example:

      attn eval --bleu

      attn eval --run runs/en-zh --src test.en --ref test.zh
    """
    try:
        commands.evaluate(bleu, run, checkpoint, src, ref, device, _stderr)
    except UserError as error:
        _fail(error)


@app.command()
def average(
    run: Optional[Path] = RunOption,
    last: int = typer.Option(5, "--last", min=1, help="How many of the newest step checkpoints to average."),
    output: Optional[Path] = typer.Option(None, "--output", "-o",
                                          help="Where to write it (default: RUN/checkpoints/average-lastN.pt)."),
) -> None:
    """Average the weights of a run's newest step checkpoints into one checkpoint.

    The run must keep step checkpoints: train with train.keep_last set to at least --last.

    Example:

      attn average --run runs/en-zh --last 5

      attn average --run runs/en-zh --last 5 --output avg.pt && attn eval --checkpoint avg.pt
    """
    try:
        commands.average(run, last, output, _stderr)
    except UserError as error:
        _fail(error)


def main() -> None:
    app()


if __name__ == "__main__":
    main()
