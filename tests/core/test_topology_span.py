"""Topology.span: the one answer to "which tier do these nodes span", and what the KV model makes of it."""

from __future__ import annotations

from pathlib import Path

import pytest

from stormtopo.core.topology.fabric import parse_topology
from stormtopo.core.topology.tree import NodeSpec, Span, Switch, Topology
from stormtopo.kvtransfer import crossed_tier

EXAMPLE = parse_topology((Path(__file__).resolve().parents[2] / "examples" / "topology" / "aibrix-1730.yaml").read_text())
# Two trees side by side: nodes under different roots share no HyperNode.
FOREST = Topology(
    {"a": Switch("a", 1, None, nodes=("x",)), "b": Switch("b", 1, None, nodes=("y",))},
    {"x": NodeSpec("x", "a", 8, "1", "1"), "y": NodeSpec("y", "b", 8, "1", "1")},
)


@pytest.mark.parametrize(
    ("nodes", "span"),
    [
        (["node0", "node0"], Span("s0", 0)),  # one node: no network crossed, its leaf still holds it
        (["node0"], Span("s0", 0)),
        (["node0", "node1"], Span("s0", 1)),
        (["node1", "node2"], Span("s4", 2)),
        (["node0", "node3", "node7"], Span("s6", 3)),
        (["node0", "ghost"], Span(None, None)),  # a node the tree does not know
        ([], Span(None, None)),
    ],
)
def test_span_is_the_lowest_common_hypernode_and_its_tier(nodes: list[str], span: Span) -> None:
    assert EXAMPLE.span(nodes) == span


def test_nodes_under_different_roots_span_nothing() -> None:
    assert FOREST.span(["x", "y"]) == Span(None, None)
    assert FOREST.span(["x"]) == Span("a", 0)


def test_kv_transfer_crosses_the_spanned_tier_or_above_the_tree() -> None:
    assert crossed_tier(EXAMPLE.span(["node1", "node2"]), EXAMPLE.tiers) == 2
    assert crossed_tier(EXAMPLE.span(["node5", "node5"]), EXAMPLE.tiers) == 0
    assert crossed_tier(FOREST.span(["x", "y"]), FOREST.tiers) == 2
