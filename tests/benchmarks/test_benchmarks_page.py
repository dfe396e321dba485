"""BENCHMARKS.md quotes only figures its results files hold (pure: reads the page and bench/results/).

The page's convention: a table with a `results` column is a table of figures. In each of its rows the
results cell links one file under bench/results/, the command cell is a `python -m bench` command line
that parses, and every number in the `figure` and `anchor` cells is in that file, at the precision it is
written with (0.990 is any value within 0.0005 of it; an integer must be equal). Numbers in `code` are
not figures. Other columns (the question) are free text.
"""

from __future__ import annotations

import json
import re
import shlex
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from bench import cli

ROOT = Path(__file__).resolve().parents[2]
PAGE = ROOT / "BENCHMARKS.md"

# 1,055.05 and 2956.044 and 46, not the 99 of p99 nor the 1 of tier1 or 16c4bcb.
NUMBER = re.compile(r"(?<![\w.,])(\d{1,3}(?:,\d{3})+(?:\.\d+)?|\d+(?:\.\d+)?)(?![\w])")
LINK = re.compile(r"\]\((bench/results/[^)\s]+)\)")


@dataclass(frozen=True)
class Row:
    line: int
    results: str
    command: str
    figures: tuple[str, ...]  # the figure and anchor cells


def _cells(line: str) -> list[str]:
    return [cell.strip() for cell in line.strip().strip("|").split("|")]


def rows(text: str) -> Iterator[Row]:
    lines = text.splitlines()
    header: list[str] | None = None
    for number, line in enumerate(lines, 1):
        if not line.startswith("|"):
            header = None
            continue
        cells = _cells(line)
        if header is None:
            header = [c.lower() for c in cells]
            continue
        if set(line) <= set("|-: "):
            continue
        if "results" not in header:
            continue
        named = dict(zip(header, cells, strict=True))
        figures = tuple(named[c] for c in header if c.startswith(("figure", "anchor")))
        yield Row(number, named["results"], named.get("command", ""), figures)


def numbers(text: str) -> list[str]:
    """The numbers written in a cell, as written (code spans left out)."""
    return NUMBER.findall(re.sub(r"`[^`]*`", "", text))


def _leaves(value: Any) -> Iterator[float]:
    if isinstance(value, bool) or value is None:
        return
    if isinstance(value, int | float):
        yield float(value)
    elif isinstance(value, str):
        yield from (float(n.replace(",", "")) for n in NUMBER.findall(value))
    elif isinstance(value, dict):
        for item in value.values():
            yield from _leaves(item)
    elif isinstance(value, list):
        for item in value:
            yield from _leaves(item)


def values_in(path: Path) -> set[float]:
    text = path.read_text()
    if path.suffix == ".json":
        return set(_leaves(json.loads(text)))
    return {float(n.replace(",", "")) for n in NUMBER.findall(text)}


def present(written: str, values: set[float]) -> bool:
    wanted = float(written.replace(",", ""))
    decimals = len(written.partition(".")[2])
    if not decimals:
        return wanted in values
    half = 0.5 * 10**-decimals + 1e-9
    return any(abs(v - wanted) <= half for v in values)


def problems(text: str, root: Path = ROOT) -> list[str]:
    """What is wrong with the page's tables of figures; empty when nothing is."""
    found: list[str] = []
    cache: dict[Path, set[float]] = {}
    for row in rows(text):
        links = LINK.findall(row.results)
        if len(links) != 1:
            found.append(f"line {row.line}: the results cell links {len(links)} files under bench/results/, not one")
            continue
        path = root / links[0]
        if not path.is_file():
            found.append(f"line {row.line}: {links[0]} does not exist")
            continue
        if path not in cache:
            cache[path] = values_in(path)
        for cell in row.figures:
            for written in numbers(cell):
                if not present(written, cache[path]):
                    found.append(f"line {row.line}: {written} is not in {links[0]}")
        if not row.figures or not any(numbers(cell) for cell in row.figures):
            found.append(f"line {row.line}: no figure")
        if not re.search(r"`python -m bench[^`]*`", row.command):
            found.append(f"line {row.line}: the command {row.command!r} is not `python -m bench ...`")
    return found


def test_every_figure_is_in_the_results_file_its_row_names() -> None:
    assert problems(PAGE.read_text()) == []


def test_every_command_on_the_page_parses() -> None:
    parser = cli.build_parser()
    commands = {re.search(r"`(python -m bench[^`]*)`", row.command) for row in rows(PAGE.read_text())}
    assert None not in commands
    for match in commands:
        assert match is not None
        argv = shlex.split(match.group(1))[3:]
        parser.parse_args(cli.canonical(argv))  # exits (fails the test) on an unknown subcommand or option


def test_the_page_has_a_table_per_question() -> None:
    text = PAGE.read_text()
    for question in ("Placement quality", "Packing", "Node tier", "Healing", "Admission latency", "Scale", "Memory"):
        assert f"\n## {question}\n" in text
    assert sum(1 for _ in rows(text)) >= 30


PAGE_WITH = """
| question | figure | anchor | results | command |
|---|---|---|---|---|
| 256 nodes, tier 1 | {figure} | no topology: 0.4833 | [f.json](bench/results/f.json) | `python -m bench full` |
"""


@pytest.mark.parametrize(
    ("figure", "wrong"),
    [
        ("1.0 (2.0166\u00d7)", []),
        ("2.02\u00d7; 2.017", []),  # rounded to the precision written
        ("2.03\u00d7", ["2.03"]),  # a deliberately wrong number
        ("1,055.05 ms", []),
        ("1,055.1 ms", []),
        ("1,056 ms", ["1,056"]),
        ("61 of 60", ["61"]),  # an integer is exact
        ("p99 `--seed 7` 60", []),  # neither p99's 99 nor code counts
    ],
)
def test_a_number_not_in_the_file_is_found(tmp_path: Path, figure: str, wrong: list[str]) -> None:
    (tmp_path / "bench" / "results").mkdir(parents=True)
    result = {"placement": {"hard": {"placed": 60, "ratio": 2.0166, "one": 1.0}, "baseline": 0.4833}, "p99_ms": 1055.05}
    (tmp_path / "bench" / "results" / "f.json").write_text(json.dumps(result))
    assert problems(PAGE_WITH.format(figure=figure), tmp_path) == [f"line 4: {w} is not in bench/results/f.json" for w in wrong]


def test_a_row_without_its_file_is_found(tmp_path: Path) -> None:
    assert problems(PAGE_WITH.format(figure="1.0"), tmp_path) == ["line 4: bench/results/f.json does not exist"]
