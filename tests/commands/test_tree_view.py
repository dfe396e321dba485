"""Snapshot of the terminal tree drawing (rich), for a fixed tree and load."""

from __future__ import annotations

import os
from pathlib import Path

from rich.console import Console

from stormtopo.core.topology.fabric import parse_topology
from stormtopo.view.tree import topology_tree

HERE = Path(__file__).resolve().parent
EXAMPLE = parse_topology((HERE.parents[1] / "examples" / "topology" / "aibrix-1730.yaml").read_text())


def test_tree_drawing_matches_the_snapshot() -> None:
    total = {n: 8 for n in EXAMPLE.nodes}
    free = total | {"node0": 1, "node2": 1, "node5": 0}
    marks = {"node5": ["P pd-hard", "D pd-hard"], "node0": ["P pd-plain"], "node2": ["D pd-plain"]}
    console = Console(width=100, record=True, color_system=None, force_terminal=False)
    console.print(topology_tree(EXAMPLE, free, total, marks, title="cluster", highlight=["s2"]))
    drawn = console.export_text()
    snapshot = HERE / "snapshots" / "tree.txt"
    if os.environ.get("UPDATE_SNAPSHOTS"):  # after a deliberate change to the drawing: review, then commit
        snapshot.write_text(drawn)
    assert drawn == snapshot.read_text()
