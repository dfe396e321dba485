"""The switch tree in the terminal (rich): free/total GPUs per HyperNode and node, and who sits where."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from rich.text import Text
from rich.tree import Tree

from stormtopo.core.topology.tree import Topology


def _gpus(free: int, total: int) -> str:
    return f"{free}/{total} GPUs free"


def topology_tree(
    topology: Topology,
    free: Mapping[str, int],
    total: Mapping[str, int],
    marks: Mapping[str, Sequence[str]] | None = None,
    title: str = "cluster",
    highlight: Sequence[str] = (),
) -> Tree:
    """A rich Tree of the switches and nodes; `marks` lists labels (e.g. "P pd-hard") per node and
    `highlight` names switches to emphasise (e.g. a replica's lowest common HyperNode)."""
    marks = marks or {}
    root = Tree(Text(title, style="bold"))

    def add(parent: Tree, switch: str) -> None:
        s = topology.switches[switch]
        nodes = topology.nodes_under(switch)
        label = Text(f"{switch}", style="bold magenta" if switch in highlight else "bold")
        tier_name = topology.tier_names.get(s.tier)
        label.append(f"  tier {s.tier}{f' ({tier_name})' if tier_name else ''}  ", style="dim")
        label.append(_gpus(sum(free.get(n, 0) for n in nodes), sum(total.get(n, 0) for n in nodes)))
        branch = parent.add(label)
        for child in s.children:
            add(branch, child)
        for node in s.nodes:
            text = Text(f"{node}  ", style="cyan")
            text.append(_gpus(free.get(node, 0), total.get(node, 0)), style="dim")
            for mark in marks.get(node, ()):
                text.append(f"  {mark}", style="bold green" if mark.startswith("P") else "bold yellow")
            branch.add(text)

    for name in sorted(s.name for s in topology.switches.values() if s.parent is None):
        add(root, name)
    return root
