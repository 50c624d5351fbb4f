"""What `attn doctor` finds and how it is shown. Each finding is a `Check`: which check, its verdict,
what it found and how to fix it; `failed` says whether the command exits with status 1, and
`Examples` counts something found and keeps the first places it was found at. The report shows the
checks as a Rich table for people, or as JSON for programs. One module, because every check module
builds these records and the command line only shows them."""

from __future__ import annotations

import json
from collections import Counter
from dataclasses import asdict, dataclass, field
from typing import Literal

from rich.console import Console
from rich.markup import escape
from rich.table import Table

Status = Literal["pass", "warn", "fail", "skip"]  # skip: not applicable here, or nothing to check it on


@dataclass(frozen=True)
class Check:
    section: str  # environment, config, memory, data or model
    name: str
    status: Status
    found: str  # what the check saw, in one line
    fix: str = ""  # a config key to set or a command to run; empty when there is nothing to change
    numbers: dict = field(default_factory=dict)  # the measurements behind `found`, for --json

    def as_dict(self) -> dict:
        return asdict(self)


def failed(checks: list[Check]) -> bool:
    """Whether any check failed: the command then exits with status 1 (warnings leave it 0)."""
    return any(check.status == "fail" for check in checks)


@dataclass
class Examples:
    """How many times something was found, and the first few places (line numbers) it was found at."""

    count: int = 0
    first: list = field(default_factory=list)
    keep: int = 5

    def add(self, where) -> None:
        self.count += 1
        if len(self.first) < self.keep:
            self.first.append(where)

    def places(self, prefix: str = "line") -> str:
        """ "lines 3, 17, 40 and 2 more" (empty when there are none)."""
        if not self.count:
            return ""
        shown = ", ".join(str(where) for where in self.first)
        more = f" and {self.count - len(self.first):,} more" if self.count > len(self.first) else ""
        return f"{prefix}{'s' if self.count > 1 else ''} {shown}{more}"


# The report: a Rich table for people, or JSON for programs.

_STYLES = {"pass": "green", "warn": "yellow", "fail": "bold red", "skip": "dim"}


def print_table(checks: list[Check], console: Console) -> None:
    """One row per check; the fix only where there is something to do, and no fix column when
    there is nothing to do anywhere."""
    table = Table(header_style="bold")
    with_fixes = any(check.status != "pass" for check in checks)
    for column in ("section", "check", "status", "found") + (("fix",) if with_fixes else ()):
        table.add_column(column, overflow="fold")
    previous = None
    for check in checks:
        section = check.section if check.section != previous else ""
        previous = check.section
        row = [section, escape(check.name), f"[{_STYLES[check.status]}]{check.status}[/]", escape(check.found)]
        if with_fixes:
            row.append(escape(check.fix) if check.status != "pass" else "")
        table.add_row(*row)
    console.print(table)
    console.print(summary(checks), highlight=False)


def summary(checks: list[Check]) -> str:
    counts = Counter(check.status for check in checks)
    parts = [
        f"{counts[status]} {word}"
        for status, word in (("pass", "passed"), ("warn", "warned"), ("fail", "failed"), ("skip", "skipped"))
        if counts[status]
    ]
    return f"{len(checks)} checks: {', '.join(parts)}"


def as_json(checks: list[Check]) -> str:
    return json.dumps(
        {
            "failed": any(c.status == "fail" for c in checks),
            "summary": summary(checks),
            "checks": [check.as_dict() for check in checks],
        },
        indent=1,
        ensure_ascii=False,
    )
