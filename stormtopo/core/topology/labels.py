"""The tree that node labels describe, as Volcano's label-based HyperNode discovery reads them."""

from __future__ import annotations

from collections.abc import Mapping

from stormtopo.core.topology.tree import NAME_RULE, NodeSpec, Switch, Topology, TopologyError, is_name


def topology_from_labels(
    node_labels: Mapping[str, Mapping[str, str]], levels: list[str], gpus: Mapping[str, int] | None = None
) -> Topology:
    """The tree node labels describe, as Volcano's label discovery reads them: `levels` top-down, the last
    label naming a node's leaf switch (tier 1). Nodes without every label are left out, as Volcano does."""
    if not levels:
        raise TopologyError("--levels needs at least one node label, top tier first")
    if len(set(levels)) != len(levels):
        raise TopologyError(f"--levels names a label twice: {levels}")
    depth = len(levels)
    parent_of: dict[str, tuple[str | None, str]] = {}  # switch -> (parent, the node that showed it)
    tier_of: dict[str, int] = {}
    members: dict[str, list[str]] = {}
    nodes: dict[str, NodeSpec] = {}
    for node in sorted(node_labels):
        labels = node_labels[node]
        if any(level not in labels for level in levels):
            continue
        chain = [labels[level] for level in levels]  # top first
        for i, value in enumerate(chain):
            tier = depth - i
            if not is_name(value):
                raise TopologyError(f"node {node}: label {levels[i]}={value!r} cannot name a HyperNode; accepted: {NAME_RULE}")
            if tier_of.setdefault(value, tier) != tier:
                raise TopologyError(
                    f"node {node}: {value!r} is a value of {levels[i]} and of another level; HyperNode names must be unique"
                )
            parent = chain[i - 1] if i else None
            seen_parent, witness = parent_of.setdefault(value, (parent, node))
            if seen_parent != parent:
                raise TopologyError(
                    f"{levels[i]}={value!r} has two parents: {seen_parent!r} (node {witness}) and {parent!r} (node {node}); "
                    "a HyperNode has one parent"
                )
        members.setdefault(chain[-1], []).append(node)
        nodes[node] = NodeSpec(node, chain[-1], (gpus or {}).get(node, 0), "0", "0")
    if not nodes:
        raise TopologyError(f"no node has all of the labels {levels}; nothing to build")
    children: dict[str, list[str]] = {}
    for switch, (parent, _) in parent_of.items():
        if parent is not None:
            children.setdefault(parent, []).append(switch)
    switches = {
        name: Switch(name, tier_of[name], parent_of[name][0], tuple(sorted(children.get(name, []))), tuple(members.get(name, [])))
        for name in parent_of
    }
    return Topology(switches, nodes)
