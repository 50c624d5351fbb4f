"""`attn import hf`: a Hugging Face Marian model (the OPUS-MT family) as an attn run directory."""

from __future__ import annotations

from pathlib import Path
from typing import Optional

import typer

from attn_cli.cli.common import tell


def import_hf(
    model: str = typer.Argument(
        ..., help="A directory as save_pretrained or a Hub download leaves it, or a Hub id (fetched when online)."
    ),
    output: Path = typer.Option(..., "--output", "-o", help="The run directory to write (new, or empty)."),
    source_prefix: Optional[str] = typer.Option(
        None,
        "--source-prefix",
        help="The target-language token a multi-target model needs before each source, e.g. '>>cmn_Hans<<' "
        "(tokenizer.source_prefix).",
    ),
    src_lang: Optional[str] = typer.Option(None, "--src-lang", help="Source language code (default: from the model)."),
    tgt_lang: Optional[str] = typer.Option(None, "--tgt-lang", help="Target language code (default: from the model)."),
) -> None:
    """Import a Transformers Marian model (MarianMTModel, e.g. an OPUS-MT model) as an attn run.

    The run translates, evaluates, exports and serves with --run like a trained one, and
    train.init_from fine-tunes it on your corpus. Weights are read without running code from the
    files (safetensors, or torch.load with weights_only). Needs the hf extra: pip install "attn-cli\\[hf]".

    Example:

      attn import hf Helsinki-NLP/opus-mt-en-zh --source-prefix '>>cmn_Hans<<' --output runs/opus-en-zh

      attn translate --run runs/opus-en-zh "I love machine learning"

      attn train --config runs/opus-en-zh/config.yaml --set train.init_from=runs/opus-en-zh \\
          --set run_dir=runs/opus-mine --set data.corpus.path=mine.tsv
    """
    from attn_cli.huggingface.importing import import_marian  # torch: imported when run, not for --help

    config = import_marian(model, output, source_prefix, src_lang, tgt_lang, log=tell)
    tell(f'translate with `attn translate --run {config.run_dir} "..."`')
