"""One finding of `attn doctor`: which check, its verdict, what it found and how to fix it."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Literal

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
