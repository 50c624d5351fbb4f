"""The data checks (malformed lines, empty sides, sources in two splits, copies and extreme length
ratios) and the one pass over the training corpus, read as a stream, that they are computed from.
The pass also counts how often each vocabulary piece occurs, for the config's vocabulary check:
from the run's prepared data when it has some (the training pairs exactly, after the split and the
length filters), else by tokenizing the corpus a chunk at a time. Per pair it keeps only a length
ratio and a line number (12 bytes; the typical ratio is known only at the end) and, with held-out
corpora of their own, the hashes of their source sentences."""

from __future__ import annotations

import itertools
import math
from array import array
from collections import Counter
from dataclasses import dataclass, field
from typing import Iterable, Iterator, Optional

import numpy as np

from attn_cli.config import Config, CorpusConfig
from attn_cli.data.corpus import Pair, ReadReport, iter_numbered_corpus
from attn_cli.data.prepared import PreparedData
from attn_cli.data.split import corpus_key, source_key
from attn_cli.data.tokenizer import Tokenizers
from attn_cli.doctor.checks import Check, Examples

# The corpus scan: one pass over data.corpus, and the piece counts.

_ENCODE_CHUNK = 20_000  # pairs tokenized at a time: SentencePiece's threads busy, memory small


@dataclass
class TokenCounts:
    """How often each piece occurs in the training text, and how long its pairs are in tokens."""

    counts: dict[str, np.ndarray]  # "joint" for a joint vocabulary, else "source" and "target": occurrences per id
    longest_source: int  # tokens, without EOS
    longest_target: int
    over_length_limits: int  # pairs longer than data.max_source_tokens or max_target_tokens
    origin: str  # where the counts come from, for the report

    @property
    def tokens(self) -> int:
        return int(sum(counts.sum() for counts in self.counts.values()))


@dataclass
class CorpusScan:
    pairs: int  # pairs read from data.corpus
    report: ReadReport  # its malformed lines
    copies: Examples  # pairs whose target is their source
    length_outliers: Examples  # pairs whose length ratio is far from the corpus's typical one
    typical_ratio: float  # the median of source characters per target character
    # Pairs of data.corpus whose source is also a source of data.valid_corpus or data.test_corpus,
    # by held-out corpus, and the held-out corpora's common sources; empty when both are carved
    # off data.corpus, which keeps every source on one side.
    overlaps: dict[str, Examples] = field(default_factory=dict)
    tokens: Optional[TokenCounts] = None


def scan_corpus(cfg: Config, tokenizers: Optional[Tokenizers], prepared: Optional[PreparedData]) -> CorpusScan:
    """Read data.corpus once; raises DataError when it cannot be read."""
    data = cfg.data
    report = ReadReport()
    held_out = {
        name: _source_keys(corpus, f"data.{name}_corpus", data.languages)
        for name, corpus in (("valid", data.valid_corpus), ("test", data.test_corpus))
        if corpus is not None
    }
    overlaps = {name: Examples() for name in held_out}
    copies, log_ratios, lines = Examples(), array("f"), array("q")
    counter = _CorpusTokenCounter(cfg, tokenizers) if tokenizers is not None and prepared is None else None
    pairs = 0
    # Several corpora are read one after the other, their lines numbered each in its own file.
    stream = itertools.chain.from_iterable(
        iter_numbered_corpus(corpus, False, report, corpus_key(data, index), data.languages)
        for index, corpus in enumerate(data.training_corpora)
    )
    for line, (source, target) in stream:
        pairs += 1
        if source == target:
            copies.add(line)
        log_ratios.append(math.log(len(source) / len(target)))  # neither side is empty: the readers skip those
        lines.append(line)
        if held_out:
            key = source_key(source)
            for name, keys in held_out.items():
                if key in keys:
                    overlaps[name].add(line)
        if counter is not None:
            counter.add(source, target)
    if len(held_out) == 2:
        overlaps["valid and test"] = _common_sources(data.valid_corpus, held_out["test"], data.languages)
    typical, outliers = _length_outliers(np.frombuffer(log_ratios, dtype=np.float32), lines, data.max_length_ratio)
    tokens = (
        prepared_token_counts(tokenizers, prepared)
        if prepared is not None and tokenizers is not None
        else counter.finish(pairs)
        if counter is not None
        else None
    )
    return CorpusScan(pairs, report, copies, outliers, typical, overlaps, tokens)


def _source_keys(corpus: CorpusConfig, key: str, languages: tuple[str, str]) -> set[int]:
    return {source_key(source) for _, (source, _) in iter_numbered_corpus(corpus, config_key=key, languages=languages)}


def _common_sources(valid: CorpusConfig, test_keys: set[int], languages: tuple[str, str]) -> Examples:
    """Lines of data.valid_corpus whose source is also a source of data.test_corpus."""
    common = Examples()
    for line, (source, _) in iter_numbered_corpus(valid, config_key="data.valid_corpus", languages=languages):
        if source_key(source) in test_keys:
            common.add(line)
    return common


def _length_outliers(log_ratios: np.ndarray, lines: array, factor: float) -> tuple[float, Examples]:
    """The typical length ratio (characters of source per character of target: languages differ,
    English has some 3 characters per Chinese one), and the pairs more than `factor`
    (data.max_length_ratio) times longer or shorter than it: likely misaligned."""
    outliers = Examples()
    if not len(log_ratios):
        return 1.0, outliers
    typical = float(np.median(log_ratios))
    flagged = np.flatnonzero(np.abs(log_ratios - typical) > math.log(factor))
    outliers.count = len(flagged)
    outliers.first = [lines[int(position)] for position in flagged[: outliers.keep]]
    return math.exp(typical), outliers


def prepared_token_counts(tokenizers: Tokenizers, prepared: PreparedData) -> TokenCounts:
    """Piece counts of the training pairs exactly as they are trained on."""
    train, stats = prepared.train, prepared.stats
    counts = _by_vocabulary(
        tokenizers,
        np.bincount(train.src_ids, minlength=tokenizers.source.vocab_size),
        np.bincount(train.tgt_ids, minlength=tokenizers.target.vocab_size),
    )
    return TokenCounts(
        counts,
        int(stats["source_tokens"].get("max", 0)),
        int(stats["target_tokens"].get("max", 0)),
        int(stats.get("dropped_by_length", 0)),
        f"the prepared training pairs ({prepared.directory})",
    )


def _by_vocabulary(tokenizers: Tokenizers, source: np.ndarray, target: np.ndarray) -> dict[str, np.ndarray]:
    if tokenizers.joint:
        return {"joint": source + target}
    return {"source": source, "target": target}


class _CorpusTokenCounter:
    """Piece counts of a corpus read as a stream: pairs are tokenized a chunk at a time."""

    def __init__(self, cfg: Config, tokenizers: Tokenizers):
        self.cfg, self.tokenizers = cfg, tokenizers
        self.pending: list[Pair] = []
        self.source = np.zeros(tokenizers.source.vocab_size, dtype=np.int64)
        self.target = np.zeros(tokenizers.target.vocab_size, dtype=np.int64)
        self.longest_source = self.longest_target = self.over_limits = 0

    def add(self, source: str, target: str) -> None:
        self.pending.append((source, target))
        if len(self.pending) >= _ENCODE_CHUNK:
            self._count()

    def _count(self) -> None:
        data = self.cfg.data
        first_target = next(iter(self.tokenizers.target_tags), None)  # one lead token, whichever target
        sources = self.tokenizers.encode_sources([pair[0] for pair in self.pending], first_target)
        targets = self.tokenizers.target.encode([pair[1] for pair in self.pending])
        self.pending = []
        for counts, rows in ((self.source, sources), (self.target, targets)):
            counts += np.bincount(np.fromiter(_flat(rows), dtype=np.int64), minlength=len(counts))
        for source, target in zip(sources, targets):
            self.longest_source = max(self.longest_source, len(source))
            self.longest_target = max(self.longest_target, len(target))
            self.over_limits += len(source) > data.max_source_tokens or len(target) > data.max_target_tokens

    def finish(self, pairs: int) -> TokenCounts:
        self._count()
        origin = "the whole corpus, tokenized"
        source, target = self.source, self.target
        sample = self.cfg.data.max_pairs
        if sample is not None and sample < pairs:
            # Training sees a sample of max_pairs pairs: expect each piece that share as often.
            source, target = source * (sample / pairs), target * (sample / pairs)
            origin += f", scaled to the data.max_pairs={sample:,} sample"
        return TokenCounts(
            _by_vocabulary(self.tokenizers, source, target),
            self.longest_source,
            self.longest_target,
            self.over_limits,
            origin,
        )


def _flat(rows: Iterable[list[int]]) -> Iterator[int]:
    return itertools.chain.from_iterable(rows)


# The data checks, on the scan.

SECTION = "data"
EMPTY_SIDES = ("empty source", "empty target")
# Copies and misaligned pairs happen in any crawled corpus; a few in ten thousand cost nothing
# (the length filter drops most misaligned ones), more teach the model to copy or to ramble.
TOLERATED_SHARE = 0.001
CORPUS_LINE = "data.corpus line"


def data_checks(cfg: Config, scan: CorpusScan) -> list[Check]:
    return [
        _skipped_lines(scan, empty=False),
        _skipped_lines(scan, empty=True),
        _in_two_splits(scan),
        _copies(scan),
        _length_ratios(cfg, scan),
    ]


def _skipped_lines(scan: CorpusScan, empty: bool) -> Check:
    """The lines the reader skipped: malformed ones, or (`empty`) pairs with an empty side."""
    reasons = Counter({reason: n for reason, n in scan.report.reasons.items() if (reason in EMPTY_SIDES) == empty})
    places = Examples()
    for skipped in scan.report.skipped:
        if (skipped.reason in EMPTY_SIDES) == empty:
            places.add(f"{skipped.source}:{skipped.line}")
    places.count = sum(reasons.values())  # the report keeps the first lines, and counts them all
    counts = ", ".join(f"{count:,} {reason}" for reason, count in reasons.most_common())
    if empty:
        name, numbers, clean = "empty sides", {"empty": dict(reasons)}, "no pair with an empty source or target"
        found = f"{counts} (skipped): {', '.join(places.first)}"
        fix = "fix or delete those lines of data.corpus (an empty side is a lost or misaligned translation)"
    else:
        name, clean = "malformed lines", f"none in {scan.pairs:,} pairs"
        numbers = {"pairs": scan.pairs, "malformed": dict(reasons)}
        found = f"{places.count:,} skipped ({counts}): {', '.join(places.first)}"
        fix = "fix or delete those lines, or set data.strict: true to refuse such a corpus"
    if not reasons:
        return Check(SECTION, name, "pass", clean, numbers=numbers)
    return Check(SECTION, name, "warn", found, fix, numbers)


def _in_two_splits(scan: CorpusScan) -> Check:
    if not scan.overlaps:
        return Check(
            SECTION,
            "sources in two splits",
            "pass",
            "validation and test are carved off data.corpus by source sentence: no source is in two splits",
        )
    found = [
        f"{examples.count:,} pairs of data.corpus share a source with data.{name}_corpus"
        + (f" ({examples.places(CORPUS_LINE)})" if examples.count else "")
        for name, examples in scan.overlaps.items()
        if name != "valid and test"
    ]
    common = scan.overlaps.get("valid and test")
    if common is not None:
        found.append(
            f"{common.count:,} sources of data.valid_corpus are in data.test_corpus"
            + (f" ({common.places('data.valid_corpus line')})" if common.count else "")
        )
    numbers = {name: examples.count for name, examples in scan.overlaps.items()}
    if not any(numbers.values()):
        return Check(SECTION, "sources in two splits", "pass", "; ".join(found), numbers=numbers)
    return Check(
        SECTION,
        "sources in two splits",
        "fail",
        "; ".join(found) + ": held-out scores would be inflated",
        "remove those pairs from data.corpus (or from data.valid_corpus / data.test_corpus)",
        numbers,
    )


def _share(examples: Examples, scan: CorpusScan) -> str:
    return f"{examples.count:,} of {scan.pairs:,} pairs ({examples.count / max(scan.pairs, 1):.2%})"


def _copies(scan: CorpusScan) -> Check:
    numbers = {"copies": scan.copies.count}
    found = f"{_share(scan.copies, scan)} have the source as target" + (
        f": {scan.copies.places(CORPUS_LINE)}" if scan.copies.count else ""
    )
    if scan.copies.count > TOLERATED_SHARE * scan.pairs:
        return Check(
            SECTION,
            "copies",
            "warn",
            found,
            "remove those pairs from data.corpus: they teach the model to copy its input",
            numbers,
        )
    return Check(SECTION, "copies", "pass", found, numbers=numbers)


def _length_ratios(cfg: Config, scan: CorpusScan) -> Check:
    outliers = scan.length_outliers
    factor = cfg.data.max_length_ratio
    numbers = {"outliers": outliers.count, "typical_ratio": round(scan.typical_ratio, 3)}
    found = (
        f"{_share(outliers, scan)} are over {factor:g}x longer or shorter than the typical "
        f"{scan.typical_ratio:.2f} source characters per target character"
        + (f": {outliers.places(CORPUS_LINE)}" if outliers.count else "")
    )
    if outliers.count > TOLERATED_SHARE * scan.pairs:
        return Check(
            SECTION,
            "length ratios",
            "warn",
            found,
            "check those lines for misaligned pairs and remove them "
            "from data.corpus (data.max_length_ratio drops pairs by token ratio)",
            numbers,
        )
    return Check(SECTION, "length ratios", "pass", found, numbers=numbers)
