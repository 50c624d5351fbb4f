"""`attn eval`: translate a test set and score it with sacreBLEU."""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import List, Optional

import typer

from attn_cli.cli import translator as decoding
from attn_cli.cli.common import DeviceOption, tell
from attn_cli.errors import UserError
from attn_cli.files import write_whole
from attn_cli.paths import RunPaths, hypotheses_file
from attn_cli.translator import load_for_decoding


@decoding.decoding_flags("beam_size", "length_penalty", "no_repeat_ngram", "no_stutter", "max_tokens")
def evaluate(
    bleu: bool = typer.Option(True, "--bleu/--no-bleu", help="Report sacreBLEU BLEU and chrF."),
    by_length: bool = typer.Option(
        False,
        "--by-length",
        help="Also a table by source length (words: <= 8, 9-15, "
        "> 15): BLEU, chrF, length ratio, stutter rate against the references', U+FFFD count.",
    ),
    run: Optional[List[Path]] = decoding.RunsOption,
    checkpoint: Optional[List[Path]] = decoding.CheckpointsOption,
    model: Optional[Path] = decoding.ModelOption,
    src: Optional[Path] = typer.Option(None, "--src", help="Source sentences (default: the run's test split)."),
    ref: Optional[Path] = typer.Option(None, "--ref", help="Reference translations, line by line with --src."),
    glossary: Optional[Path] = typer.Option(
        None,
        "--glossary",
        help="A glossary (TSV: source term, target term[, more targets]): translate with its terms, and "
        "report BLEU, chrF and term accuracy (the share of the terms that apply to a sentence whose "
        "target the translation holds) with the glossary and without it.",
    ),
    device: str = DeviceOption,
    threads: Optional[int] = decoding.ThreadsOption,
    **decode_flags: object,
) -> None:
    """Translate a test set and score it with sacreBLEU (BLEU and chrF, with signatures).

    Decodes as the checkpoint's config says (decode.beam_size ...), like validation in training.

    Example:

      attn eval --bleu

      attn eval --run runs/en-zh --src test.en --ref test.zh --beam 1

      attn eval --model exported/en-zh-int8

      attn eval --by-length --src long.en --ref long.zh

      attn eval --glossary terms.tsv

      attn eval --checkpoint runs/en-zh/checkpoints/best.pt --checkpoint runs/en-zh-b/checkpoints/best.pt
    """
    # torch and sacrebleu: imported when run, not for --help
    from attn_cli.decoding.io import read_parallel
    from attn_cli.decoding.scoring import score_translations

    if (src is None) != (ref is None):
        raise UserError("--src and --ref go together: give both, or neither to score the run's test split")
    loaded = load_for_decoding(run or [], checkpoint or [], model, device, threads)
    # Only the best translation is scored: a config's decode.n_best must not clash with --beam.
    translator = decoding.Translator(
        loaded, decoding.decode_options(dataclasses.replace(loaded.config.decode, n_best=1), decode_flags)
    )
    cfg = loaded.config
    terms = None
    if glossary is not None:  # read before decoding: a bad line is reported at once
        from attn_cli.decoding.glossary import read_glossary
        from attn_cli.decoding.translate import require_beam_for_terms

        terms = read_glossary(glossary)  # comments alone: no term to enforce, nor to count
        if terms and translator.exported:
            tell(
                "warning: --model decodes with CTranslate2, which has no constrained search: the glossary "
                "is not applied, and term accuracy is that of the outputs as they are"
            )
        elif terms:
            require_beam_for_terms(translator.options)
    if src is None:
        # An exported model's test split is in the run its config names, unless --run names another;
        # an ensemble's is its first member's.
        paths = (
            RunPaths.of(run[0])
            if run
            else RunPaths.of(cfg.run_dir)
            if model is not None
            else RunPaths.of_checkpoint(loaded.paths[0])
        )
        src = paths.split_file("test", cfg.data.src_lang)
        ref = paths.split_file("test", cfg.data.tgt_lang)
        if not src.is_file():
            raise UserError(f"no test split at {src}; it is written by `attn train`, or pass --src FILE --ref FILE")
    sources, references = read_parallel(src, ref)
    constrained = bool(terms) and not translator.exported
    translations = translator.translate_with_progress(
        sources, glossaries=[terms] * len(sources) if constrained else None
    )
    hypotheses = [translation.texts[0] for translation in translations]
    hypotheses_path = hypotheses_file(loaded.paths, src)  # next to the model(s) that made them
    write_whole(hypotheses_path, "".join(h + "\n" for h in hypotheses))
    tell(f"{len(sources):,} sentences from {src}; hypotheses written to {hypotheses_path}")
    if bleu:
        for score in score_translations(hypotheses, references, cfg.data.tgt_lang):
            print(score)
    if terms is not None:
        from attn_cli.decoding.glossary import term_accuracy

        print(term_accuracy(sources, hypotheses, terms, cfg.data.src_lang, cfg.data.tgt_lang))
        if constrained:  # the search without the glossary came first: its outputs, scored alike
            unaided = [translation.unconstrained for translation in translations]
            print("without the glossary:")
            if bleu:
                for score in score_translations(unaided, references, cfg.data.tgt_lang):
                    print(f"  {score}")
            print(f"  {term_accuracy(sources, unaided, terms, cfg.data.src_lang, cfg.data.tgt_lang)}")
    if by_length:
        from attn_cli.decoding.by_length import format_table, scores_by_length

        print(format_table(scores_by_length(sources, hypotheses, references, cfg.data.tgt_lang)))
