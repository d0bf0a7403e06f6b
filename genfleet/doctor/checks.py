"""The result every doctor check returns: what was checked, how it went, what was seen and, when it
did not pass, the one thing to change. A check never raises for what it finds; a finding is a row.
"""
from __future__ import annotations

from collections.abc import Iterable
from dataclasses import asdict, dataclass
from enum import Enum
from typing import Any


class Status(str, Enum):
    OK = "ok"
    # The run can go ahead, but something deserves a look (an unbounded Redis, a clock a second off).
    WARN = "warn"
    # The run would lose prompts, waste GPU time or write wrong records: fix it first.
    FAIL = "fail"


@dataclass(frozen=True)
class Check:
    name: str
    status: Status
    detail: str
    # One line saying what to change; empty when there is nothing to change.
    fix: str = ""

    def to_dict(self) -> dict[str, Any]:
        return {**asdict(self), "status": self.status.value}


def ok(name: str, detail: str) -> Check:
    return Check(name, Status.OK, detail)


def warn(name: str, detail: str, fix: str) -> Check:
    return Check(name, Status.WARN, detail, fix)


def fail(name: str, detail: str, fix: str) -> Check:
    return Check(name, Status.FAIL, detail, fix)


def passed(checks: Iterable[Check]) -> bool:
    """Warnings pass; one failure does not."""
    return all(check.status is not Status.FAIL for check in checks)
