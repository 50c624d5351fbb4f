"""Sentences in and translations out, as lines: reading input files and stdin (text, or JSONL with
a prefix and a glossary per line) into `Source` records, writing text or JSONL.

`attn translate` and `attn eval` read and write through here; the messages name the file and line
at fault, so they can be shown to the user as they are.
"""

from __future__ import annotations

import contextlib
import io
import json
import select
import sys
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Optional, TextIO

from attn_cli.decoding.glossary import Term, combined, glossary_from_json
from attn_cli.decoding.records import Source, Translation
from attn_cli.errors import UserError
from attn_cli.files import written_whole

OUTPUT_FORMATS = ("text", "jsonl")
INPUT_FORMATS = ("text", "jsonl")
_INPUT_KEYS = ("source", "prefix", "glossary", "target")  # of a JSONL input line


def read_lines(path: Path) -> list[str]:
    """The lines of a UTF-8 text file, without their line ends. Lines end at \\n (a \\r before it
    goes too) and nowhere else: a form feed or U+2028 inside a sentence does not make two lines, so
    output line N always answers input line N."""
    if not path.is_file():
        raise UserError(f"input file not found: {path}")
    try:
        text = path.read_bytes().decode("utf-8")
    except UnicodeDecodeError as error:
        raise UserError(f"{path}: not valid UTF-8 at byte {error.start}; convert it with `iconv -t utf-8`") from None
    lines = text.split("\n")
    if lines[-1] == "":  # the final line end ends the last line; it does not start another
        lines.pop()
    return [line.removesuffix("\r") for line in lines]


def read_parallel(sources: Path, references: Path) -> tuple[list[str], list[str]]:
    """Source sentences and their reference translations, paired line by line."""
    source_lines, reference_lines = read_lines(sources), read_lines(references)
    if len(source_lines) != len(reference_lines):
        raise UserError(
            f"{sources} has {len(source_lines)} lines but {references} has {len(reference_lines)}; "
            f"they must pair up line by line"
        )
    return source_lines, reference_lines


def valid_text(
    lines: Sequence[str], where: str | Path, warn: Callable[[str], None], first_number: int = 1
) -> list[str]:
    """Each line as text the tokenizer takes: bytes that were not UTF-8 (which Python keeps in
    arguments and in `tolerant_stdin` as lone surrogates) become U+FFFD, and `warn` names the line,
    so the other lines still translate."""
    valid = []
    for number, line in enumerate(lines, start=first_number):
        try:
            line.encode("utf-8")
        except UnicodeEncodeError:
            line = _replace_undecodable(line)
            warn(f"warning: {where} line {number}: bytes that are not UTF-8 were replaced with U+FFFD")
        valid.append(line)
    return valid


@dataclass(frozen=True)
class Reading:
    """How input lines become sources: their format (text or JSONL), and what every source gets
    unless its JSONL line says otherwise (--prefix, --glossary, whether attention is wanted)."""

    format: str = "text"
    prefix: str = ""
    glossary: tuple[Term, ...] = ()
    attention: bool = False
    target: Optional[str] = None  # the language to translate into (--target; a model of several asks)

    def sources(self, lines: Sequence[str], where: str | Path, first_number: int = 1) -> list[Source]:
        """The sources of input lines. A text line is a source with the reading's prefix and glossary.
        A JSONL line is an object {"source": "...", "prefix": "...", "glossary": [["term", "target"],
        ...], "target": "zh"}: "prefix" and "target" may be left out (then the reading's apply), a
        line's "glossary" adds to the reading's (its targets win for a term in both), and an empty
        line is an empty source, as in text. Errors name `where` and the line."""
        if self.format not in INPUT_FORMATS:
            raise ValueError(f"input format {self.format!r} is not one of {', '.join(INPUT_FORMATS)}")
        if self.format == "text":
            return [Source(line, self.prefix, self.glossary, self.attention, self.target) for line in lines]
        sources = []
        for number, line in enumerate(lines, start=first_number):
            record = _input_record(line, f"{where} line {number}") if line.strip() else {"source": ""}
            terms = tuple(combined(self.glossary, record.get("glossary", [])))
            prefix, target = record.get("prefix", self.prefix), record.get("target", self.target)
            sources.append(Source(record["source"], prefix, terms, self.attention, target))
        return sources


def _input_record(line: str, where: str) -> dict:
    """One JSONL input line, checked: an object with a "source" string, at most a "prefix" string,
    a "glossary" (read into terms) and a "target" language code."""
    fix = (
        'write each line as {"source": "...", "prefix": "...", "glossary": [["term", "target"]], "target": "zh"} '
        '(all but "source" optional)'
    )
    try:
        record = json.loads(line)
    except json.JSONDecodeError as error:
        raise UserError(f"{where}: not JSON ({error.msg} at column {error.colno}); {fix}") from None
    if not isinstance(record, dict):
        raise UserError(f"{where}: a JSON {_json_kind(record)}, not an object; {fix}")
    unknown = [key for key in record if key not in _INPUT_KEYS]
    if unknown:  # a misspelt "prefix" must not be dropped without a word
        raise UserError(f"{where}: unknown key {unknown[0]!r}; {fix}")
    for key in ("source", "prefix", "target"):
        if key in record and not isinstance(record[key], str):
            raise UserError(f"{where}: {key!r} is a JSON {_json_kind(record[key])}, not a string; {fix}")
    if "source" not in record:
        raise UserError(f"{where}: no 'source'; {fix}")
    if "glossary" in record:  # a GlossaryError names the line and the entry
        record["glossary"] = glossary_from_json(record["glossary"], f"{where}: 'glossary'")
    return record


def _json_kind(value: object) -> str:
    names = {dict: "object", list: "array", str: "string", bool: "boolean", int: "number", float: "number"}
    return names.get(type(value), "null")


def _replace_undecodable(line: str) -> str:
    try:  # bytes kept by surrogateescape: decode them back as far as they are UTF-8
        return line.encode("utf-8", "surrogateescape").decode("utf-8", "replace")
    except UnicodeEncodeError:  # other lone surrogates
        return "".join("\ufffd" if "\ud800" <= char <= "\udfff" else char for char in line)


def tolerant_stdin(stream: TextIO) -> TextIO:
    """Standard input that keeps bytes which are not UTF-8 (for `valid_text` to name and replace)
    instead of failing on them, and ends lines at \\n only, as files are read."""
    if not hasattr(stream, "buffer"):  # already text without bytes behind it (tests)
        return stream
    return io.TextIOWrapper(stream.buffer, encoding="utf-8", errors="surrogateescape", newline="\n")


def stdin_batches(stream: TextIO, max_lines: int = 64) -> Iterator[list[str]]:
    """Lines as they arrive: each batch holds the lines already waiting, so a pipe fed one line at
    a time gets each answer at once, and a file piped in is still translated in batches."""
    try:
        stream.fileno()
    except (OSError, ValueError, AttributeError):  # not a real file (tests): one line at a time
        for line in stream:
            yield [line.rstrip("\n")]
        return
    while True:
        line = stream.readline()
        if not line:
            return
        batch = [line.rstrip("\n")]
        while len(batch) < max_lines and select.select([stream], [], [], 0)[0]:
            line = stream.readline()
            if not line:
                break
            batch.append(line.rstrip("\n"))
        yield batch


class TranslationWriter:
    """Writes translations as text (one line each; with n-best, `input<TAB>score<TAB>text` lines) or
    JSONL (`Translation.to_dict`, one object a line), and tells `warn` each translation's notes
    that are warnings, naming its line of `where` (a file, "stdin" or "argument")."""

    def __init__(self, out: TextIO, output_format: str, warn: Callable[[str], None], where: str | Path):
        if output_format not in OUTPUT_FORMATS:
            raise ValueError(f"output format {output_format!r} is not one of {', '.join(OUTPUT_FORMATS)}")
        self.out, self.format, self.warn, self.where = out, output_format, warn, where
        self.count = 0  # translations written so far; the n-best text format numbers inputs with it

    def write(self, translations: Sequence[Translation]) -> None:
        for translation in translations:
            self.count += 1
            for note in translation.notes:
                if note.warning:
                    self.warn(f"warning: {self.where} line {self.count}: {note.message}")
            self.out.write(self._format(translation))
        self.out.flush()  # each batch as soon as it is done, so a reader at the other end of a pipe sees it

    def _format(self, translation: Translation) -> str:
        if self.format == "jsonl":
            return json.dumps(translation.to_dict(), ensure_ascii=False) + "\n"
        if len(translation.candidates) == 1:
            return translation.text + "\n"
        return "".join(f"{self.count - 1}\t{c.score:.4f}\t{c.text}\n" for c in translation.candidates)


@contextlib.contextmanager
def output_stream(path: Optional[Path]) -> Iterator[TextIO]:
    """stdout, or a file written whole or not at all (attn_cli/files.py): an interrupted run leaves
    what was there untouched, so `--output` may even name the `--input` file."""
    if path is None:
        yield sys.stdout
        return
    with written_whole(path, label=f"--output {path}") as out:
        yield out
