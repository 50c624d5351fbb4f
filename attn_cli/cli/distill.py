"""`attn distill`: a teacher translates its training sources into a distilled corpus, resumably, and
a small student's config that trains on it is written beside it."""

from __future__ import annotations

from pathlib import Path
from typing import List, Optional

import typer

from attn_cli.cli.common import DeviceOption, tell
from attn_cli.cli.decoding_flags import (
    LENGTH_FLAGS,
    SEARCH_FLAGS,
    CheckpointsOption,
    ModelOption,
    RunsOption,
    ThreadsOption,
    check_refusals,
    decode_options,
    decoding_flags,
    progress_bar,
    run_of,
)
from attn_cli.errors import UserError


@decoding_flags(*SEARCH_FLAGS, *LENGTH_FLAGS, "max_tokens")
def distill(
    output_file: Path = typer.Option(
        ...,
        "--output",
        "-o",
        help="The distilled corpus to write: source<TAB>the teacher's translation per line "
        "(its progress is kept beside it, in OUTPUT.progress.json).",
    ),
    run: Optional[List[Path]] = RunsOption,
    checkpoint: Optional[List[Path]] = CheckpointsOption,
    model: Optional[Path] = ModelOption,
    input_file: Optional[Path] = typer.Option(
        None,
        "--input",
        "-i",
        help="Sources to translate, one per line (default: the teacher's training sources, its "
        "validation and test sources left out; written to OUTPUT.sources).",
    ),
    target: Optional[str] = typer.Option(
        None, "--target", "-t", help="For a teacher of several directions: the language to distill into."
    ),
    student_config: Optional[Path] = typer.Option(
        None,
        "--student-config",
        help="Also write a config for a student (the built-in student.yaml: 4 encoder layers, 2 decoder "
        "layers, greedy search) that trains on the distilled corpus and is scored on the teacher's test split.",
    ),
    student_run: Optional[Path] = typer.Option(
        None, "--student-run", help="The student config's run_dir (default: the teacher's, with -student)."
    ),
    original_weight: float = typer.Option(
        0.0,
        "--original-weight",
        min=0.0,
        max=100.0,
        help="Mix the teacher's own corpora into the student's training at this weight (0: distilled alone).",
    ),
    device: str = DeviceOption,
    threads: Optional[int] = ThreadsOption,
    chunk_lines: int = typer.Option(
        1000, "--chunk-lines", min=1, help="Sources translated, written and recorded at a time."
    ),
    **decode_flags: object,
) -> None:
    """Sequence-level distillation: a teacher (a run, an ensemble of checkpoints, or an export)
    translates its training sources with beam search, its best translation of each kept, for a
    small, fast student to learn from (simpler targets than the corpus's own). Stopped anywhere
    (Ctrl-C, kill -9), the same command continues where it stopped.

    Example:

      attn distill --run runs/en-zh --output distilled.tsv --student-config student.yaml

      attn train --config student.yaml

      attn export --run runs/en-zh-student --quantization int8

      attn distill --run runs/en-zh --run runs/en-zh-b --output distilled.tsv --beam 8

      attn distill --model exported/en-zh-int8 --output distilled.tsv --student-config student.yaml
    """
    # the decoding modules: imported when run, not for --help
    import yaml

    from attn_cli.config import builtin_configs, config_from_dict
    from attn_cli.data.progress import StageProgress
    from attn_cli.data.split import training_sources
    from attn_cli.decoding.records import Source
    from attn_cli.decoding.synthetic import Synthesis, distilled_student_config, progress_path, translate_file
    from attn_cli.engines.load import load_engine
    from attn_cli.files import write_whole

    engine = load_engine(run or [], checkpoint or [], model, device, threads)
    teacher = engine.config
    options = decode_options(teacher.decode, decode_flags)
    check_refusals(engine, options, [Source("", target=target)])
    direction = teacher.data.direction_into(target)
    several = len(teacher.data.directions) > 1
    if original_weight > 0 and several:
        raise UserError(
            "--original-weight mixes the teacher's corpora in as they are, and this teacher reads them in "
            f"{len(teacher.data.directions)} directions; add the corpus of {direction} to the student config by hand"
        )
    sources = input_file
    if sources is None:
        sources = output_file.with_name(output_file.name + ".sources")
        if not progress_path(output_file).is_file():  # a continued start keeps the sources it began with
            texts = training_sources(teacher.data, direction, StageProgress(tell).track)
            write_whole(sources, "".join(" ".join(text.split()) + "\n" for text in texts))
    synthesis = Synthesis(
        translation_is_source=False, target=direction.target if engine.tokenizers.multi_target else None
    )
    with progress_bar("distilling") as on_progress:
        progress = translate_file(engine, options, sources, output_file, on_progress, chunk_lines, synthesis)
    empty = f"; {progress.empty:,} came out empty and were left out" if progress.empty else ""
    tell(f"{output_file}: {progress.lines:,} sources of {sources} translated by the teacher{empty}")
    if student_config is None:
        return
    paths = run_of(engine, run, model)
    held_out = tuple(paths.held_out_files(split, direction, several) for split in ("valid", "test"))
    if not held_out[1][0].is_file():
        raise UserError(
            f"no test split at {held_out[1][0]}: the student is scored on the teacher's; give --run with the "
            f"teacher's run directory"
        )
    base = yaml.safe_load(builtin_configs()["student.yaml"].read_text(encoding="utf-8"))
    student_dir = student_run or Path(f"{str(teacher.run_dir).rstrip('/')}-student")
    values = distilled_student_config(base, teacher, direction, output_file, held_out, student_dir, original_weight)
    config_from_dict(values)  # checked as `attn train` will read it
    written = yaml.safe_dump(values, sort_keys=False, allow_unicode=True)
    header = f"# A student of {', '.join(str(path) for path in engine.paths)}, written by `attn distill`.\n"
    write_whole(student_config, header + written)
    tell(f"student config written to {student_config}; train it with `attn train --config {student_config}`")
