"""`attn export`: a trained model as a CTranslate2 model directory, for fast serving."""

from __future__ import annotations

from pathlib import Path
from typing import Optional

import typer

from attn_cli.cli.common import CheckpointOption, RunOption, tell


def export(
    run: Optional[Path] = RunOption,
    checkpoint: Optional[Path] = CheckpointOption,
    output: Path = typer.Option(..., "--output", "-o", help="The directory to write (new, or empty)."),
    quantization: str = typer.Option(
        "int8",
        "--quantization",
        "-q",
        help="Weight type: int8, int8_float32, int8_float16, int8_bfloat16, int16, float32, float16 or bfloat16.",
    ),
) -> None:
    """Export a trained model to CTranslate2, which decodes it several times faster (int8 on CPUs).

    The directory holds the model, its SentencePiece models and its config: it translates on its
    own, with `attn translate --model DIR` and `attn eval --model DIR`. Needs the ct2 extra:
    pip install "attn-cli[ct2]".

    Example:

      attn export --run runs/en-zh --output exported/en-zh-int8

      attn export --checkpoint avg.pt --output exported/en-zh-f32 --quantization float32

      attn translate --model exported/en-zh-int8 "I love machine learning"
    """
    # torch and ctranslate2: imported when run, not for --help
    from attn_cli.checkpoint import find_checkpoint, load_checkpoint
    from attn_cli.export.convert import export as export_model
    from attn_cli.export.convert import import_ctranslate2

    import_ctranslate2()  # before any work: without it, say how to install it
    path = find_checkpoint(run, checkpoint)
    loaded = load_checkpoint(path)
    export_model(loaded.config, loaded.tokenizers, loaded.model, output, quantization)
    tell(f"exported {path} ({quantization}) to {output}; translate with `attn translate --model {output}`")
