"""The image's locks, as `uv pip compile --generate-hashes` writes them (`make lock`): pins, hashes and `# via`
lines. operator.lock pins pyproject.toml's dependencies (what the image runs), build.lock its build-system
requires (what builds the wheel; compiled from standard input, so its direct pins have no `# via`)."""

from __future__ import annotations

import re
import shlex
import tomllib
from dataclasses import dataclass
from pathlib import Path

from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

from tests.conftest import REPO

OPERATOR = REPO / "requirements" / "operator.lock"
BUILD = REPO / "requirements" / "build.lock"
PYPROJECT = "stormtopo (pyproject.toml)"  # how a `# via` line names the project's own dependencies


@dataclass(frozen=True)
class Pin:
    name: str  # canonical
    version: str
    hashes: frozenset[str]
    via: frozenset[str]  # canonical names of what requires it, or PYPROJECT


def read(text: str) -> dict[str, Pin]:
    """The pins of a lock; a line that is neither a pin, a hash nor a comment is refused."""
    pins: list[tuple[str, str, set[str], set[str]]] = []  # name, version, hashes, via
    for line in text.splitlines():
        stripped = line.strip().rstrip("\\").strip()
        if not stripped or (stripped.startswith("#") and not pins):
            continue  # the header
        pin = re.fullmatch(r"([A-Za-z0-9._-]+)==(\S+)", stripped)
        if pin and not line.startswith(" "):
            pins.append((canonicalize_name(pin.group(1)), pin.group(2), set(), set()))
        elif stripped.startswith("--hash=sha256:"):
            pins[-1][2].add(stripped.removeprefix("--hash=sha256:"))
        elif stripped.startswith("#"):
            via = stripped.lstrip("#").strip().removeprefix("via").strip()
            if via:
                pins[-1][3].add(via if via == PYPROJECT else canonicalize_name(via))
        else:
            raise ValueError(f"not a pinned, hashed requirement: {line!r}")
    return {name: Pin(name, version, frozenset(hashes), frozenset(via)) for name, version, hashes, via in pins}


def command(text: str) -> list[str]:
    """The `uv pip compile ...` command the header records."""
    line = next(line for line in text.splitlines() if line.startswith("#    uv pip compile "))
    return shlex.split(line.removeprefix("#"))


def locked(path: Path) -> list[Requirement]:
    """What a lock pins, as pyproject.toml asks for it: the [project] dependencies (never the extras) for
    operator.lock, the build-system requires for build.lock."""
    pyproject = tomllib.loads((REPO / "pyproject.toml").read_text())
    asked = pyproject["project"]["dependencies"] if path == OPERATOR else pyproject["build-system"]["requires"]
    return [Requirement(r) for r in asked]
