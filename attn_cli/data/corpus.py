"""Parallel corpora, read as streams.

Readers turn a `CorpusConfig` into a stream of (source, target) string pairs. Malformed lines are
skipped and recorded in a `ReadReport` (or raise `DataError` in strict mode) so one bad line never
costs a whole corpus.
"""

from __future__ import annotations

import bz2
import gzip
import io
import itertools
import json
import lzma
import math
import zipfile
from collections import Counter
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterable, Iterator, Optional

from attn_cli.config import CorpusConfig
from attn_cli.data.builtin_corpora import BUILTIN_PREFIX, corpus_file, corpus_names
from attn_cli.errors import UserError
from attn_cli.languages import Direction, primary_subtag

Pair = tuple[str, str]
HeldOut = dict[Direction, list[Pair]]  # validation or test pairs, by the direction they are scored in
Languages = Optional[tuple[str, str]]  # (source, target) language codes

_UTF8_BOM = b"\xef\xbb\xbf"


class DataError(UserError, ValueError):
    """A data problem; the message names the file and line (or the config key) and the fix."""


@dataclass(frozen=True)
class SkippedLine:
    source: str  # file path, or "hf:<name>" for Hugging Face datasets
    line: int  # 1-based line number (row index + 1 for datasets)
    reason: str


@dataclass
class ReadReport:
    """What a reader kept and skipped; may be shared by several `read_corpus` calls. Skipped lines
    are counted by reason, and only the first `kept_examples` are kept: a corpus of 50M lines with
    millions of malformed ones costs a few counters, not a record per line."""

    read: int = 0  # pairs kept
    skipped: list[SkippedLine] = field(default_factory=list)  # the first kept_examples skipped lines
    reasons: Counter = field(default_factory=Counter)  # every skipped line's reason, counted
    kept_examples: int = 100

    def skip(self, skipped: SkippedLine) -> None:
        self.reasons[skipped.reason] += 1
        if len(self.skipped) < self.kept_examples:
            self.skipped.append(skipped)

    @property
    def skipped_count(self) -> int:
        return sum(self.reasons.values())

    def summary(self, limit: int = 5) -> str:
        """One line for the log, e.g. "skipped 3 malformed lines: cmn.txt:12 (empty target), ..."."""
        count = self.skipped_count
        if not count:
            return ""
        shown = ", ".join(f"{s.source}:{s.line} ({s.reason})" for s in self.skipped[:limit])
        more = f", and {count - min(limit, len(self.skipped)):,} more" if count > limit else ""
        return f"skipped {count:,} malformed line{'s' if count != 1 else ''}: {shown}{more}"


# The first lines that say whether a file is read the way the config says: when more than half of
# them are malformed, reading stops there with a guess at the cause, instead of skipping a whole file.
FIRST_LINES = 200


class _Skipper:
    """Handles one malformed line: raise in strict mode, otherwise record it and carry on; and stops
    early when most of the first lines are malformed."""

    def __init__(self, strict: bool, report: Optional[ReadReport], cfg: CorpusConfig, key: str):
        self.strict = strict
        self.report = report
        self.cfg, self.key = cfg, key
        self.kept = 0
        self.early: list[SkippedLine] = []  # the malformed among the first lines

    def skip(self, source: str, line: int, reason: str) -> None:
        if self.strict:
            raise DataError(f"{source}:{line}: {reason} (set data.strict: false to skip such lines)")
        if self.report is not None:
            self.report.skip(SkippedLine(source, line, reason))
        if self.kept + len(self.early) < FIRST_LINES:
            self.early.append(SkippedLine(source, line, reason))
            self.check_first_lines()

    def keep(self) -> None:
        self.kept += 1
        if self.kept + len(self.early) == FIRST_LINES:
            self.check_first_lines()

    def check_first_lines(self, at_end: bool = False) -> None:
        """DataError when more than half of the first lines (of all, at the end of a short file)
        are malformed, with the commonest reason and a guess at the fix."""
        seen = self.kept + len(self.early)
        if not self.early or (seen < FIRST_LINES and not at_end) or len(self.early) * 2 <= seen:
            return
        reasons = Counter(skipped.reason for skipped in self.early)
        reason, _ = reasons.most_common(1)[0]
        example = next(skipped for skipped in self.early if skipped.reason == reason)
        raise DataError(
            f"{example.source}: {len(self.early)} of the first {seen} lines are malformed "
            f"({reason}, e.g. line {example.line}); {_guess(self.cfg, self.key, reason)}"
        )


def _guess(cfg: CorpusConfig, key: str, reason: str) -> str:
    """What most likely makes most lines of a file malformed, and the fix."""
    if reason == "invalid UTF-8":
        return (
            "is it binary, or in another encoding? attn reads gzip, bz2, xz, zstd and zip files by their "
            "first bytes; convert other encodings to UTF-8 (iconv -t UTF-8)"
        )
    if cfg.format == "tsv" and reason.endswith("found 1"):
        return (
            f"the lines have no tab: two aligned files are {key}.format: text (src_path, tgt_path), "
            f"JSON lines format: jsonl, a TMX file format: tmx"
        )
    if cfg.format == "tsv" and reason.startswith("expected"):
        return f"check {key}.src_column and {key}.tgt_column (columns count from 0)"
    if reason.startswith("invalid JSON") or reason.startswith("expected a JSON object"):
        return f"is it JSON lines? tab-separated text is {key}.format: tsv"
    if reason.startswith("missing field") or reason.startswith("field "):
        return f"set {key}.src_field and {key}.tgt_field to the fields that hold the two sides"
    if "variant" in reason:
        return "check data.src_lang and data.tgt_lang against the file's xml:lang codes"
    return f"check {key} against the file"


# ---------------------------------------------------------------------------------------------
# Reading


def iter_corpus(
    cfg: CorpusConfig,
    strict: bool = False,
    report: Optional[ReadReport] = None,
    config_key: str = "data.corpus",
    languages: Languages = None,
) -> Iterator[Pair]:
    """The (source, target) pairs that `cfg` describes, surrounding whitespace stripped, read as a
    stream: a corpus of any size costs the memory of one line (or one batch of dataset rows).

    `config_key` is the YAML path of `cfg`, used only in error messages (e.g. "data.valid_corpus").
    `languages`, (data.src_lang, data.tgt_lang), say which TMX variants and which members of an
    OPUS .zip are the source and the target.
    """
    return (pair for _, pair in iter_numbered_corpus(cfg, strict, report, config_key, languages))


def iter_numbered_corpus(
    cfg: CorpusConfig,
    strict: bool = False,
    report: Optional[ReadReport] = None,
    config_key: str = "data.corpus",
    languages: Languages = None,
) -> Iterator[tuple[int, Pair]]:
    """`iter_corpus`, each pair with the 1-based line it was read from (the row + 1 of a dataset),
    so that a report about a pair can point at it in the file."""
    return ((line, pair) for line, pair, _ in iter_scored_corpus(cfg, strict, report, config_key, languages))


def iter_scored_corpus(
    cfg: CorpusConfig,
    strict: bool = False,
    report: Optional[ReadReport] = None,
    config_key: str = "data.corpus",
    languages: Languages = None,
) -> Iterator[tuple[int, Pair, Optional[float]]]:
    """`iter_numbered_corpus`, each pair with its score: the number in the corpus's score_column
    (tsv) or score_field (jsonl), such as a Bicleaner or OpusFilter score; None without one."""
    readers = {"tsv": _read_tsv, "jsonl": _read_jsonl, "text": _read_text, "tmx": _read_tmx, "hf": _read_hf}
    if cfg.format not in readers:
        raise DataError(f"{config_key}.format: {cfg.format!r} is not one of {', '.join(map(repr, readers))}")
    skipper = _Skipper(strict, report, cfg, config_key)
    for line, pair, score in readers[cfg.format](cfg, skipper, config_key, languages or ("en", "zh")):
        skipper.keep()
        if report is not None:
            report.read += 1
        yield line, pair, score
    skipper.check_first_lines(at_end=True)


def read_corpus(
    cfg: CorpusConfig,
    strict: bool = False,
    report: Optional[ReadReport] = None,
    config_key: str = "data.corpus",
    languages: Languages = None,
) -> list[Pair]:
    """All pairs of a corpus small enough to hold in memory: a validation or test corpus."""
    return list(iter_corpus(cfg, strict, report, config_key, languages))


# Compressed corpora are recognised by their first bytes, whatever their names.
_MAGIC = {
    b"\x1f\x8b": "gzip",
    b"BZh": "bz2",
    b"\xfd7zXZ\x00": "xz",
    b"\x28\xb5\x2f\xfd": "zstd",
    b"PK\x03\x04": "zip",
}
# Members of an OPUS download that are not data.
_NOT_DATA = ("readme", "license", "licence")


def _corpus_file(path: Optional[str], key: str) -> str:
    """The file that `path` names: a path, or `builtin:NAME` for a corpus that ships with attn."""
    try:
        file = corpus_file(path) if path else ""
    except KeyError:
        raise DataError(
            f"{key}: {path!r} is not a built-in corpus; the built-in ones are "
            f"{', '.join(BUILTIN_PREFIX + name for name in corpus_names())}"
        ) from None
    if not file or not Path(file).is_file():
        raise DataError(
            f"corpus file not found: {path} (check {key} in your config; "
            "relative paths are resolved from the current directory)"
        )
    return file


def _compression(file: str) -> Optional[str]:
    with open(file, "rb") as stream:
        head = stream.read(10)
    if head.startswith(b"BZh") and head[4:10] != b"1AY&SY":  # text that happens to begin "BZh"
        return None
    return next((kind for magic, kind in _MAGIC.items() if head.startswith(magic)), None)


@contextmanager
def open_corpus_file(path: Optional[str], key: str, member: Optional[str] = None, language: Optional[str] = None):
    """The file as a binary stream, decompressed as its first bytes say (gzip, bz2, xz, zstd), or the
    member of a .zip: `member` if named, else the one ending in `.language` (OPUS's Moses files), else
    its only data file. DataError names the file, the key and the fix."""
    file = _corpus_file(path, key)
    kind = _compression(file)
    if kind is None:
        with open(file, "rb") as stream:
            yield stream
    elif kind == "zip":
        with (
            zipfile.ZipFile(file) as archive,
            archive.open(_zip_member(archive, path, key, member, language)) as stream,
        ):
            yield stream
    elif kind == "zstd":
        try:
            import zstandard
        except ImportError:
            raise DataError(
                f"{path} ({key}) is Zstandard-compressed; install zstandard to read it "
                f"(pip install zstandard), or decompress it with zstd -d"
            ) from None
        with open(file, "rb") as raw, zstandard.ZstdDecompressor().stream_reader(raw) as stream:
            yield io.BufferedReader(stream)
    else:
        with {"gzip": gzip.open, "bz2": bz2.open, "xz": lzma.open}[kind](file, "rb") as stream:
            yield stream


def _zip_member(archive: zipfile.ZipFile, path: str, key: str, member: Optional[str], language: Optional[str]) -> str:
    names = [info.filename for info in archive.infolist() if not info.is_dir()]
    listed = ", ".join(names[:10]) + (f" and {len(names) - 10} more" if len(names) > 10 else "")
    if member is not None:
        if member not in names:
            raise DataError(f"{path} has no member {member!r} ({key.rsplit('.', 1)[0]}.member); it holds {listed}")
        return member
    data = [name for name in names if not Path(name).name.lower().startswith(_NOT_DATA)]
    if language is not None:
        ending = [name for name in data if primary_subtag(Path(name).suffix[1:]) == primary_subtag(language)]
        if len(ending) == 1:
            return ending[0]
    if len(data) == 1:
        return data[0]
    wanted = f"one ending in .{language}, " if language is not None else ""
    raise DataError(f"{path} ({key}) holds {listed}: {wanted}name the one to read with {key.rsplit('.', 1)[0]}.member")


def _read_lines(
    path: Optional[str], key: str, member: Optional[str] = None, language: Optional[str] = None
) -> Iterator[bytes]:
    """The file's lines as raw bytes (BOM removed), so each line can be decoded on its own; read as
    a stream, decompressed or taken from a .zip (`open_corpus_file`). Lines end at \\n only."""
    try:
        with open_corpus_file(path, key, member, language) as stream:
            for number, line in enumerate(stream):
                if number == 0 and line.startswith(_UTF8_BOM):
                    line = line[len(_UTF8_BOM) :]
                # A final newline ends the last line; it does not start an extra empty one.
                yield line[:-1] if line.endswith(b"\n") else line
    except (OSError, EOFError, lzma.LZMAError, zipfile.BadZipFile) as error:  # truncated or corrupt
        raise DataError(f"cannot read {path} ({key}): {error}") from None
    except Exception as error:  # zstandard's own ZstdError
        if type(error).__name__ != "ZstdError":
            raise
        raise DataError(f"cannot read {path} ({key}): {error}") from None


def _decode(raw: bytes) -> Optional[str]:
    """The line as text, or None when it is not valid UTF-8."""
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError:
        return None


def _empty_side(src: str, tgt: str) -> Optional[str]:
    if not src:
        return "empty source"
    if not tgt:
        return "empty target"
    return None


def _decoded_lines(
    path: Optional[str], key: str, skipper: _Skipper, member: Optional[str] = None
) -> Iterable[tuple[int, str]]:
    """(1-based line number, text) for each line that is valid UTF-8; the others are skipped."""
    for number, raw in enumerate(_read_lines(path, key, member), start=1):
        line = _decode(raw)
        if line is None:
            skipper.skip(path, number, "invalid UTF-8")
            continue
        yield number, line


Scored = Iterator[tuple[int, Pair, Optional[float]]]  # (line, pair, score) from a reader


def _read_tsv(cfg: CorpusConfig, skipper: _Skipper, key: str, languages: tuple[str, str]) -> Scored:
    needed = max(cfg.src_column, cfg.tgt_column, -1 if cfg.score_column is None else cfg.score_column) + 1
    for number, line in _decoded_lines(cfg.path, f"{key}.path", skipper, cfg.member):
        # A whitespace-only line is a blank line; one with a tab is a record with empty fields.
        if not line.strip() and "\t" not in line:
            continue
        fields = line.split("\t")
        if len(fields) < needed:
            skipper.skip(cfg.path, number, f"expected at least {needed} tab-separated fields, found {len(fields)}")
            continue
        src, tgt = fields[cfg.src_column].strip(), fields[cfg.tgt_column].strip()
        problem = _empty_side(src, tgt)
        score, score_problem = (None, None) if cfg.score_column is None else _number(fields[cfg.score_column])
        problem = problem or (score_problem and f"column {cfg.score_column} (score_column) {score_problem}")
        if problem:
            skipper.skip(cfg.path, number, problem)
            continue
        yield number, (src, tgt), score


def _number(value: Any) -> tuple[Optional[float], Optional[str]]:
    """(a score, None), or (None, what is wrong with it)."""
    if isinstance(value, bool):
        return None, f"is {value!r}, not a number"
    try:
        number = float(value.strip() if isinstance(value, str) else value)
    except (TypeError, ValueError):
        return None, f"is {value!r}, not a number"
    return (number, None) if math.isfinite(number) else (None, f"is {value!r}, not a finite number")


_MISSING = object()


def _lookup(record: Any, dotted: str) -> tuple[Optional[str], Optional[str]]:
    """(value, None) for a string reached by `a.b.c` through nested dicts, else (None, problem)."""
    value: Any = record
    for part in dotted.split("."):
        value = value.get(part, _MISSING) if isinstance(value, dict) else _MISSING
        if value is _MISSING:
            return None, f"missing field {dotted!r}"
    if not isinstance(value, str):
        kind = "null" if value is None else type(value).__name__
        return None, f"field {dotted!r} is {kind}, not a string"
    return value.strip(), None


def _pair_from_record(record: Any, src_field: str, tgt_field: str) -> tuple[Optional[Pair], Optional[str]]:
    """The pair in one JSON object or dataset row, or the reason it has none."""
    src, problem = _lookup(record, src_field)
    if problem:
        return None, problem
    tgt, problem = _lookup(record, tgt_field)
    if problem:
        return None, problem
    problem = _empty_side(src, tgt) or _not_encodable(src, tgt)
    return (None, problem) if problem else ((src, tgt), None)


def _not_encodable(src: str, tgt: str) -> Optional[str]:
    """A JSON escape such as "\\ud800" decodes to a lone surrogate, which is no text a tokenizer or
    a file can take: such a record is malformed here, not a failure later."""
    try:
        (src + tgt).encode("utf-8")
    except UnicodeEncodeError:
        return "a lone surrogate (a \\u escape that is half of a pair)"
    return None


def _read_jsonl(cfg: CorpusConfig, skipper: _Skipper, key: str, languages: tuple[str, str]) -> Scored:
    for number, line in _decoded_lines(cfg.path, f"{key}.path", skipper, cfg.member):
        if not line.strip():
            continue
        try:
            record = json.loads(line)
        except json.JSONDecodeError as error:
            skipper.skip(cfg.path, number, f"invalid JSON ({error.msg})")
            continue
        if not isinstance(record, dict):
            skipper.skip(cfg.path, number, f"expected a JSON object, found {type(record).__name__}")
            continue
        pair, problem = _pair_from_record(record, cfg.src_field, cfg.tgt_field)
        score = None
        if not problem and cfg.score_field is not None:
            value = record.get(cfg.score_field, _MISSING)
            score, score_problem = (None, f"missing field {cfg.score_field!r}") if value is _MISSING else _number(value)
            problem = score_problem and f"field {cfg.score_field!r} (score_field) {score_problem}"
        if problem:
            skipper.skip(cfg.path, number, problem)
            continue
        yield number, pair, score


def _aligned_lines(cfg: CorpusConfig, key: str, languages: tuple[str, str]) -> Iterator[tuple[bytes, bytes]]:
    """Line N of the source file with line N of the target file, read side by side (from one .zip,
    its members ending in .SRC_LANG and .TGT_LANG)."""
    src_lines = _read_lines(cfg.src_path, f"{key}.src_path", None, languages[0])
    tgt_lines = _read_lines(cfg.tgt_path, f"{key}.tgt_path", None, languages[1])
    for number, (src_raw, tgt_raw) in enumerate(itertools.zip_longest(src_lines, tgt_lines), start=1):
        if src_raw is None or tgt_raw is None:
            # Misaligned files would pair every later sentence with the wrong translation.
            src_count = number - 1 + (src_raw is not None) + sum(1 for _ in src_lines)
            tgt_count = number - 1 + (tgt_raw is not None) + sum(1 for _ in tgt_lines)
            raise DataError(
                f"aligned text files differ in length: {cfg.src_path} has {src_count} lines, "
                f"{cfg.tgt_path} has {tgt_count} (check {key}.src_path and {key}.tgt_path; "
                "line N of one must translate line N of the other)"
            )
        yield src_raw, tgt_raw


def _read_text(cfg: CorpusConfig, skipper: _Skipper, key: str, languages: tuple[str, str]) -> Scored:
    for number, (src_raw, tgt_raw) in enumerate(_aligned_lines(cfg, key, languages), start=1):
        src, tgt = _decode(src_raw), _decode(tgt_raw)
        if src is None or tgt is None:
            skipper.skip(cfg.src_path if src is None else cfg.tgt_path, number, "invalid UTF-8")
            continue
        src, tgt = src.strip(), tgt.strip()
        if not src and not tgt:
            continue
        if not src or not tgt:
            skipper.skip(cfg.src_path if not src else cfg.tgt_path, number, _empty_side(src, tgt))
            continue
        yield number, (src, tgt), None


def _read_tmx(cfg: CorpusConfig, skipper: _Skipper, key: str, languages: tuple[str, str]) -> Scored:
    """A TMX file's translation units, read as a stream (each unit cleared once read): the `seg` of
    the variant whose xml:lang (or lang) has the source language's primary subtag, and the target's.
    Inline markup (bpt, ept, ph, it) is left out of the text; what it encloses (hi, sub) is kept."""
    from xml.etree.ElementTree import ParseError, iterparse

    wanted = [primary_subtag(code) for code in languages]
    xml_lang = "{http://www.w3.org/XML/1998/namespace}lang"
    unit = 0
    try:
        with open_corpus_file(cfg.path, f"{key}.path", cfg.member) as stream:
            for _, element in iterparse(stream, events=("end",)):
                if element.tag != "tu":
                    continue
                unit += 1
                found: dict[str, str] = {}
                for variant in element.iter("tuv"):
                    code = primary_subtag(variant.get(xml_lang) or variant.get("lang") or "")
                    segment = variant.find("seg")
                    if code in wanted and code not in found and segment is not None:
                        found[code] = " ".join(_segment_text(segment).split())
                element.clear()
                src, tgt = found.get(wanted[0]), found.get(wanted[1])
                if src is None or tgt is None:
                    missing = languages[0] if src is None else languages[1]
                    skipper.skip(cfg.path, unit, f"translation unit without a {missing} variant")
                    continue
                problem = _empty_side(src, tgt)
                if problem:
                    skipper.skip(cfg.path, unit, problem)
                    continue
                yield unit, (src, tgt), None
    except (OSError, EOFError, lzma.LZMAError, zipfile.BadZipFile) as error:
        raise DataError(f"cannot read {cfg.path} ({key}.path): {error}") from None
    except ParseError as error:
        line, column = error.position
        raise DataError(
            f"{cfg.path}:{line}: not well-formed XML at column {column} ({key}.path, format tmx); "
            f"fix the file or convert it to TSV"
        ) from None


_INLINE_CODES = {"bpt", "ept", "ph", "it", "ut"}  # TMX inline markup: formatting codes, not text


def _segment_text(segment) -> str:
    parts = [segment.text or ""]
    for child in segment:
        if child.tag not in _INLINE_CODES:
            parts.append(_segment_text(child))
        parts.append(child.tail or "")
    return "".join(parts)


# Rows of a dataset taken from its Arrow table at a time: Python objects for these only.
_HF_ROWS_AT_A_TIME = 10_000


def _read_hf(cfg: CorpusConfig, skipper: _Skipper, key: str, languages: tuple[str, str]) -> Scored:
    dataset = _open_hf_dataset(cfg, key)
    source = f"hf:{cfg.path or cfg.hf_name}"
    src_top = _hf_column(dataset, cfg.src_field, source, f"{key}.src_field")
    tgt_top = _hf_column(dataset, cfg.tgt_field, source, f"{key}.tgt_field")
    rows = dataset.select_columns(sorted({src_top, tgt_top})).iter(batch_size=_HF_ROWS_AT_A_TIME)
    row = 0
    for batch in rows:
        for src_value, tgt_value in zip(batch[src_top], batch[tgt_top]):
            row += 1
            # Rebuild a minimal row so dotted names resolve exactly as they do for JSON lines.
            record = {src_top: src_value, tgt_top: tgt_value}
            pair, problem = _pair_from_record(record, cfg.src_field, cfg.tgt_field)
            if problem:
                skipper.skip(source, row, problem)
                continue
            yield row, pair, None


def _open_hf_dataset(cfg: CorpusConfig, key: str) -> Any:
    import datasets  # slow to import; only this format needs it

    if cfg.path:
        if not Path(cfg.path).is_dir():
            raise DataError(
                f"dataset directory not found: {cfg.path} (check {key}.path in your config; it must be "
                "a directory written by Dataset.save_to_disk; relative paths are resolved from the "
                "current directory)"
            )
        try:
            loaded = datasets.load_from_disk(cfg.path)
        except (OSError, ValueError) as error:  # a directory save_to_disk did not write, or damaged
            raise DataError(
                f"{cfg.path} is not a saved dataset: {_first_line(error)} (check {key}.path; it must be "
                "a directory written by Dataset.save_to_disk)"
            ) from None
        if isinstance(loaded, datasets.DatasetDict):
            if cfg.hf_split not in loaded:
                raise DataError(
                    f"{cfg.path}: no split {cfg.hf_split!r} (check {key}.hf_split; "
                    f"available: {', '.join(loaded.keys())})"
                )
            loaded = loaded[cfg.hf_split]
        return loaded
    files = list(cfg.hf_data_files) if isinstance(cfg.hf_data_files, tuple) else cfg.hf_data_files
    given = (("data_files", files), ("revision", cfg.hf_revision), ("streaming", cfg.hf_streaming))
    extra = {name: value for name, value in given if value}
    try:
        return datasets.load_dataset(cfg.hf_name, cfg.hf_config, split=cfg.hf_split, **extra)
    except (OSError, ValueError) as error:  # not found, not reachable (no network), or not readable
        raise DataError(
            f"dataset {cfg.hf_name!r} could not be loaded: {_first_line(error)} (check {key}.hf_name "
            f"and {key}.hf_data_files)"
        ) from None
    except RuntimeError as error:  # datasets >= 4 no longer runs a dataset's loading script
        if "script" not in str(error).lower():
            raise
        raise DataError(
            f"dataset {cfg.hf_name!r} is loaded by a script, which datasets no longer runs: "
            f"{_first_line(error)}; set {key}.hf_revision: refs/convert/parquet (the Hub's Parquet copy) "
            f"or give its data files with {key}.hf_data_files"
        ) from None


def _first_line(error: Exception) -> str:
    return str(error).strip().splitlines()[0] if str(error).strip() else type(error).__name__


def _hf_column(dataset: Any, dotted: str, source: str, key: str) -> str:
    """The top-level column that `dotted` starts in; a missing column is a config error, not a bad row."""
    top = dotted.split(".")[0]
    if dataset.column_names is not None and top not in dataset.column_names:  # None: a stream not yet read
        raise DataError(
            f"{source}: no column {top!r} for {key}={dotted!r} (available columns: {', '.join(dataset.column_names)})"
        )
    return top
