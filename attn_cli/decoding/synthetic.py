"""A file of sentences translated into a parallel corpus, resumably: back-translation's step.

A file of millions of lines takes hours; a run stopped anywhere (Ctrl-C, kill -9, a power cut)
must continue where it stopped, and every line must end up translated once. The corpus is written
a chunk of lines at a time: the chunk's pairs are appended and flushed to disk, then a small
progress file beside the corpus records how many input lines and output bytes are done, written
whole (`files.write_whole`). A new start reads it, cuts the corpus back to the bytes it records
(a chunk written after the last record is written again) and skips the input lines done.

For back-translation each output line is `translation<TAB>original`: the input is target-language
text and the model translates into the source language, so the corpus reads in data.corpora as it
is (src_column 0, tgt_column 1), with a tag. For distillation it is `original<TAB>translation`: the
input is the training sources and a teacher translates them into the target language. Either way
the source comes first. An empty input line gives no pair, nor does a line whose translation comes
out empty (counted); tabs inside a sentence become spaces.
"""

from __future__ import annotations

import hashlib
import itertools
import json
import os
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Callable, Iterator, Optional

from attn_cli.config import Config, DecodeConfig, config_to_dict
from attn_cli.decoding.engine import Engine
from attn_cli.decoding.pipeline import translate
from attn_cli.decoding.records import Source
from attn_cli.errors import UserError
from attn_cli.files import write_whole
from attn_cli.languages import Direction

CHUNK_LINES = 1000  # input lines translated, written and recorded at a time

OnProgress = Callable[[int, int], None]  # (input lines done, input lines in all)


@dataclass(frozen=True)
class Synthesis:
    """What a translated file becomes: which side the translation is, and the language it is asked
    for (a model of several directions; None for a model of one)."""

    translation_is_source: bool = True  # back-translation; False: distillation (the original is the source)
    target: Optional[str] = None


@dataclass
class Progress:
    """How far a corpus file is written: what the progress file beside it holds."""

    input: str  # the input file, resolved
    input_bytes: int  # its size: a changed input is not continued
    settings: str  # a hash of the model and decoding settings: another model is not continued
    lines: int = 0  # input lines translated and written
    bytes: int = 0  # the corpus's size after them
    empty: int = 0  # of them, those whose translation came out empty: no pair is written for them
    done: bool = False


def progress_path(output: Path) -> Path:
    return output.with_name(output.name + ".progress.json")


def count_lines(path: Path) -> int:
    """The lines of a file (a last line without its line end counts), read in blocks."""
    count, last = 0, b"\n"
    with path.open("rb") as handle:
        while block := handle.read(1 << 20):
            count += block.count(b"\n")
            last = block[-1:]
    return count + (last != b"\n")


def _lines(path: Path, skip: int) -> Iterator[str]:
    """The lines of a UTF-8 file after the first `skip`, without their line ends; bytes that are not
    UTF-8 become U+FFFD (one bad byte must not stop hours of work)."""
    with path.open("r", encoding="utf-8", errors="replace", newline="\n") as handle:
        for line in itertools.islice(handle, skip, None):
            yield line.removesuffix("\n").removesuffix("\r")


def _settings_hash(engine: Engine, options: DecodeConfig, synthesis: Synthesis) -> str:
    models = []
    for path in engine.paths:
        files = sorted(p for p in path.rglob("*") if p.is_file()) if path.is_dir() else [path]
        models += [[str(file.resolve()), file.stat().st_size, file.stat().st_mtime_ns] for file in files]
    described = {"models": models, "options": asdict(options)}
    if synthesis != Synthesis():  # back-translation into a model's only language keeps its earlier hash
        described["synthesis"] = asdict(synthesis)
    return hashlib.sha256(json.dumps(described, sort_keys=True, default=str).encode()).hexdigest()[:16]


def _start(input_path: Path, output: Path, settings: str) -> Progress:
    """Where writing `output` begins: the progress of an earlier start of the same work, or nothing."""
    fresh = Progress(str(input_path.resolve()), input_path.stat().st_size, settings)
    recorded = progress_path(output)
    if not recorded.is_file():
        if output.exists() and output.stat().st_size:
            raise UserError(
                f"{output} exists and was not written by an earlier run of this command (no {recorded.name} "
                f"beside it); give another --output, or delete it"
            )
        return fresh
    try:
        found = Progress(**json.loads(recorded.read_text(encoding="utf-8")))
    except (ValueError, TypeError) as error:
        raise UserError(f"{recorded} is damaged ({error}); delete it and {output} to start again") from None
    if (found.input, found.input_bytes, found.settings) != (fresh.input, fresh.input_bytes, fresh.settings):
        raise UserError(
            f"{output} was begun from another input file, another model or other decoding settings "
            f"({recorded.name}); give another --output, or delete both to start again"
        )
    return found


def translate_file(
    engine: Engine,
    options: DecodeConfig,
    input_path: Path,
    output: Path,
    on_progress: Optional[OnProgress] = None,
    chunk_lines: int = CHUNK_LINES,
    synthesis: Synthesis = Synthesis(),
) -> Progress:
    """Translate `input_path` line by line into the corpus `output`, continuing an earlier start of
    the same work where it stopped; the progress reached (all lines, unless interrupted)."""
    if not input_path.is_file():
        raise UserError(f"input file not found: {input_path}")
    progress = _start(input_path, output, _settings_hash(engine, options, synthesis))
    total = count_lines(input_path)
    if progress.done:
        return progress
    output.parent.mkdir(parents=True, exist_ok=True)
    with output.open("ab") as corpus:
        corpus.truncate(progress.bytes)  # a chunk written after the last record is written again
        corpus.seek(progress.bytes)
        lines = _lines(input_path, progress.lines)
        if on_progress is not None:
            on_progress(progress.lines, total)
        while chunk := list(itertools.islice(lines, chunk_lines)):
            texts = [line.strip() for line in chunk]
            wanted = [text for text in texts if text]
            translations = translate(engine, [Source(text, target=synthesis.target) for text in wanted], options)
            pairs = [(_one_field(found.text), _one_field(text)) for found, text in zip(translations, wanted)]
            rows = [(made, text) if synthesis.translation_is_source else (text, made) for made, text in pairs if made]
            corpus.write("".join(f"{source}\t{target}\n" for source, target in rows).encode("utf-8"))
            progress.empty += sum(1 for made, _ in pairs if not made)
            corpus.flush()
            os.fsync(corpus.fileno())
            progress.lines += len(chunk)
            progress.bytes = corpus.tell()
            write_whole(progress_path(output), json.dumps(asdict(progress)) + "\n")
            if on_progress is not None:
                on_progress(progress.lines, total)
    progress.done = True
    write_whole(progress_path(output), json.dumps(asdict(progress)) + "\n")
    return progress


def _one_field(text: str) -> str:
    return " ".join(text.replace("\t", " ").split())


def distilled_student_config(
    student: dict,
    teacher: Config,
    direction: Direction,
    distilled: Path,
    held_out: tuple[tuple[Path, Path], tuple[Path, Path]],
    run_dir: Path,
    original_weight: float = 0.0,
) -> dict:
    """A student's config (`student`, such as the built-in student.yaml, as YAML values) that trains
    on the distilled corpus in `direction` and is validated and tested on the teacher's held-out
    (source, reference) files, so that the two are scored on the same sentences. With
    `original_weight`, the teacher's own corpora are mixed in at that weight, their pairs whose
    source is held out left out."""
    data = config_to_dict(teacher.data)
    corpora = [
        {
            "path": str(distilled.resolve()),
            "name": "distilled",
            "split": False,
            **dict(zip(("src_lang", "tgt_lang"), direction)),
        }
    ]
    if original_weight > 0:
        originals = data["corpora"] or [data["corpus"]]
        corpora += [{**corpus, "weight": original_weight, "split": False} for corpus in originals]
    (valid_source, valid_reference), (test_source, test_reference) = held_out
    student = {**student, "run_dir": str(run_dir)}
    student["data"] = {
        **{key: data[key] for key in ("max_source_tokens", "max_target_tokens", "max_length_ratio", "split_seed")},
        "corpora": corpora,
        "valid_corpus": {
            "format": "text",
            "src_path": str(valid_source.resolve()),
            "tgt_path": str(valid_reference.resolve()),
        },
        "test_corpus": {
            "format": "text",
            "src_path": str(test_source.resolve()),
            "tgt_path": str(test_reference.resolve()),
        },
        "src_lang": direction.source,
        "tgt_lang": direction.target,
        "filters": {**data["filters"], "held_out": True},
    }
    return student
