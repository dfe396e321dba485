"""The switch tree as a PNG (matplotlib): one panel per placement, the prefill-decode path drawn in."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from stormtopo.core.topology.tree import Topology


@dataclass(frozen=True)
class PairPlacement:
    title: str
    prefill_node: str
    decode_node: str
    crossing: str  # e.g. "s2 (tier 1)"
    kv_ms: float


def _layout(topology: Topology) -> dict[str, tuple[float, float]]:
    """Nodes evenly along the bottom, every switch centred over what it holds, one row per tier."""
    order: list[str] = []

    def walk(switch: str) -> None:
        s = topology.switches[switch]
        for child in s.children:
            walk(child)
        order.extend(s.nodes)

    for root in sorted(s.name for s in topology.switches.values() if s.parent is None):
        walk(root)
    pos = {node: (float(i), 0.0) for i, node in enumerate(order)}
    for switch in sorted(topology.switches.values(), key=lambda s: s.tier):
        xs = [pos[n][0] for n in topology.nodes_under(switch.name) if n in pos]
        pos[switch.name] = (sum(xs) / len(xs), float(switch.tier))
    return pos


def draw(topology: Topology, placements: Sequence[PairPlacement], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    pos = _layout(topology)
    fig, axes = plt.subplots(1, len(placements), figsize=(7 * len(placements), 4.8), squeeze=False)
    for ax, placement in zip(axes[0], placements, strict=True):
        for switch in topology.switches.values():
            for member in (*switch.children, *switch.nodes):
                (x0, y0), (x1, y1) = pos[switch.name], pos[member]
                ax.plot([x0, x1], [y0, y1], color="#bbbbbb", zorder=1)
        pd_path = set(_path(topology, placement.prefill_node, placement.decode_node))
        for a, b in _edges(topology, pd_path):
            (x0, y0), (x1, y1) = pos[a], pos[b]
            ax.plot([x0, x1], [y0, y1], color="#d62728", linewidth=3, zorder=2)
        for name, (x, y) in pos.items():
            is_node = name in topology.nodes
            color = "#ffffff"
            if name == placement.prefill_node == placement.decode_node:
                color = "#9467bd"
            elif name == placement.prefill_node:
                color = "#2ca02c"
            elif name == placement.decode_node:
                color = "#ff7f0e"
            ax.scatter([x], [y], s=900 if is_node else 700, c=color, edgecolors="#333333", marker="s" if is_node else "o", zorder=3)
            ax.text(x, y, name, ha="center", va="center", fontsize=8, zorder=4)
        ax.set_title(f"{placement.title}\nP on {placement.prefill_node}, D on {placement.decode_node}: via {placement.crossing}")
        ax.text(0.5, -0.08, f"modeled KV-cache transfer per request: {placement.kv_ms:.1f} ms", transform=ax.transAxes, ha="center")
        ax.set_ylim(-0.6, topology.tiers + 0.6)
        ax.axis("off")
    fig.suptitle("Prefill (green) and decode (orange) pods, purple when on one node; red: the path the KV cache takes")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def _path(topology: Topology, a: str, b: str) -> list[str]:
    """The nodes and switches the KV cache passes from `a` to `b`: up to their lowest common switch and down."""
    span = topology.span([a, b])
    if span.tier == 0:
        return [a]
    up_a = [a, *topology.ancestors(a)]
    up_b = [b, *topology.ancestors(b)]
    if span.hypernode is None:
        return up_a + up_b
    return up_a[: up_a.index(span.hypernode) + 1] + up_b[: up_b.index(span.hypernode)]


def _edges(topology: Topology, on_path: set[str]) -> list[tuple[str, str]]:
    edges = []
    for switch in topology.switches.values():
        for member in (*switch.children, *switch.nodes):
            if switch.name in on_path and member in on_path:
                edges.append((switch.name, member))
    return edges
