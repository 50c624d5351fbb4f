"""Carving validation and test sets off a corpus of any size, without holding it in memory.

The training corpora (data.corpus, or each of data.corpora in turn) are read as one stream, twice.
The first pass applies the rules on one pair of data.filters (attn_cli/data/filters.py), once: it
keeps a role per pair read (one byte, UNUSED for a pair a rule removed), and only
8-byte hashes of each pair's source sentence and of the pair, and its line; from these, duplicates
and pairs whose source is held out in a separate validation or test corpus are dropped
(data.filters.duplicates, held_out), and the split is planned as if the corpora were in memory,
from the pairs of the corpora with `split: true`: pairs grouped by source sentence (in order of
first appearance), the groups shuffled with a seeded generator, and whole groups taken for test,
then validation, until each holds at least its size. So all translations of a sentence land on one
side, no source sentence is on two sides, and the sizes are exact up to the last group taken (a
split exceeds its size by less than one group). The second pass collects the validation and test
pairs; the training pairs are read from the corpora again whenever they are needed (tokenizer
sample, tokenization), so memory stays a few bytes per pair.
"""

from __future__ import annotations

import dataclasses
import hashlib
import itertools
import random
from array import array
from dataclasses import dataclass, field
from typing import Callable, Iterable, Iterator, Optional, TypeVar

import numpy as np

from attn_cli.config import DataConfig, TrainingCorpus
from attn_cli.data.corpus import DataError, HeldOut, Pair, ReadReport, iter_scored_corpus, read_corpus
from attn_cli.data.filters import PairRules, Removals
from attn_cli.languages import Direction

T = TypeVar("T")

# What each pair of the corpus stream is for.
UNUSED, TRAIN, VALID, TEST = 0, 1, 2, 3

# Wraps a stream to show its progress: (items, what is being done, how many are expected or None).
Track = Callable[[Iterable[T], str, Optional[int]], Iterable[T]]


def _untracked(items: Iterable[T], description: str, total: Optional[int]) -> Iterable[T]:
    return items


def source_key(source: str) -> int:
    """A 64-bit hash of a source sentence, the same in every process (Python's own hash() is salted)."""
    return int.from_bytes(hashlib.blake2b(source.encode("utf-8"), digest_size=8).digest(), "little")


def pair_key(pair: Pair) -> int:
    """A 64-bit hash of a pair, both sides."""
    digest = hashlib.blake2b(pair[0].encode("utf-8") + b"\t" + pair[1].encode("utf-8"), digest_size=8).digest()
    return int.from_bytes(digest, "little")


def corpus_key(data: DataConfig, index: int) -> str:
    """The YAML key of training corpus `index`: data.corpus, or data.corpora[i]."""
    return f"data.corpora[{index}]" if data.corpora else "data.corpus"


@dataclass
class CorpusRead:
    """What reading one training corpus found: the positions of its pairs in the corpus stream
    (start to end), the pairs its reader gave, and what the filters removed."""

    corpus: TrainingCorpus
    key: str  # its YAML key
    start: int = 0
    end: int = 0
    read: int = 0  # pairs read, before the filters
    removals: Removals = field(default_factory=Removals)


def corpus_stream(
    data: DataConfig,
    strict: bool = False,
    report: Optional[ReadReport] = None,
    reads: Optional[list[CorpusRead]] = None,
) -> Iterator[tuple[int, int, Pair, Optional[float]]]:
    """(corpus, line, pair, score) for each pair read from the training corpora, one corpus after
    the other (the score None for a corpus without scores); `reads`, when given, gets each
    corpus's place in the stream."""
    position = 0
    for index, corpus in enumerate(data.training_corpora):
        key = corpus_key(data, index)
        found = CorpusRead(corpus, key, start=position)
        for line, pair, score in iter_scored_corpus(corpus, strict, report, key, data.languages_of(corpus)):
            position += 1
            yield index, line, pair, score
        found.end = position
        found.read = found.end - found.start
        if reads is not None:
            reads.append(found)


@dataclass
class CorpusSplit:
    """The training corpora carved three ways: the validation and test pairs in memory, the
    training pairs read again from the corpora whenever they are needed."""

    data: DataConfig
    valid: HeldOut
    test: HeldOut
    roles: np.ndarray  # uint8, one per pair read from the corpora: UNUSED (filtered out), TRAIN, VALID or TEST
    train_count: int
    reads: list[CorpusRead] = field(default_factory=list)  # one per training corpus, in order
    lines: Optional[np.ndarray] = None  # the line (row) each pair of the stream was read from, as roles

    @property
    def read(self) -> int:
        """Pairs read from the training corpora, before the filters."""
        return sum(found.read for found in self.reads)

    @property
    def removals(self) -> Removals:
        """What data.filters dropped, all corpora together."""
        return Removals.merged([found.removals for found in self.reads])

    def train_counts(self) -> list[int]:
        """The training pairs of each corpus."""
        return [int((self.roles[found.start : found.end] == TRAIN).sum()) for found in self.reads]

    def train_pairs(self) -> Iterator[Pair]:
        """The training pairs, in corpus order, read from the corpus files again."""
        return (pair for _, pair in self.train_pairs_by_corpus())

    def train_pairs_by_corpus(self) -> Iterator[tuple[int, Pair]]:
        """(corpus, pair) for each training pair, in corpus order."""
        # Malformed lines were reported (or refused, in strict mode) by the first pass.
        return ((corpus, pair) for role, corpus, pair in self._roles_and_pairs() if role == TRAIN)

    def directed_train_counts(self) -> list[int]:
        """The training pairs of each directed corpus (data.directed_corpora)."""
        counts = self.train_counts()
        return [counts[directed.index] for directed in self.data.directed_corpora]

    def directed_train_pairs(self) -> Iterator[tuple[int, Pair]]:
        """(directed corpus, pair in its direction) for each training pair, in the order the
        directed corpora are stored: corpus after corpus, a reversed one right after its own (read
        again, in its own direction)."""
        for number, directed in enumerate(self.data.directed_corpora):
            for pair in self._corpus_train_pairs(directed.index):
                yield number, (pair[1], pair[0]) if directed.reversed else pair

    def _corpus_train_pairs(self, index: int) -> Iterator[Pair]:
        found = self.reads[index]
        roles = self.roles[found.start : found.end].tobytes()
        languages = self.data.languages_of(found.corpus)
        stream = ((index, pair) for _, pair, _ in iter_scored_corpus(found.corpus, False, None, found.key, languages))
        return (pair for role, _, pair in self._checked(roles, stream) if role == TRAIN)

    def _roles_and_pairs(self) -> Iterator[tuple[int, int, Pair]]:
        stream = ((corpus, pair) for corpus, _, pair, _ in corpus_stream(self.data))
        return self._checked(self.roles.tobytes(), stream)

    def _checked(self, roles: bytes, stream: Iterable[tuple[int, Pair]]) -> Iterator[tuple[int, int, Pair]]:
        """(role, corpus, pair) for the pairs of `stream`, read again, and the roles planned for them."""
        for role, item in itertools.zip_longest(roles, stream):  # iterating bytes gives small ints, fast
            if role is None or item is None:  # the roles were planned for another version of the file
                names = ", ".join(found.key for found in self.reads) or "data.corpus"
                raise DataError(
                    f"a training corpus ({names}) changed while it was being prepared; "
                    f"run the command again once it is written"
                )
            yield role, item[0], item[1]


def split_corpus(data: DataConfig, report: Optional[ReadReport] = None, track: Track = _untracked) -> CorpusSplit:
    """Train/valid/test: separate corpora where configured, otherwise carved off the training
    corpora that have `split: true` (data.corpus when there is one).

    With `data.max_pairs`, a seeded sample of that many pairs (in corpus order: a head slice of a
    length-sorted corpus would hold only short sentences) is split instead of the whole corpus.
    """
    report = report if report is not None else ReadReport()
    reads: list[CorpusRead] = []
    keys, pairs, lines, kept = array("Q"), array("Q"), array("Q"), array("B")
    target_keys = array("Q")  # for corpora read both ways: a held-out target is a source too
    by_pair = data.filters.duplicates == "pair"
    languages = [data.languages_of(corpus) for corpus in data.training_corpora]
    rules_of = {pair: PairRules(data.filters, pair) for pair in languages}  # the script and language rules need them
    corpus_rules = [rules_of[pair] for pair in languages]
    removals = [Removals() for _ in data.training_corpora]
    reversible = any(corpus.reverse for corpus in data.training_corpora)
    stream = corpus_stream(data, data.strict, report, reads)
    what = "reading data.corpus" if not data.corpora else f"reading {len(data.corpora)} corpora"
    # The rules on one pair are applied here, once: later passes read the roles they left.
    least = [corpus.min_score for corpus in data.training_corpora]
    for corpus, line, pair, score in track(stream, what, None):
        rules = corpus_rules[corpus]
        broken = rules.first_broken(*pair) if rules.rules else None
        if broken is None and least[corpus] is not None and score < least[corpus]:
            broken = "score"
        if broken is not None:
            removals[corpus].add(broken, line, pair)
        kept.append(broken is None)
        keys.append(source_key(pair[0]) if broken is None else 0)
        lines.append(line)
        if by_pair:
            pairs.append(pair_key(pair) if broken is None else 0)
        if reversible:
            target_keys.append(source_key(pair[1]) if broken is None else 0)
    for found, removed in zip(reads, removals):
        found.removals = removed
    valid = (
        read_corpus(data.valid_corpus, data.strict, report, "data.valid_corpus", data.languages)
        if data.valid_corpus
        else None
    )
    test = (
        read_corpus(data.test_corpus, data.strict, report, "data.test_corpus", data.languages)
        if data.test_corpus
        else None
    )
    roles = np.where(np.frombuffer(kept, dtype=np.uint8).astype(bool), TRAIN, UNUSED).astype(np.uint8)
    _drop_across_pairs(data, roles, keys, pairs, lines, [*(valid or []), *(test or [])], reads)
    if data.max_pairs is not None and data.max_pairs < int((roles == TRAIN).sum()):
        kept = np.flatnonzero(roles == TRAIN)
        roles[:] = UNUSED
        # Positions into `kept` drawn as random.sample draws from it, without a list of its values.
        chosen = random.Random(data.split_seed).sample(range(len(kept)), data.max_pairs)
        roles[np.sort(kept[np.asarray(chosen, dtype=np.int64)])] = TRAIN
    if valid is not None and test is not None:
        held_out = [(data.languages, pair) for pair in (*valid, *test)]
        _drop_held_out_targets(data, roles, target_keys, held_out, lines, reads)
        return CorpusSplit(
            data,
            by_direction(data, [(data.languages, pair) for pair in valid]),
            by_direction(data, [(data.languages, pair) for pair in test]),
            roles,
            int((roles == TRAIN).sum()),
            reads,
            _lines(lines),
        )

    splittable = np.zeros(len(roles), dtype=bool)
    for found in reads:
        splittable[found.start : found.end] = found.corpus.split
    sampled = np.flatnonzero((roles == TRAIN) & splittable)
    try:
        sides, group_rank = assign_sides(
            np.frombuffer(keys, dtype=np.uint64)[sampled],
            valid_size=0 if valid is not None else data.valid_size,
            test_size=0 if test is not None else data.test_size,
            seed=data.split_seed,
        )
    except DataError as error:  # too few pairs: the lines skipped on the way may say why
        if not report.skipped_count:
            raise
        raise DataError(f"{error}. Reading it, {report.summary()}") from None
    roles[sampled] = sides
    split = CorpusSplit(data, {}, {}, roles, 0, reads, _lines(lines))
    rank = np.zeros(len(roles), dtype=np.int64)
    rank[sampled] = group_rank
    carved = _carved_pairs(split, rank, track)
    if valid is not None:
        carved[VALID] = [(data.languages, pair) for pair in valid]
    if test is not None:
        carved[TEST] = [(data.languages, pair) for pair in test]
    _drop_held_out_targets(data, roles, target_keys, [*carved[VALID], *carved[TEST]], lines, reads)
    return dataclasses.replace(
        split,
        valid=by_direction(data, carved[VALID]),
        test=by_direction(data, carved[TEST]),
        train_count=int((roles == TRAIN).sum()),
    )


def by_direction(data: DataConfig, pairs: Iterable[tuple[Direction, Pair]]) -> HeldOut:
    """Held-out pairs (each with the languages of its corpus) by direction: a pair is scored in each
    of the model's directions between its two languages, swapped for the reverse one. A direction
    without held-out pairs is left out."""
    found: HeldOut = {direction: [] for direction in data.directions}
    for languages, pair in pairs:
        if languages in found:
            found[languages].append(pair)
        if languages.reversed in found and languages.reversed != languages:
            found[languages.reversed].append((pair[1], pair[0]))
    return {direction: pairs for direction, pairs in found.items() if pairs}


def _drop_held_out_targets(
    data: DataConfig,
    roles: np.ndarray,
    target_keys: array,
    held_out: list[tuple[Direction, Pair]],
    lines: array,
    reads: list[CorpusRead],
) -> None:
    """For a corpus read both ways, its targets are sources too: a training pair whose target is
    a held-out pair's side would put a test source into the reverse direction's training."""
    if not len(target_keys) or not held_out:
        return
    withheld = np.array(sorted({source_key(side) for _, pair in held_out for side in pair}), dtype=np.uint64)
    both_ways = np.zeros(len(roles), dtype=bool)
    for found in reads:
        both_ways[found.start : found.end] = found.corpus.reverse
    hit = np.isin(np.frombuffer(target_keys, dtype=np.uint64), withheld) & (roles == TRAIN) & both_ways
    _drop(roles, np.flatnonzero(hit), lines, "held out", reads)


def _lines(lines: array) -> np.ndarray:
    return np.frombuffer(lines, dtype=np.uint64) if len(lines) else np.zeros(0, dtype=np.uint64)


def _drop_across_pairs(
    data: DataConfig,
    roles: np.ndarray,
    keys: array,
    pairs: array,
    lines: array,
    held_out: list[Pair],
    reads: list[CorpusRead],
) -> None:
    """Mark UNUSED the pairs that data.filters drops across pairs: every occurrence of a pair (or of
    a source) but the first, in any corpus, and pairs whose source is a source of a separate valid
    or test corpus."""
    rules = data.filters
    if rules.duplicates != "off" and len(keys):
        candidates = np.flatnonzero(roles == TRAIN)  # the pairs no rule on one pair removed
        seen = np.frombuffer(pairs if rules.duplicates == "pair" else keys, dtype=np.uint64)[candidates]
        first = np.zeros(len(seen), dtype=bool)
        first[np.unique(seen, return_index=True)[1]] = True
        _drop(roles, candidates[~first], lines, "duplicates", reads)
    if rules.held_out and held_out and len(keys):
        withheld = np.array(sorted({source_key(source) for source, _ in held_out}), dtype=np.uint64)
        found = np.isin(np.frombuffer(keys, dtype=np.uint64), withheld) & (roles == TRAIN)
        _drop(roles, np.flatnonzero(found), lines, "held out", reads)


def _drop(roles: np.ndarray, positions: np.ndarray, lines: array, rule: str, reads: list[CorpusRead]) -> None:
    """Mark the pairs at `positions` UNUSED, counted against the corpus each came from."""
    roles[positions] = UNUSED
    for found in reads:
        mine = positions[(positions >= found.start) & (positions < found.end)]
        shown = [lines[position] for position in mine[: found.removals.kept_examples].tolist()]
        found.removals.add_lines(rule, shown, len(mine))


def _carved_pairs(split: CorpusSplit, group_rank: np.ndarray, track: Track) -> dict[int, list[tuple[Direction, Pair]]]:
    """The validation and test pairs (each with its corpus's languages), read in a second pass, in
    the order of their groups in the shuffle: the order an in-memory split of the corpus gives them."""
    found: dict[int, list[tuple[int, int, Direction, Pair]]] = {VALID: [], TEST: []}
    languages = [split.data.languages_of(corpus) for corpus in split.data.training_corpora]
    stream = split._roles_and_pairs()
    for position, (role, corpus, pair) in enumerate(
        track(stream, "finding the validation and test pairs", len(split.roles))
    ):
        if role in found:
            found[role].append((int(group_rank[position]), position, languages[corpus], pair))
    return {role: [(language, pair) for _, _, language, pair in sorted(items)] for role, items in found.items()}


def assign_sides(keys: np.ndarray, valid_size: int, test_size: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """The side (TRAIN, VALID or TEST) of each pair whose source hashes to `keys`, and the rank of
    its group in the shuffle.

    Pairs are grouped by source; the groups, numbered in order of first appearance, are shuffled by
    `random.Random(seed)`; test takes whole groups from the front until it holds at least
    `test_size` pairs, valid the next ones until it holds `valid_size`, and train the rest.
    """
    _, first, inverse = np.unique(keys, return_index=True, return_inverse=True)
    appearance = np.empty(len(first), dtype=np.int64)
    appearance[np.argsort(first, kind="stable")] = np.arange(len(first))
    group = appearance[inverse.reshape(-1)]  # (pairs,) group number in order of first appearance
    sizes = np.bincount(group, minlength=len(first))
    # The permutation depends only on the number of groups and the seed. random.shuffle takes any
    # mutable sequence: an array of 8-byte numbers, not a list of Python ints (36 bytes each).
    order = array("q", range(len(first)))
    random.Random(seed).shuffle(order)
    shuffled = np.frombuffer(order, dtype=np.int64)
    filled = np.cumsum(sizes[shuffled])  # pairs in the first k + 1 shuffled groups
    test_groups = _groups_until(filled, 0, test_size)
    before_valid = int(filled[test_groups - 1]) if test_groups else 0
    valid_groups = _groups_until(filled, before_valid, valid_size) - test_groups if valid_size > 0 else 0
    if test_groups + valid_groups >= len(first):
        raise DataError(
            f"data.valid_size={valid_size} and data.test_size={test_size} leave no training data: "
            f"the corpus has {len(keys)} pairs with {len(first)} distinct source sentences; "
            "lower the sizes or use a larger corpus"
        )
    side_of_group = np.full(len(first), TRAIN, dtype=np.uint8)
    side_of_group[shuffled[:test_groups]] = TEST
    side_of_group[shuffled[test_groups : test_groups + valid_groups]] = VALID
    rank = np.empty(len(first), dtype=np.int64)
    rank[shuffled] = np.arange(len(first))
    return side_of_group[group], rank[group]


def _groups_until(filled: np.ndarray, before: int, size: int) -> int:
    """How many shuffled groups, counted from the start, hold `before` + at least `size` pairs (all, if none do)."""
    if size <= 0:
        return 0
    return min(int(np.searchsorted(filled, before + size, side="left")) + 1, len(filled))


def training_sources(data: DataConfig, direction: Direction, track: Track = _untracked) -> Iterator[str]:
    """The sources of the training pairs in `direction`, as training reads them: the split made
    again, so that no validation or test source is among them (distillation translates these)."""
    split = split_corpus(data, track=track)
    directed = data.directed_corpora
    return (pair[0] for number, pair in split.directed_train_pairs() if directed[number].direction == direction)
