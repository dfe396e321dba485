"""What a check of `stormtopo doctor` finds: one line each, a level (ok, warning, error), the check's name, what
was found and what to do; the exit code they add up to; and how a finding lists names and counts them."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from enum import StrEnum

LISTED = 5  # names quoted per finding; the rest are counted


class Level(StrEnum):
    OK = "ok"
    WARNING = "warning"
    ERROR = "error"


@dataclass(frozen=True)
class Finding:
    level: Level
    check: str
    found: str
    todo: str = ""  # what to do; empty for ok


def _names(items: Sequence[str], limit: int = LISTED) -> str:
    shown = ", ".join(items[:limit])
    return shown + (f" and {len(items) - limit} more" if len(items) > limit else "")


def _plural(count: int, word: str) -> str:
    return f"{count} {word}" if count == 1 else f"{count} {word}s"


def exit_code(findings: Iterable[Finding]) -> int:
    """0 when no finding is an error, 1 otherwise."""
    return 1 if any(f.level is Level.ERROR for f in findings) else 0
