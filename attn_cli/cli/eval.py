"""`attn eval`: translate a test set and score it with sacreBLEU."""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import List, Optional

import typer

import attn_cli.cli.decoding_flags as flags
from attn_cli.cli.common import DeviceOption, tell
from attn_cli.errors import UserError
from attn_cli.files import write_whole
from attn_cli.paths import RunPaths, hypotheses_file


@flags.decoding_flags(
    "beam_size",
    "length_penalty",
    "no_repeat_ngram",
    "no_stutter",
    "no_loops",
    "learned_lengths",
    "split_clauses",
    "max_tokens",
)
def evaluate(
    bleu: bool = typer.Option(True, "--bleu/--no-bleu", help="Report sacreBLEU BLEU and chrF."),
    by_length: bool = typer.Option(
        False,
        "--by-length",
        help="Also a table by source length (words: <= 8, 9-15, "
        "> 15): BLEU, chrF, length ratio, stutter rate against the references', U+FFFD count.",
    ),
    run: Optional[List[Path]] = flags.RunsOption,
    checkpoint: Optional[List[Path]] = flags.CheckpointsOption,
    model: Optional[Path] = flags.ModelOption,
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
    threads: Optional[int] = flags.ThreadsOption,
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
    # the decoding modules and sacrebleu: imported when run, not for --help
    from attn_cli.decoding.io import read_parallel
    from attn_cli.decoding.records import Source
    from attn_cli.decoding.scoring import score_translations
    from attn_cli.engines.load import load_engine

    if (src is None) != (ref is None):
        raise UserError("--src and --ref go together: give both, or neither to score the run's test split")
    terms = []
    if glossary is not None:  # read before decoding: a bad line is reported at once
        from attn_cli.decoding.glossary import read_glossary

        terms = read_glossary(glossary)  # comments alone: no term to enforce, nor to count
    engine = load_engine(run or [], checkpoint or [], model, device, threads)
    cfg = engine.config
    # Only the best translation is scored: a config's decode.n_best must not clash with --beam.
    options = flags.decode_options(dataclasses.replace(cfg.decode, n_best=1), decode_flags)
    flags.check_refusals(engine, options, [Source("", terms=tuple(terms))])
    if src is None:
        # An exported model's test split is in the run its config names, unless --run names another;
        # an ensemble's is its first member's.
        paths = (
            RunPaths.of(run[0])
            if run
            else RunPaths.of(cfg.run_dir)
            if model is not None
            else RunPaths.of_checkpoint(engine.paths[0])
        )
        src = paths.split_file("test", cfg.data.src_lang)
        ref = paths.split_file("test", cfg.data.tgt_lang)
        if not src.is_file():
            raise UserError(f"no test split at {src}; it is written by `attn train`, or pass --src FILE --ref FILE")
    sources, references = read_parallel(src, ref)
    hypotheses, unaided = _translate(engine, [Source(text, terms=tuple(terms)) for text in sources], options)
    hypotheses_path = hypotheses_file(engine.paths, src)  # next to the model(s) that made them
    write_whole(hypotheses_path, "".join(h + "\n" for h in hypotheses))
    tell(f"{len(sources):,} sentences from {src}; hypotheses written to {hypotheses_path}")
    if bleu:
        for score in score_translations(hypotheses, references, cfg.data.tgt_lang):
            print(score)
    if glossary is not None:
        from attn_cli.decoding.glossary import term_accuracy

        print(term_accuracy(sources, hypotheses, terms, cfg.data.src_lang, cfg.data.tgt_lang))
        if terms:  # the search without the glossary came first: its outputs, scored alike
            print("without the glossary:")
            if bleu:
                for score in score_translations(unaided, references, cfg.data.tgt_lang):
                    print(f"  {score}")
            print(f"  {term_accuracy(sources, unaided, terms, cfg.data.src_lang, cfg.data.tgt_lang)}")
    if by_length:
        from attn_cli.decoding.by_length import format_table, scores_by_length

        print(format_table(scores_by_length(sources, hypotheses, references, cfg.data.tgt_lang)))


def _translate(engine, sources, options) -> tuple[list[str], list[str]]:
    """The best translation of each source, and what the search without the glossary gave (the
    first of the glossary's two searches; the same translations when no term applies)."""
    from attn_cli.decoding.parts import split_sources
    from attn_cli.decoding.pipeline import assemble, decode

    prepared = split_sources(engine, sources, options)
    with flags.progress_bar() as on_batch:
        decoded = decode(engine, prepared, options, on_batch)
    with_terms = assemble(engine, prepared, decoded.outputs, options)
    without = assemble(engine, prepared, decoded.first, options) if any(s.terms for s in sources) else with_terms
    return [t.text for t in with_terms], [t.text for t in without]
