"""`attn backtranslate`: a file of target-language sentences translated by a reverse model into a
corpus for data.corpora, resumably."""

from __future__ import annotations

from pathlib import Path
from typing import List, Optional

import typer

from attn_cli.cli.common import DeviceOption, tell
from attn_cli.cli.decoding_flags import (
    LENGTH_FLAGS,
    SAMPLING_FLAGS,
    SEARCH_FLAGS,
    CheckpointsOption,
    ModelOption,
    RunsOption,
    ThreadsOption,
    check_refusals,
    decode_options,
    decoding_flags,
    progress_bar,
)


@decoding_flags(*SEARCH_FLAGS, *LENGTH_FLAGS, *SAMPLING_FLAGS, "max_tokens")
def backtranslate(
    input_file: Path = typer.Option(
        ..., "--input", "-i", help="Monolingual text in the language the model translates from, one sentence per line."
    ),
    output_file: Path = typer.Option(
        ...,
        "--output",
        "-o",
        help="The corpus to write: translation<TAB>original per line, for data.corpora "
        "(its progress is kept beside it, in OUTPUT.progress.json).",
    ),
    run: Optional[List[Path]] = RunsOption,
    checkpoint: Optional[List[Path]] = CheckpointsOption,
    model: Optional[Path] = ModelOption,
    target: Optional[str] = typer.Option(
        None, "--target", "-t", help="For a model of several directions: the language to translate into."
    ),
    device: str = DeviceOption,
    threads: Optional[int] = ThreadsOption,
    chunk_lines: int = typer.Option(
        1000, "--chunk-lines", min=1, help="Input lines translated, written and recorded at a time."
    ),
    **decode_flags: object,
) -> None:
    """Translate a monolingual file with a reverse model (zh→en to make en→zh data) into a corpus
    file; stopped anywhere (Ctrl-C, kill -9), the same command continues where it stopped.

    Train on it beside the real corpus, tagged, so that the model can tell synthetic sources apart:

      data: {corpus: null, corpora: [{path: real.tsv}, {path: bt.tsv, tag: "<bt>", split: false}]}

    Example:

      attn backtranslate --run runs/zh-en --input mono.zh --output bt.tsv

      attn backtranslate --run runs/zh-en --input mono.zh --output bt.tsv --sample --top-k 10

      attn backtranslate --model exported/zh-en-int8 --input mono.zh --output bt.tsv --beam 4

      attn backtranslate --run runs/en-zh-both --target en --input mono.zh --output bt.tsv
    """
    # the decoding modules: imported when run, not for --help
    from attn_cli.decoding.records import Source
    from attn_cli.decoding.synthetic import Synthesis, progress_path, translate_file
    from attn_cli.engines.load import load_engine

    engine = load_engine(run or [], checkpoint or [], model, device, threads)
    options = decode_options(engine.config.decode, decode_flags)
    check_refusals(engine, options, [Source("", target=target)])
    synthesis = Synthesis(target=target)
    with progress_bar("back-translating") as on_progress:
        progress = translate_file(engine, options, input_file, output_file, on_progress, chunk_lines, synthesis)
    empty = f"; {progress.empty:,} came out empty and were left out" if progress.empty else ""
    tell(
        f"{output_file}: {progress.lines:,} lines of {input_file} translated{empty} "
        f"({progress_path(output_file).name} records it)"
    )
