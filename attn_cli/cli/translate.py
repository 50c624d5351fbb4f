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
from attn_cli.cli.translator import (
    CheckpointsOption,
    ModelOption,
    RunsOption,
    ThreadsOption,
    Translator,
    decode_options,
    decoding_flags,
)
from attn_cli.errors import UserError
from attn_cli.translator import load_for_decoding

if TYPE_CHECKING:
    from attn_cli.decoding.glossary import Term
    from attn_cli.decoding.io import TranslationWriter
    from attn_cli.decoding.translate import Translation


class OutputFormat(str, Enum):
    text = "text"
    jsonl = "jsonl"


class InputFormat(str, Enum):
    text = "text"
    jsonl = "jsonl"


@dataclass
class Reading:
    """How input lines become sources, prefixes and glossaries: --input-format, --prefix, --glossary."""

    format: str = "text"
    prefix: str = ""
    glossary: Sequence[Term] = ()


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
    """
    # torch: imported when run, not for --help
    from attn_cli.decoding.glossary import read_glossary
    from attn_cli.decoding.io import TranslationWriter, output_stream, read_lines, valid_text
    from attn_cli.decoding.translate import require_beam_for_terms

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
    loaded = load_for_decoding(run or [], checkpoint or [], model, device, threads)
    translator = Translator(loaded, decode_options(loaded.config.decode, decode_flags))
    if terms and not translator.exported:  # at once, before any input is read (--model refuses a glossary itself)
        require_beam_for_terms(translator.options)
    inspection = Inspection(show_attention, attention_layer, attention_head, attention_out)
    if inspection.wanted and translator.exported:
        raise UserError(
            "--show-attention and --attention-out need a checkpoint: CTranslate2 does not give "
            "attn every layer's attention; use --run or --checkpoint"
        )
    if inspection.wanted and loaded.is_ensemble:
        raise UserError(
            f"--show-attention and --attention-out show one model's attention, not an ensemble's of "
            f"{len(loaded.paths)}; give one --run or --checkpoint"
        )
    where = input_file or ("stdin" if not texts else "argument")  # warnings name the input line by line
    try:
        with output_stream(output_file) as out:
            _translate_and_write(
                translator,
                texts,
                lines,
                TranslationWriter(out, output_format.value, tell, where),
                inspection,
                Reading(input_format.value, prefix, terms),
            )
    except BrokenPipeError:  # the reader went away (`attn translate ... | head -1`): not an error
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())  # keep the exit-time flush quiet
    except OSError as error:
        if output_file is not None or error.filename is not None:
            raise
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())  # what is left unwritten goes nowhere
        raise UserError(f"cannot write the translations to stdout: {error.strerror or error}") from None


def _translate_and_write(
    translator: Translator,
    texts: Sequence[str],
    lines: Optional[Sequence[str]],
    writer: TranslationWriter,
    inspection: Inspection,
    reading: Reading,
) -> None:
    """Translate the arguments, a file's lines (with a progress bar) or stdin, and write the results."""
    from attn_cli.decoding.io import parse_inputs, stdin_batches, tolerant_stdin, valid_text

    if texts:
        translations = translator(
            *parse_inputs(texts, reading.format, "argument", prefix=reading.prefix, glossary=reading.glossary)
        )
    elif lines is not None:
        translations = translator.translate_with_progress(
            *parse_inputs(lines, reading.format, writer.where, prefix=reading.prefix, glossary=reading.glossary)
        )
    else:  # stdin: each batch of lines is written as soon as it is translated, so attn works in a pipe
        for batch in stdin_batches(tolerant_stdin(sys.stdin)):
            first = writer.count + 1
            batch = valid_text(batch, "stdin", tell, first_number=first)
            translations = translator(
                *parse_inputs(batch, reading.format, "stdin", first, reading.prefix, reading.glossary)
            )
            writer.write(translations)
            if inspection.wanted:
                _inspect(translator, translations, inspection, first=writer.count - len(batch), numbered=True)
        return
    writer.write(translations)
    if inspection.wanted:
        _inspect(translator, translations, inspection, first=0, numbered=len(translations) > 1)


def _inspect(
    translator: Translator, translations: Sequence[Translation], inspection: Inspection, first: int, numbered: bool
) -> None:
    """Draw and/or save the attention of each translation, the files named by input line when numbered."""
    from attn_cli.decoding.attention_view import numbered_path, render_alignment, save_attention, translation_attention

    for number, translation in enumerate(translations, start=first):
        found = translation_attention(translator.loaded.model, translator.loaded.tokenizers, translation)
        if found is None:
            continue
        if inspection.show:
            stderr.print(render_alignment(*found, inspection.layer, inspection.head))
        if inspection.output is not None:
            path = numbered_path(inspection.output, number) if numbered else inspection.output
            save_attention(path, *found)
            tell(f"attention weights written to {path}")
