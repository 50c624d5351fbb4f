"""The training data, read, split, tokenized and filtered once, and kept on disk for every later start.

A prepared entry is a directory of arrays beside the validation and test sentences as text: the
token ids of every training pair, flat, in a raw little-endian int32 file per side (appended to
chunk by chunk as the pairs are tokenized, so preparing never holds the corpus), and a NumPy array
of the offsets where each pair starts. Later starts (a resume, a restart, another run with the same
data and tokenizer) open the arrays memory-mapped: nothing is read or tokenized again, and the pages
are shared through the page cache by every process that maps them. NumPy rather than Arrow: a pair
is two slices of two arrays, which is all batching needs, and `np.memmap` opens them in microseconds.

An entry is named by a hash of everything it is made from: the corpus files (size, modification
time and a hash of their content), the `data` section and the tokenizer's model. It is written
into a temporary directory and renamed into place when complete, so a crash while it was written
leaves no entry, and nothing half-written is ever opened; a changed corpus, filter or tokenizer
has another name, and is prepared again.
"""

from __future__ import annotations

import hashlib
import itertools
import json
import os
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Optional, Sequence

import numpy as np

from attn_cli.config import CorpusConfig, DataConfig, config_to_dict
from attn_cli.data.batching import Example
from attn_cli.data.builtin_corpora import BUILTIN_PREFIX, corpus_file
from attn_cli.data.corpus import HeldOut, Pair
from attn_cli.data.tokenizer import Tokenizers
from attn_cli.files import directory_built_whole, write_whole
from attn_cli.languages import Direction

# 4: held-out pairs by direction; 3: counts per corpus in the stats (2: training pairs in corpus
# order; 1: in split order)
FORMAT = 4
_ID_TYPE = np.dtype("<i4")  # token ids, little-endian whatever the machine
_ID_BYTES = _ID_TYPE.itemsize
_MANIFEST = "manifest.json"


class TokenizedPairs:
    """Token ids of many (source, target) pairs in four flat arrays: pair i's source is
    src_ids[src_offsets[i]:src_offsets[i + 1]], and likewise its target. Indexing gives an Example,
    so batching and collation treat it as they treat a list of examples."""

    def __init__(self, src_ids: np.ndarray, src_offsets: np.ndarray, tgt_ids: np.ndarray, tgt_offsets: np.ndarray):
        self.src_ids, self.src_offsets, self.tgt_ids, self.tgt_offsets = src_ids, src_offsets, tgt_ids, tgt_offsets

    def __len__(self) -> int:
        return len(self.src_offsets) - 1

    def __getitem__(self, i: int) -> Example:
        return Example(
            i,
            self.src_ids[self.src_offsets[i] : self.src_offsets[i + 1]].tolist(),
            self.tgt_ids[self.tgt_offsets[i] : self.tgt_offsets[i + 1]].tolist(),
        )

    def token_count(self, positions: np.ndarray) -> int:
        """The tokens of the pairs at `positions`, both sides (without EOS or BOS), read from the
        offsets alone: no pair's ids are touched."""
        positions = np.asarray(positions, dtype=np.int64)
        return int(
            (self.src_offsets[positions + 1] - self.src_offsets[positions]).sum()
            + (self.tgt_offsets[positions + 1] - self.tgt_offsets[positions]).sum()
        )

    @property
    def src_lengths(self) -> np.ndarray:
        return np.diff(self.src_offsets)

    @property
    def tgt_lengths(self) -> np.ndarray:
        return np.diff(self.tgt_offsets)

    @classmethod
    def from_rows(cls, src_rows: Sequence[np.ndarray], tgt_rows: Sequence[np.ndarray]) -> "TokenizedPairs":
        """Pairs of token-id rows held in memory (an epoch's joined or recased pairs)."""
        arrays = []
        for rows in (src_rows, tgt_rows):
            offsets = np.zeros(len(rows) + 1, dtype=np.int64)
            np.cumsum(np.fromiter(map(len, rows), np.int64, len(rows)), out=offsets[1:])
            arrays += [np.concatenate(rows) if len(rows) else np.zeros(0, _ID_TYPE), offsets]
        return cls(*arrays)

    @classmethod
    def open(cls, directory: Path) -> "TokenizedPairs":
        """The arrays of `directory`, memory-mapped; ValueError when they do not fit together."""
        arrays = []
        for side in ("src", "tgt"):
            offsets = np.load(directory / f"{side}_offsets.npy", mmap_mode="r")
            ids_file = directory / f"{side}_ids.bin"
            count = int(offsets[-1]) if len(offsets) else -1
            if offsets.ndim != 1 or count < 0 or ids_file.stat().st_size != count * _ID_BYTES:
                raise ValueError(f"{ids_file} does not hold the {count} ids its offsets give")
            # An empty file cannot be mapped.
            ids = np.memmap(ids_file, dtype=_ID_TYPE, mode="r", shape=(count,)) if count else np.zeros(0, _ID_TYPE)
            arrays += [ids, offsets]
        return cls(*arrays)


class TokenizedPairsWriter:
    """Appends tokenized pairs to an entry's arrays a chunk at a time: the ids go straight to disk,
    so preparing costs the memory of one chunk and the lengths (16 bytes per pair), never the corpus."""

    def __init__(self, directory: Path):
        self.directory = directory
        self._ids = {side: (directory / f"{side}_ids.bin").open("wb") for side in ("src", "tgt")}
        self._lengths: dict[str, list[np.ndarray]] = {"src": [], "tgt": []}

    def add(self, src_rows: Sequence[Sequence[int]], tgt_rows: Sequence[Sequence[int]]) -> None:
        for side, rows in (("src", src_rows), ("tgt", tgt_rows)):
            lengths = np.fromiter(map(len, rows), dtype=np.int64, count=len(rows))
            ids = np.fromiter(itertools.chain.from_iterable(rows), dtype=_ID_TYPE, count=int(lengths.sum()))
            # Plain writes, not a memory map: a full disk is an OSError here, not a SIGBUS later.
            self._ids[side].write(ids.tobytes())
            self._lengths[side].append(lengths)

    def finish(self) -> TokenizedPairs:
        """Write the offsets and open the arrays memory-mapped."""
        for side, handle in self._ids.items():
            handle.flush()
            os.fsync(handle.fileno())
            handle.close()
            lengths = np.concatenate(self._lengths[side]) if self._lengths[side] else np.zeros(0, dtype=np.int64)
            offsets = np.zeros(len(lengths) + 1, dtype=np.int64)
            np.cumsum(lengths, out=offsets[1:])
            np.save(self.directory / f"{side}_offsets.npy", offsets)
        return TokenizedPairs.open(self.directory)


@dataclass
class PreparedData:
    train: TokenizedPairs  # the training pairs the length filters kept
    valid: HeldOut
    test: HeldOut
    stats: dict  # what preparing found: pairs read and skipped, dropped by the filters
    directory: Path

    @property
    def corpus_sizes(self) -> list[int]:
        """The training pairs of each directed corpus (data.directed_corpora), stored one after the other."""
        return [corpus["training_pairs"] for corpus in self.stats["corpora"]]


def entry_name(data: DataConfig, tokenizers: Tokenizers) -> str:
    """The name of the entry these settings and this tokenizer prepare: a hash of all they depend on."""
    corpora = [c for c in (*data.training_corpora, data.valid_corpus, data.test_corpus) if c is not None]
    settings = {key: value for key, value in config_to_dict(data).items() if key != "cache_dir"}  # where, not what
    for corpus in settings["corpora"]:  # weights are drawn each epoch: the prepared pairs do not depend on them
        corpus.pop("weight")
    made_of = {
        "format": FORMAT,
        "data": settings,
        "corpora": [_identity(c) for c in corpora],
        "tokenizers": [hashlib.sha256(t.model_proto).hexdigest() for t in (tokenizers.source, tokenizers.target)],
    }
    if (
        tokenizers.source.vocabulary is not None or tokenizers.source_prefix is not None
    ):  # older entries keep their name
        made_of["tokenizer_settings"] = [tokenizers.source.vocabulary, tokenizers.source_prefix]
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


def open_prepared(cache_dir: Path, name: str, remove_damaged: bool = True) -> Optional[PreparedData]:
    """The complete entry `name` in `cache_dir`, or None when there is none (or a damaged one, which
    is removed so that it is prepared again, unless the caller only reads: `remove_damaged=False`)."""
    directory = cache_dir / name
    if not (directory / _MANIFEST).is_file():  # written last: without it, not an entry
        return None
    try:
        manifest = json.loads((directory / _MANIFEST).read_text(encoding="utf-8"))
        directions = [Direction(*direction) for direction in manifest["held_out_directions"]]
        return PreparedData(
            TokenizedPairs.open(directory),
            {direction: _read_pairs(directory, f"valid.{direction}") for direction in directions},
            {direction: _read_pairs(directory, f"test.{direction}") for direction in directions},
            manifest["stats"],
            directory,
        )
    except (OSError, ValueError, KeyError):  # cut short by something other than attn, or changed by hand
        if remove_damaged:
            shutil.rmtree(directory, ignore_errors=True)
        return None


def save_prepared(
    cache_dir: Path, name: str, write_train: Callable[[TokenizedPairsWriter], dict], valid: HeldOut, test: HeldOut
) -> PreparedData:
    """Write the entry whole, into a temporary directory renamed into place, and open it.
    `write_train` adds the training pairs to the writer and returns the statistics of preparing;
    the token counts of what it wrote are added to them."""
    target = cache_dir / name
    if target.exists() and open_prepared(cache_dir, name) is None:
        shutil.rmtree(target, ignore_errors=True)  # not an entry: a directory of that name left by other means
    try:
        with directory_built_whole(target) as building:
            writer = TokenizedPairsWriter(building)
            stats = write_train(writer)
            train = writer.finish()
            stats = dict(
                stats, source_tokens=_length_stats(train.src_lengths), target_tokens=_length_stats(train.tgt_lengths)
            )
            directions = list(dict.fromkeys([*valid, *test]))
            for split, held_out in (("valid", valid), ("test", test)):
                for direction in directions:
                    pairs = held_out.get(direction, [])
                    for side in (0, 1):
                        text = "".join(p[side].replace("\n", " ") + "\n" for p in pairs)
                        write_whole(building / f"{split}.{direction}.{side}", text)
            manifest = {"format": FORMAT, "held_out_directions": directions, "stats": stats}
            write_whole(building / _MANIFEST, json.dumps(manifest, indent=1) + "\n")
            del train  # unmapped before the directory is renamed
    except OSError:
        if open_prepared(cache_dir, name) is None:
            raise
        # another process prepared the same entry first: theirs is as good
    prepared = open_prepared(cache_dir, name)
    assert prepared is not None, "an entry just written opens"
    return prepared


def _length_stats(lengths: np.ndarray) -> dict:
    """The total and the percentiles of the token counts of the training pairs' sides."""
    if not len(lengths):
        return {"total": 0}
    percentiles = np.percentile(lengths, [50, 90, 99]).round(1).tolist()
    return {
        "total": int(lengths.sum()),
        "p50": percentiles[0],
        "p90": percentiles[1],
        "p99": percentiles[2],
        "max": int(lengths.max()),
    }


def _read_pairs(directory: Path, split: str) -> list[Pair]:
    sides = [(directory / f"{split}.{side}").read_text(encoding="utf-8").split("\n")[:-1] for side in (0, 1)]
    return list(zip(*sides))


def remove_entries_but(cache_dir: Path, name: str) -> None:
    """Remove every entry in `cache_dir` but `name` (a run's own cache, under its lock)."""
    for entry in cache_dir.iterdir():
        if entry.is_dir() and entry.name != name and not entry.name.startswith("."):
            shutil.rmtree(entry, ignore_errors=True)
