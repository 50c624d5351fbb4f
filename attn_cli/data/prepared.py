"""The training data, read, split, tokenized and filtered once, and kept on disk for every later start.

A prepared entry is a directory of NumPy arrays (the token ids of every training pair, flat, with
the offsets where each pair starts) beside the validation and test sentences as text. Later starts
(a resume, a restart, another run with the same data and tokenizer) open the arrays memory-mapped:
nothing is read or tokenized again, and the pages are shared through the page cache by every
process that maps them. NumPy rather than Arrow: a pair is two slices of two arrays, which is all
batching needs, and `np.load(mmap_mode="r")` opens them in microseconds.

An entry is named by a hash of everything it is made from: the corpus files (size, modification
time and a hash of their content), the `data` section and the tokenizer's model. It is written
into a temporary directory and renamed into place when complete, so a crash while it was written
leaves no entry, and nothing half-written is ever opened; a changed corpus, filter or tokenizer
has another name, and is prepared again.
"""

from __future__ import annotations

import hashlib
import json
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Optional, Sequence

import numpy as np

from attn_cli.config import CorpusConfig, DataConfig, config_to_dict
from attn_cli.data.batching import Example
from attn_cli.data.builtin_corpora import BUILTIN_PREFIX, corpus_file
from attn_cli.data.corpus import Pair
from attn_cli.data.tokenizer import Tokenizers
from attn_cli.files import directory_built_whole, write_whole

FORMAT = 1
_ARRAYS = ("src_ids", "src_offsets", "tgt_ids", "tgt_offsets")
_MANIFEST = "manifest.json"


class TokenizedPairs:
    """Token ids of many (source, target) pairs in four flat arrays: pair i's source is
    src_ids[src_offsets[i]:src_offsets[i + 1]], and likewise its target. Indexing gives an Example,
    so batching and collation treat it as they treat a list of examples."""

    def __init__(self, src_ids: np.ndarray, src_offsets: np.ndarray, tgt_ids: np.ndarray, tgt_offsets: np.ndarray):
        self.src_ids, self.src_offsets, self.tgt_ids, self.tgt_offsets = src_ids, src_offsets, tgt_ids, tgt_offsets

    @classmethod
    def from_examples(cls, examples: Sequence[Example]) -> "TokenizedPairs":
        def flat(rows: list[list[int]]) -> tuple[np.ndarray, np.ndarray]:
            offsets = np.zeros(len(rows) + 1, dtype=np.int64)
            np.cumsum([len(row) for row in rows], out=offsets[1:])
            ids = np.fromiter((token for row in rows for token in row), dtype=np.int32, count=int(offsets[-1]))
            return ids, offsets

        return cls(*flat([e.src for e in examples]), *flat([e.tgt for e in examples]))

    def __len__(self) -> int:
        return len(self.src_offsets) - 1

    def __getitem__(self, i: int) -> Example:
        return Example(i, self.src_ids[self.src_offsets[i]:self.src_offsets[i + 1]].tolist(),
                       self.tgt_ids[self.tgt_offsets[i]:self.tgt_offsets[i + 1]].tolist())

    @property
    def src_lengths(self) -> np.ndarray:
        return np.diff(self.src_offsets)

    @property
    def tgt_lengths(self) -> np.ndarray:
        return np.diff(self.tgt_offsets)

    def save(self, directory: Path) -> None:
        for name in _ARRAYS:
            np.save(directory / f"{name}.npy", getattr(self, name))

    @classmethod
    def open(cls, directory: Path) -> "TokenizedPairs":
        return cls(*(np.load(directory / f"{name}.npy", mmap_mode="r") for name in _ARRAYS))


@dataclass
class PreparedData:
    train: TokenizedPairs  # the training pairs the length filters kept
    valid: list[Pair]
    test: list[Pair]
    stats: dict  # what preparing found: pairs read and skipped, dropped by the filters
    directory: Path


def entry_name(data: DataConfig, tokenizers: Tokenizers) -> str:
    """The name of the entry these settings and this tokenizer prepare: a hash of all they depend on."""
    corpora = [c for c in (data.corpus, data.valid_corpus, data.test_corpus) if c is not None]
    settings = {key: value for key, value in config_to_dict(data).items() if key != "cache_dir"}  # where, not what
    made_of = {"format": FORMAT, "data": settings, "corpora": [_identity(c) for c in corpora],
               "tokenizers": [hashlib.sha256(t.model_proto).hexdigest() for t in (tokenizers.source, tokenizers.target)]}
    return hashlib.sha256(json.dumps(made_of, sort_keys=True).encode()).hexdigest()[:20]


def _identity(corpus: CorpusConfig) -> list:
    """What tells a corpus's files apart from any other version of them: path, size, modification
    time and a hash of the content; a dataset on the hub is named, not hashed."""
    paths = [p for p in (corpus.path, corpus.src_path, corpus.tgt_path, corpus.hf_data_files) if p]
    found = []
    for path in paths:
        file = Path(corpus_file(path)) if path.startswith(BUILTIN_PREFIX) else Path(path)
        files = sorted(p for p in file.rglob("*") if p.is_file()) if file.is_dir() else [file] if file.exists() else []
        for each in files:
            stat = each.stat()
            found.append([str(each.resolve()), stat.st_size, stat.st_mtime_ns, _content_hash(each)])
    return [corpus.hf_name, corpus.hf_config, corpus.hf_split, found]


def _content_hash(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as handle:
        while block := handle.read(1 << 20):
            digest.update(block)
    return digest.hexdigest()


def open_prepared(cache_dir: Path, name: str) -> Optional[PreparedData]:
    """The complete entry `name` in `cache_dir`, or None when there is none (or a damaged one, which
    is removed so that it is prepared again)."""
    directory = cache_dir / name
    if not (directory / _MANIFEST).is_file():  # written last: without it, not an entry
        return None
    try:
        manifest = json.loads((directory / _MANIFEST).read_text(encoding="utf-8"))
        return PreparedData(TokenizedPairs.open(directory), _read_pairs(directory, "valid"),
                            _read_pairs(directory, "test"), manifest["stats"], directory)
    except (OSError, ValueError, KeyError):  # cut short by something other than attn, or changed by hand
        shutil.rmtree(directory, ignore_errors=True)
        return None


def save_prepared(cache_dir: Path, name: str, train: TokenizedPairs, valid: list[Pair], test: list[Pair],
                  stats: dict) -> PreparedData:
    """Write the entry whole, into a temporary directory renamed into place, and open it."""
    target = cache_dir / name
    if target.exists() and open_prepared(cache_dir, name) is None:
        shutil.rmtree(target, ignore_errors=True)  # not an entry: a directory of that name left by other means
    try:
        with directory_built_whole(target) as building:
            train.save(building)
            for split, pairs in (("valid", valid), ("test", test)):
                for side in (0, 1):
                    write_whole(building / f"{split}.{side}", "".join(p[side].replace("\n", " ") + "\n" for p in pairs))
            write_whole(building / _MANIFEST, json.dumps({"format": FORMAT, "stats": stats}, indent=1) + "\n")
    except OSError:
        if open_prepared(cache_dir, name) is None:
            raise
        # another process prepared the same entry first: theirs is as good
    prepared = open_prepared(cache_dir, name)
    assert prepared is not None, "an entry just written opens"
    return prepared


def _read_pairs(directory: Path, split: str) -> list[Pair]:
    sides = [(directory / f"{split}.{side}").read_text(encoding="utf-8").split("\n")[:-1] for side in (0, 1)]
    return list(zip(*sides))


def remove_entries_but(cache_dir: Path, name: str) -> None:
    """Remove every entry in `cache_dir` but `name` (a run's own cache, under its lock)."""
    for entry in cache_dir.iterdir():
        if entry.is_dir() and entry.name != name and not entry.name.startswith("."):
            shutil.rmtree(entry, ignore_errors=True)
