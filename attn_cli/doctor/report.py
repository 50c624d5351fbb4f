"""The checks shown: a Rich table for people, or JSON for programs."""

from __future__ import annotations

import json
from collections import Counter

from rich.console import Console
from rich.markup import escape
from rich.table import Table

from attn_cli.doctor.checks import Check

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
