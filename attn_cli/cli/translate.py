"""`attn translate`: sentences from arguments, a file or stdin, translated to stdout or a file."""

from __future__ import annotations

import os
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from enum import Enum
from pathlib import Path
from typing import TYPE_CHECKING, List, Optional

import typer

from attn_cli.cli.common import DeviceOption, stderr, tell
from attn_cli.cli.decoding_flags import (
    CheckpointsOption,
    ModelOption,
    RunsOption,
    ThreadsOption,
    check_refusals,
    decode_options,
    decoding_flags,
    progress_bar,
)
from attn_cli.errors import UserError

if TYPE_CHECKING:
    from attn_cli.config import DecodeConfig
    from attn_cli.decoding.engine import Engine
    from attn_cli.decoding.io import Reading, TranslationWriter
    from attn_cli.decoding.records import Translation


class OutputFormat(str, Enum):
    text = "text"
    jsonl = "jsonl"


class InputFormat(str, Enum):
    text = "text"
    jsonl = "jsonl"


@dataclass
class Inspection:
    """What `--show-attention` draws and `--attention-out` saves."""

    show: bool = False
    layer: int = -1
    head: Optional[int] = None
    output: Optional[Path] = None

    @property
    def wanted(self) -> bool:
        return self.show or self.output is not None


@decoding_flags(
    "beam_size",
    "n_best",
    "length_penalty",
    "no_repeat_ngram",
    "no_stutter",
    "no_loops",
    "learned_lengths",
    "split_clauses",
    "max_len_a",
    "max_len_b",
    "sample",
    "temperature",
    "top_k",
    "top_p",
    "seed",
    "max_tokens",
)
def translate(
    text: Optional[List[str]] = typer.Argument(None, help="Sentences to translate; none reads stdin, one per line."),
    run: Optional[List[Path]] = RunsOption,
    checkpoint: Optional[List[Path]] = CheckpointsOption,
    model: Optional[Path] = ModelOption,
    input_file: Optional[Path] = typer.Option(
        None,
        "--input",
        "-i",
        help="Translate this file, one sentence (or, with --input-format jsonl, one JSON object) per line.",
    ),
    input_format: InputFormat = typer.Option(
        InputFormat.text,
        "--input-format",
        help="text: one sentence per line; "
        'jsonl: one {"source": ..., "prefix": ..., "glossary": [["term", "target"], ...]} per line, '
        '"prefix" and "glossary" optional, e.g. --input-format jsonl --input todo.jsonl.',
    ),
    target: Optional[str] = typer.Option(
        None,
        "--target",
        "-t",
        help="The language to translate into, for a model of several directions (a JSONL line's own "
        '"target" wins), e.g. --target zh.',
    ),
    prefix: Optional[str] = typer.Option(
        None,
        "--prefix",
        help="Begin every translation with this target text and "
        'search on from there (a JSONL line\'s own "prefix" wins), e.g. --prefix "我".',
    ),
    glossary: Optional[Path] = typer.Option(
        None,
        "--glossary",
        "-g",
        help="Terms every translation must use where their source side occurs: TSV, source term<TAB>target "
        "term[<TAB>another target...]; needs --beam 2 or more. E.g. --glossary terms.tsv.",
    ),
    output_file: Optional[Path] = typer.Option(
        None, "--output", "-o", help="Write translations here instead of stdout."
    ),
    output_format: OutputFormat = typer.Option(
        OutputFormat.text,
        "--format",
        "-f",
        help="text: one line per input (with --n-best: input<TAB>score<TAB>text); "
        "jsonl: source, translations, scores and tokens.",
    ),
    device: str = DeviceOption,
    threads: Optional[int] = ThreadsOption,
    show_attention: bool = typer.Option(
        False,
        "--show-attention",
        help="Draw the cross-attention between source and output tokens in the terminal (on stderr).",
    ),
    attention_layer: int = typer.Option(-1, "--attention-layer", help="Decoder layer to draw (-1 = the last)."),
    attention_head: Optional[int] = typer.Option(
        None, "--attention-head", help="Head to draw (default: mean of heads)."
    ),
    attention_out: Optional[Path] = typer.Option(
        None,
        "--attention-out",
        help="Save every layer and head of all three attentions: JSON, or a heatmap if the name ends in .png.",
    ),
    **decode_flags: object,
) -> None:
    """Translate sentences with a trained model: beam search (or greedy, or sampling) with a KV cache.

    Example:

      attn translate "I love machine learning"

      attn translate --beam 5 --n-best 3 --format jsonl "Where is the station?"

      echo "Where is the station?" | attn translate --run runs/en-zh

      attn translate --input news.en --output news.zh --batch-size 4000

      attn translate --sample --temperature 0.8 --top-p 0.9 --n-best 4 "It is raining."

      attn translate --show-attention --attention-out attention.png "The cat sleeps."

      attn translate --model exported/en-zh-int8 --input news.en --output news.zh

      attn translate --prefix "我" "I love machine learning"

      attn translate --glossary terms.tsv "I love machine learning"

      attn translate --input-format jsonl --input todo.jsonl --format jsonl

      attn translate --checkpoint a.pt --checkpoint b.pt "Where is the station?"

      attn translate --run runs/en-zh-both --target en "我喜欢茶。"
    """
    # the decoding modules: imported when run, not for --help
    from attn_cli.decoding.glossary import read_glossary
    from attn_cli.decoding.io import Reading, TranslationWriter, output_stream, read_lines, valid_text
    from attn_cli.decoding.records import Source
    from attn_cli.engines.load import load_engine

    texts = valid_text(text or [], "argument", tell)
    if texts and input_file:
        raise UserError("give sentences as arguments or with --input FILE, not both")
    if not texts and not input_file and sys.stdin.isatty():
        raise UserError(
            'nothing to translate: give sentences as arguments (attn translate "Hello"), '
            "--input FILE, or pipe lines to stdin"
        )
    lines = read_lines(input_file) if input_file else None
    prefix = valid_text([prefix], "--prefix", tell)[0] if prefix else ""
    terms = read_glossary(glossary) if glossary is not None else []  # before loading: a bad line fails at once
    inspection = Inspection(show_attention, attention_layer, attention_head, attention_out)
    reading = Reading(input_format.value, prefix, tuple(terms), inspection.wanted, target)
    engine = load_engine(run or [], checkpoint or [], model, device, threads)
    options = decode_options(engine.config.decode, decode_flags)
    # At once, before any input is read: what the flags ask of every source (a JSONL line may
    # give its own target).
    every = Source("", reading.prefix, reading.glossary, reading.attention, reading.target)
    check_refusals(engine, options, [every], target_required=input_format.value == "text")
    where = input_file or ("stdin" if not texts else "argument")  # warnings name the input line by line
    job = _Job(engine, options, reading, inspection)
    try:
        with output_stream(output_file) as out:
            job.run(texts, lines, TranslationWriter(out, output_format.value, tell, where))
    except BrokenPipeError:  # the reader went away (`attn translate ... | head -1`): not an error
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())  # keep the exit-time flush quiet
    except OSError as error:
        if output_file is not None or error.filename is not None:
            raise
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())  # what is left unwritten goes nowhere
        raise UserError(f"cannot write the translations to stdout: {error.strerror or error}") from None


@dataclass
class _Job:
    """One `attn translate`: the engine, its options, how lines become sources, and what is drawn."""

    engine: Engine
    options: DecodeConfig
    reading: Reading
    inspection: Inspection

    def run(self, texts: Sequence[str], lines: Optional[Sequence[str]], writer: TranslationWriter) -> None:
        """Translate the arguments, a file's lines (with a progress bar) or stdin, and write the results."""
        from attn_cli.decoding.io import stdin_batches, tolerant_stdin, valid_text

        if texts:
            self.write(self.translate(self.reading.sources(texts, "argument")), writer, numbered=len(texts) > 1)
        elif lines is not None:
            sources = self.reading.sources(lines, writer.where)
            with progress_bar() as on_batch:
                translations = self.translate(sources, on_batch)
            self.write(translations, writer, numbered=len(translations) > 1)
        else:  # stdin: each batch of lines is written as soon as it is translated, so attn works in a pipe
            for batch in stdin_batches(tolerant_stdin(sys.stdin)):
                first = writer.count + 1
                batch = valid_text(batch, "stdin", tell, first_number=first)
                self.write(self.translate(self.reading.sources(batch, "stdin", first)), writer, numbered=True)

    def translate(self, sources: Sequence, on_batch=None) -> list[Translation]:
        from attn_cli.decoding.pipeline import translate

        check_refusals(self.engine, self.options, sources, warn=False)  # a JSONL line's own prefix or glossary
        return translate(self.engine, sources, self.options, on_batch)

    def write(self, translations: Sequence[Translation], writer: TranslationWriter, numbered: bool) -> None:
        """Write the translations, then draw and/or save their attention, the files named by input
        line when `numbered`."""
        first = writer.count
        writer.write(translations)
        if not self.inspection.wanted:
            return
        from attn_cli.decoding.attention_view import numbered_path, render_alignment, save_attention

        for number, translation in enumerate(translations, start=first):
            if translation.attention is None:  # an empty input
                continue
            if self.inspection.show:
                stderr.print(render_alignment(*translation.attention, self.inspection.layer, self.inspection.head))
            if self.inspection.output is not None:
                path = numbered_path(self.inspection.output, number) if numbered else self.inspection.output
                save_attention(path, *translation.attention)
                tell(f"attention weights written to {path}")
