"""The `attn` command line: parse, call, print. No logic lives here."""

from __future__ import annotations

from enum import Enum
from pathlib import Path
from typing import List, Optional

import typer
from rich.console import Console

from attn_cli.cli import commands as commands
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


class OutputFormat(str, Enum):
    text = "text"
    jsonl = "jsonl"


# Decoding flags shared by translate and eval; None leaves the checkpoint's config value.
BeamOption = typer.Option(None, "--beam", "-b", min=1, help="Beam size; 1 is greedy decoding (config: decode.beam_size).")
LengthPenaltyOption = typer.Option(None, "--length-penalty", help="GNMT length penalty alpha; 0 turns it off.")
BatchSizeOption = typer.Option(None, "--batch-size", min=1, help="Token budget of one decoding batch (source tokens).")


@app.command()
def translate(
    text: Optional[List[str]] = typer.Argument(None, help="Sentences to translate; none reads stdin, one per line."),
    run: Optional[Path] = RunOption,
    checkpoint: Optional[Path] = CheckpointOption,
    input_file: Optional[Path] = typer.Option(None, "--input", "-i", help="Translate this file, one sentence per line."),
    output_file: Optional[Path] = typer.Option(None, "--output", "-o", help="Write translations here instead of stdout."),
    output_format: OutputFormat = typer.Option(OutputFormat.text, "--format", "-f", help="text: one line per input (with --n-best: input<TAB>score<TAB>text); "
                                           "jsonl: source, translations, scores and tokens."),
    beam: Optional[int] = BeamOption,
    n_best: Optional[int] = typer.Option(None, "--n-best", "-n", min=1, help="Translations per input (at most --beam; "
                                         "with --sample, the number of samples)."),
    length_penalty: Optional[float] = LengthPenaltyOption,
    max_len_a: Optional[float] = typer.Option(None, "--max-len-a", help="Output limit a * source length + b: the a."),
    max_len_b: Optional[int] = typer.Option(None, "--max-len-b", help="Output limit a * source length + b: the b."),
    sample: Optional[bool] = typer.Option(None, "--sample/--no-sample", help="Sample each next token instead of searching."),
    temperature: Optional[float] = typer.Option(None, "--temperature", help="With --sample: <1 sharper, >1 flatter."),
    top_k: Optional[int] = typer.Option(None, "--top-k", help="With --sample: only the k most likely tokens (0 = all)."),
    top_p: Optional[float] = typer.Option(None, "--top-p", help="With --sample: the smallest set of tokens with probability >= p."),
    seed: Optional[int] = typer.Option(None, "--seed", help="With --sample: a seed for repeatable samples."),
    batch_size: Optional[int] = BatchSizeOption,
    device: str = DeviceOption,
    show_attention: bool = typer.Option(False, "--show-attention", help="Draw the cross-attention between source "
                                        "and output tokens in the terminal (on stderr)."),
    attention_layer: int = typer.Option(-1, "--attention-layer", help="Decoder layer to draw (-1 = the last)."),
    attention_head: Optional[int] = typer.Option(None, "--attention-head", help="Head to draw (default: mean of heads)."),
    attention_out: Optional[Path] = typer.Option(None, "--attention-out", help="Save every layer and head of all "
                                                 "three attentions: JSON, or a heatmap if the name ends in .png."),
) -> None:
    """Translate sentences with a trained model: beam search (or greedy, or sampling) with a KV cache.

    Example:

      attn translate "I love machine learning"

      attn translate --beam 5 --n-best 3 --format jsonl "Where is the station?"

      echo "Where is the station?" | attn translate --run runs/en-zh

      attn translate --input news.en --output news.zh --batch-size 4000

      attn translate --sample --temperature 0.8 --top-p 0.9 --n-best 4 "It is raining."

      attn translate --show-attention --attention-out attention.png "The cat sleeps."
    """
    flags = {"beam_size": beam, "n_best": n_best, "length_penalty": length_penalty, "max_len_a": max_len_a,
             "max_len_b": max_len_b, "max_tokens": batch_size, "sample": sample, "temperature": temperature,
             "top_k": top_k, "top_p": top_p, "seed": seed}
    inspection = commands.Inspection(show_attention, attention_layer, attention_head, attention_out)
    try:
        commands.translate(text or [], run, checkpoint, input_file, output_file, device, flags, output_format.value,
                           inspection, _stderr)
    except UserError as error:
        _fail(error)


@app.command(name="eval")
def evaluate(
    bleu: bool = typer.Option(True, "--bleu/--no-bleu", help="Report sacreBLEU BLEU and chrF."),
    run: Optional[Path] = RunOption,
    checkpoint: Optional[Path] = CheckpointOption,
    src: Optional[Path] = typer.Option(None, "--src", help="Source sentences (default: the run's test split)."),
    ref: Optional[Path] = typer.Option(None, "--ref", help="Reference translations, line by line with --src."),
    beam: Optional[int] = BeamOption,
    length_penalty: Optional[float] = LengthPenaltyOption,
    batch_size: Optional[int] = BatchSizeOption,
    device: str = DeviceOption,
) -> None:
    """Translate a test set and score it with sacreBLEU (BLEU and chrF, with signatures).

    Decodes as the checkpoint's config says (decode.beam_size ...), like validation in training.

    Example:

      attn eval --bleu

      attn eval --run runs/en-zh --src test.en --ref test.zh --beam 1
    """
    flags = {"beam_size": beam, "length_penalty": length_penalty, "max_tokens": batch_size}
    try:
        commands.evaluate(bleu, run, checkpoint, src, ref, device, flags, _stderr)
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
