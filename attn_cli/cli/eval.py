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
from attn_cli.paths import hypotheses_file


@flags.decoding_flags(*flags.SEARCH_FLAGS, "max_tokens")
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
    target: Optional[str] = typer.Option(
        None,
        "--target",
        "-t",
        help="For a model of several directions: the language --src is translated into, or the one "
        "direction of the test split to score (default: every direction, each scored on its own).",
    ),
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

      attn eval --run runs/en-zh-both --src news.zh --ref news.en --target en

      attn eval --checkpoint runs/en-zh/checkpoints/best.pt --checkpoint runs/en-zh-b/checkpoints/best.pt
    """
    # the decoding modules and sacrebleu: imported when run, not for --help
    from attn_cli.decoding.records import Source
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
    flags.check_refusals(
        engine, options, [Source("", terms=tuple(terms), target=target)], target_required=src is not None
    )
    if src is not None:
        jobs = [(cfg.data.direction_into(target), src, ref)]
    else:
        paths = flags.run_of(engine, run, model)
        several = len(cfg.data.directions) > 1
        directions = [cfg.data.direction_into(target)] if target is not None else cfg.data.directions
        jobs = [(direction, *paths.held_out_files("test", direction, several)) for direction in directions]
        if not jobs[0][1].is_file():
            raise UserError(
                f"no test split at {jobs[0][1]}; it is written by `attn train`, or pass --src FILE --ref FILE"
            )
    scores = []
    for direction, source_file, reference_file in jobs:
        if len(jobs) > 1:
            print(f"{direction}:")
        scores.append(
            _evaluate(
                engine, options, direction, source_file, reference_file, terms, glossary is not None, bleu, by_length
            )
        )
    if len(jobs) > 1 and bleu:
        print(f"mean BLEU of the {len(jobs)} directions: {sum(scores) / len(scores):.2f}")


def _evaluate(engine, options, direction, src: Path, ref: Path, terms, glossary: bool, bleu: bool, by_length: bool):
    """Translate `src` into `direction`'s target language, write the hypotheses and print the
    scores against `ref` (each as its target language is scored); the BLEU score."""
    from attn_cli.decoding.io import read_parallel
    from attn_cli.decoding.records import Source
    from attn_cli.decoding.scoring import score_translations

    target = direction.target if engine.tokenizers.multi_target else None
    sources, references = read_parallel(src, ref)
    hypotheses, unaided = _translate(
        engine, [Source(text, terms=tuple(terms), target=target) for text in sources], options
    )
    hypotheses_path = hypotheses_file(engine.paths, src)  # next to the model(s) that made them
    write_whole(hypotheses_path, "".join(h + "\n" for h in hypotheses))
    tell(f"{len(sources):,} sentences from {src}; hypotheses written to {hypotheses_path}")
    found = score_translations(hypotheses, references, direction.target)
    if bleu:
        for score in found:
            print(score)
    if glossary:
        from attn_cli.decoding.glossary import term_accuracy

        print(term_accuracy(sources, hypotheses, terms, *direction))
        if terms:  # the search without the glossary came first: its outputs, scored alike
            print("without the glossary:")
            if bleu:
                for score in score_translations(unaided, references, direction.target):
                    print(f"  {score}")
            print(f"  {term_accuracy(sources, unaided, terms, *direction)}")
    if by_length:
        from attn_cli.decoding.by_length import format_table, scores_by_length

        print(format_table(scores_by_length(sources, hypotheses, references, direction.target)))
    return found[0].score


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
