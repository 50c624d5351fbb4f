"""`attn export`: a trained model as a CTranslate2 model directory, for fast serving, or as an
Argos Translate package, for Argos Translate and LibreTranslate."""

from __future__ import annotations

import dataclasses
from enum import Enum
from pathlib import Path
from typing import Optional

import typer

from attn_cli.cli.common import CheckpointOption, RunOption, tell
from attn_cli.errors import UserError


class ExportFormat(str, Enum):
    ctranslate2 = "ctranslate2"
    argos = "argos"
    hf = "hf"


def export(
    run: Optional[Path] = RunOption,
    checkpoint: Optional[Path] = CheckpointOption,
    output: Path = typer.Option(
        ...,
        "--output",
        "-o",
        help="The directory to write (new, or empty); with --format argos, the package file (new, FILE.argosmodel).",
    ),
    quantization: str = typer.Option(
        "int8",
        "--quantization",
        "-q",
        help="Weight type: int8, int8_float32, int8_float16, int8_bfloat16, int16, float32, float16 or bfloat16.",
    ),
    export_format: ExportFormat = typer.Option(
        ExportFormat.ctranslate2,
        "--format",
        "-f",
        help="ctranslate2: a model directory for attn translate/eval --model; "
        "argos: an .argosmodel package that Argos Translate installs and LibreTranslate serves; "
        "hf: a Transformers Marian directory with a model card, for the Hugging Face Hub.",
    ),
) -> None:
    """Export a trained model to CTranslate2, which decodes it several times faster (int8 on CPUs), or to Argos.

    The directory holds the model, its SentencePiece models and its config: it translates on its
    own, with `attn translate --model DIR` and `attn eval --model DIR`. With --format argos the
    file is an Argos Translate package of the same model (its SentencePiece model, which must be
    joint, and a sentence splitter), to install with Python's
    argostranslate.package.install_from_path(FILE). Needs the ct2 extra:
    pip install "attn-cli\\[ct2]".

    Example:

      attn export --run runs/en-zh --output exported/en-zh-int8

      attn export --checkpoint avg.pt --output exported/en-zh-f32 --quantization float32

      attn translate --model exported/en-zh-int8 "I love machine learning"

      attn export --run runs/en-zh --format argos --output exported/en_zh.argosmodel

      attn export --run runs/en-zh --format hf --output exported/en-zh-hf

    With --format hf the directory loads with MarianMTModel.from_pretrained and
    transformers.pipeline("translation", DIR), and its README.md is a model card with the BLEU and
    chrF measured on the run's test split (needs the hf extra: pip install "attn-cli\\[hf]"). Only
    post-LN models with model.sinusoid_layout: halves and one vocabulary export: Marian has no other.
    """
    # torch and ctranslate2: imported when run, not for --help
    from attn_cli.checkpoint import find_checkpoint, load_checkpoint
    from attn_cli.engines.ctranslate2 import import_ctranslate2
    from attn_cli.export.convert import export as export_model

    if export_format is ExportFormat.hf:
        _export_hf(find_checkpoint(run, checkpoint), output)
        return
    import_ctranslate2()  # before any work: without it, say how to install it
    path = find_checkpoint(run, checkpoint)
    loaded = load_checkpoint(path)
    if export_format is ExportFormat.argos:
        from attn_cli.export.argos import export_argos

        export_argos(loaded.config, loaded.tokenizers, loaded.model, output, quantization)
        tell(
            f"exported {path} ({quantization}) to {output}, an Argos Translate package; install it with "
            f"argostranslate.package.install_from_path({str(output)!r})"
        )
        return
    export_model(loaded.config, loaded.tokenizers, loaded.model, output, quantization, loaded.lengths)
    tell(f"exported {path} ({quantization}) to {output}; translate with `attn translate --model {output}`")


def _export_hf(path: Path, output: Path) -> None:
    """The Transformers export, its card scored on the run's test split when the run has one."""
    from attn_cli.checkpoint import load_checkpoint
    from attn_cli.files import require_new_directory
    from attn_cli.huggingface.exporting import export_marian
    from attn_cli.huggingface.marian import refusal
    from attn_cli.paths import RunPaths

    loaded = load_checkpoint(path)
    why = refusal(loaded.config.model, loaded.tokenizers.joint)
    if why is not None:  # before any decoding
        raise UserError(why)
    require_new_directory(output)
    cfg = loaded.config
    paths = RunPaths.of_checkpoint(path)
    direction = cfg.data.directions[0]  # a model of several directions: the card scores its first
    source, reference = paths.held_out_files("test", direction, len(cfg.data.directions) > 1)
    scores = []
    if source.is_file() and reference.is_file():
        from attn_cli.decoding.io import read_parallel
        from attn_cli.decoding.pipeline import translate
        from attn_cli.decoding.records import Source
        from attn_cli.decoding.scoring import score_translations
        from attn_cli.engines.pytorch import TorchEngine

        sources, references = read_parallel(source, reference)
        tell(f"scoring {len(sources):,} test sentences for the model card ({source})")
        options = dataclasses.replace(cfg.decode, n_best=1)
        engine = TorchEngine([loaded.model], loaded.tokenizers, [cfg], [path])
        target = direction.target if loaded.tokenizers.multi_target else None
        hypotheses = [t.text for t in translate(engine, [Source(text, target=target) for text in sources], options)]
        scores = score_translations(hypotheses, references, direction.target)
    export_marian(loaded, output, scores, source if scores else None)
    tell(
        f"exported {path} to {output} for Transformers (MarianMTModel, with a model card); upload it with "
        f"`huggingface-cli upload USER/NAME {output}`"
    )
