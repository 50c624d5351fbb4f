"""The data checks, from one scan of the corpus (corpus_scan.py): malformed lines, empty sides,
sources in two splits, copies and extreme length ratios."""

from __future__ import annotations

from collections import Counter

from attn_cli.config import Config
from attn_cli.doctor.checks import Check, Examples
from attn_cli.doctor.corpus_scan import CorpusScan

SECTION = "data"
EMPTY_SIDES = ("empty source", "empty target")
# Copies and misaligned pairs happen in any crawled corpus; a few in ten thousand cost nothing
# (the length filter drops most misaligned ones), more teach the model to copy or to ramble.
TOLERATED_SHARE = 0.001
CORPUS_LINE = "data.corpus line"


def data_checks(cfg: Config, scan: CorpusScan) -> list[Check]:
    return [_malformed(scan), _empty_sides(scan), _in_two_splits(scan), _copies(scan), _length_ratios(cfg, scan)]


def _skipped(scan: CorpusScan, empty: bool) -> tuple[Counter, Examples]:
    reasons, places = Counter(), Examples()
    for skipped in scan.report.skipped:
        if (skipped.reason in EMPTY_SIDES) == empty:
            reasons[skipped.reason] += 1
            places.add(f"{skipped.source}:{skipped.line}")
    return reasons, places


def _malformed(scan: CorpusScan) -> Check:
    reasons, places = _skipped(scan, empty=False)
    numbers = {"pairs": scan.pairs, "malformed": dict(reasons)}
    if not reasons:
        return Check(SECTION, "malformed lines", "pass", f"none in {scan.pairs:,} pairs", numbers=numbers)
    counts = ", ".join(f"{count:,} {reason}" for reason, count in reasons.most_common())
    return Check(
        SECTION,
        "malformed lines",
        "warn",
        f"{places.count:,} skipped ({counts}): {', '.join(places.first)}",
        "fix or delete those lines, or set data.strict: true to refuse such a corpus",
        numbers,
    )


def _empty_sides(scan: CorpusScan) -> Check:
    reasons, places = _skipped(scan, empty=True)
    numbers = {"empty": dict(reasons)}
    if not reasons:
        return Check(SECTION, "empty sides", "pass", "no pair with an empty source or target", numbers=numbers)
    counts = ", ".join(f"{count:,} {reason}" for reason, count in reasons.most_common())
    return Check(
        SECTION,
        "empty sides",
        "warn",
        f"{counts} (skipped): {', '.join(places.first)}",
        "fix or delete those lines of data.corpus (an empty side is a lost or misaligned translation)",
        numbers,
    )


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
