"""The HyperNode tree: two parents and cycles, members that do not exist, tiers meaning different depths, and
Volcano's HyperNode discovery beside stormtopo's node tier."""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Mapping, Sequence
from typing import Any

import yaml

from stormtopo.core.diagnosis.findings import Finding, Level, _names, _plural
from stormtopo.core.diagnosis.snapshot import Snapshot
from stormtopo.core.topology.hypernodes import topology_from_hypernodes
from stormtopo.core.topology.node_tier import exact_name
from stormtopo.core.topology.selectors import NodeLookup, selected_nodes
from stormtopo.core.topology.tree import Topology
from stormtopo.core.vocabulary import MANAGED_BY_LABEL, NODE_TIER_LABEL, OPERATOR_NAME, TOPOLOGY_SOURCE_LABEL


def _node_tier(hypernodes: Iterable[Mapping[str, Any]]) -> list[str]:
    """The tier-0 HyperNodes stormtopo's node tier wrote."""
    out = []
    for hn in hypernodes:
        labels = (hn.get("metadata") or {}).get("labels") or {}
        if labels.get(NODE_TIER_LABEL) == "true" and labels.get(MANAGED_BY_LABEL) == OPERATOR_NAME:
            out.append(str(hn["metadata"]["name"]))
    return sorted(out)


def _discovery(snapshot: Snapshot) -> list[str]:
    """Volcano's HyperNode discovery, wherever it shows: enabled sources in the controller's (or scheduler's)
    configuration, and HyperNodes with its source label."""
    sources: set[str] = set()
    for config in (snapshot.controller_config, snapshot.scheduler_config):
        if config is None or not config.text:
            continue
        try:
            conf = yaml.safe_load(config.text)
        except yaml.YAMLError:
            continue
        entries = conf.get("networkTopologyDiscovery") if isinstance(conf, Mapping) else None
        for entry in entries if isinstance(entries, list) else []:
            if isinstance(entry, Mapping) and entry.get("enabled") is True:
                sources.add(f"source {entry.get('source')} in {config.where}")
    labelled = sorted(
        str(hn["metadata"]["name"])
        for hn in snapshot.hypernodes
        if TOPOLOGY_SOURCE_LABEL in ((hn.get("metadata") or {}).get("labels") or {})
    )
    if labelled:
        sources.add(f"{_plural(len(labelled), 'HyperNode')} labelled {TOPOLOGY_SOURCE_LABEL} ({_names(labelled)})")
    return sorted(sources)


def _cycles(children: Mapping[str, Sequence[str]]) -> list[list[str]]:
    """Each cycle of HyperNodes naming one another, once, as the path that closes it."""
    state: dict[str, int] = {}  # 1: on the current path, 2: done
    found: list[list[str]] = []
    for root in sorted(children):
        if state.get(root):
            continue
        path: list[str] = [root]
        stack: list[Iterator[str]] = [iter(sorted(children.get(root, ())))]
        state[root] = 1
        while stack:
            child = next(stack[-1], None)
            if child is None:
                state[path.pop()] = 2
                stack.pop()
            elif state.get(child) == 1:
                found.append([*path[path.index(child) :], child])
            elif not state.get(child) and child in children:
                state[child] = 1
                path.append(child)
                stack.append(iter(sorted(children.get(child, ()))))
    return found


def _heights(topology: Topology) -> dict[str, int]:
    """Levels of HyperNodes from each HyperNode down to its nodes (a leaf: 1). Call only on a tree without cycles."""
    heights: dict[str, int] = {}

    def height(name: str) -> int:
        if name not in heights:
            switch = topology.switches[name]
            below = [height(c) for c in switch.children if c in topology.switches]
            heights[name] = 1 + max(below, default=0)
        return heights[name]

    for name, switch in topology.switches.items():
        if switch.children or switch.nodes:  # an empty HyperNode means no depth
            height(name)
    return heights


def check_hypernodes(snapshot: Snapshot) -> list[Finding]:
    """Two parents and cycles (Volcano then places no gang with a network topology), leaves naming nodes
    or HyperNodes that do not exist, tiers meaning different depths, discovery beside the node tier."""
    check = "hypernodes"
    if "hypernodes" in snapshot.unreadable:
        return [
            Finding(
                Level.WARNING,
                check,
                f"HyperNodes could not be read ({snapshot.unreadable['hypernodes']})",
                "check that Volcano's CRDs are installed and that you may list hypernodes.topology.volcano.sh",
            )
        ]
    hypernodes = {str(hn["metadata"]["name"]): hn for hn in snapshot.hypernodes}
    if not hypernodes:
        return [
            Finding(
                Level.ERROR,
                check,
                "no HyperNodes: Volcano has no tree to keep a gang within, so no topology request can be met",
                "describe the switch tree: stormtopo topology apply -f FILE, or stormtopo topology from-labels (docs/install.md)",
            )
        ]
    nodes_known = "nodes" not in snapshot.unreadable
    parents: dict[str, set[str]] = {}  # a HyperNode member -> the HyperNodes naming it
    node_parents: dict[str, set[str]] = {}
    children: dict[str, list[str]] = {}
    missing_nodes: list[str] = []
    missing_members: list[str] = []
    tiers: dict[str, int] = {name: int((hn.get("spec") or {}).get("tier", 1)) for name, hn in hypernodes.items()}
    lookup = NodeLookup(snapshot.nodes)  # (one index of the nodes for every selector)
    for name, hn in sorted(hypernodes.items()):
        for member in (hn.get("spec") or {}).get("members") or []:
            selector = member.get("selector") or {}
            if member.get("type") == "HyperNode":
                child = (selector.get("exactMatch") or {}).get("name")  # Volcano resolves HyperNode members by exactMatch only
                if not child:
                    continue
                parents.setdefault(child, set()).add(name)
                children.setdefault(name, []).append(child)
                if child not in hypernodes:
                    missing_members.append(f"{name} names HyperNode {child}")
            elif member.get("type") == "Node":
                for node in selected_nodes(selector, snapshot.nodes, lookup):
                    node_parents.setdefault(node, set()).add(name)
                named = exact_name(member)
                if nodes_known and named and named not in snapshot.nodes:
                    missing_nodes.append(f"{name} names node {named}")
    findings: list[Finding] = []
    twice = [f"HyperNode {c} (in {', '.join(sorted(p))})" for c, p in sorted(parents.items()) if len(p) > 1 and c in hypernodes]
    nodes_twice = [f"node {n} (in {', '.join(sorted(p))})" for n, p in sorted(node_parents.items()) if len(p) > 1]
    if twice or nodes_twice:
        why = []
        if twice:
            why.append("Volcano refuses a HyperNode with two parents and then skips every gang with a network topology")
        if nodes_twice:
            why.append("a node in two HyperNodes is in two domains at once, so a tier no longer means one switch")
        findings.append(
            Finding(
                Level.ERROR,
                check,
                f"{_plural(len(twice) + len(nodes_twice), 'member')} with two parents: {_names(twice + nodes_twice)}; {'; '.join(why)}",
                "keep each node and HyperNode in exactly one HyperNode: remove it from all but one (kubectl edit hypernode NAME)",
            )
        )
    cycles = _cycles({name: children.get(name, []) for name in hypernodes})
    if cycles:
        findings.append(
            Finding(
                Level.ERROR,
                check,
                f"HyperNodes name one another in a cycle: {_names([' -> '.join(c) for c in cycles])}; Volcano cannot build the tree",
                "remove the member that points back up the tree",
            )
        )
    if missing_nodes or missing_members:
        findings.append(
            Finding(
                Level.WARNING,
                check,
                f"members that do not exist: {_names(missing_nodes + missing_members)}; they add nothing to their domain",
                "remove them, or re-render the tree from its source (stormtopo topology apply -f FILE); a node the node tier "
                "just removed is named again by its next pass",
            )
        )
    upward = [
        f"{c} (tier {tiers[c]}) in {p} (tier {tiers[p]})"
        for p, cs in sorted(children.items())
        for c in cs
        if c in tiers and tiers[c] >= tiers[p]
    ]
    if not cycles:
        topology = topology_from_hypernodes(hypernodes.values(), snapshot.nodes)
        heights = _heights(topology)
        by_tier: dict[int, dict[int, list[str]]] = {}
        for name, h in sorted(heights.items()):
            by_tier.setdefault(topology.switches[name].tier, {}).setdefault(h, []).append(name)
        mixed = [
            f"tier {tier} is "
            + " but ".join(f"{_plural(h, 'level')} above the nodes at {_names(names, 2)}" for h, names in sorted(hs.items()))
            for tier, hs in sorted(by_tier.items())
            if len(hs) > 1
        ]
        if mixed or upward:
            findings.append(
                Finding(
                    Level.WARNING,
                    check,
                    "tiers mean different depths in different trees: " + "; ".join([*mixed, *(f"{u}" for u in upward)]),
                    "give each level of switches the same tier in every tree, below its parent's: a request's tier then spans "
                    "the same switches wherever its replicas land",
                )
            )
    discovery, node_tier = _discovery(snapshot), _node_tier(hypernodes.values())
    if discovery and node_tier:
        fought = sorted(
            name
            for name, hn in hypernodes.items()
            if TOPOLOGY_SOURCE_LABEL in ((hn.get("metadata") or {}).get("labels") or {})
            and any(c in node_tier for c in children.get(name, []))
        )
        also = f"; discovered leaves naming tier-0 HyperNodes (named with --node-tier-leaf): {_names(fought)}" if fought else ""
        findings.append(
            Finding(
                Level.WARNING,
                check,
                f"Volcano's HyperNode discovery ({'; '.join(discovery)}) runs beside stormtopo's node tier "
                f"({_plural(len(node_tier), 'tier-0 HyperNode')}){also}",
                "leave discovered leaves out of --node-tier-leaf (chart: nodeTier.leaves): the discovery writes their members "
                "back at every sync and the two fight; with two networkTopologyTypes the node tier lists nothing "
                "(COMPATIBILITY.md#volcanos-hypernode-discovery)",
            )
        )
    if not findings:
        depth = max(tiers.values(), default=0)
        findings.append(
            Finding(
                Level.OK,
                check,
                f"{_plural(len(hypernodes), 'HyperNode')}, tiers up to {depth}, over {_plural(len(node_parents), 'node')}: "
                "one parent each, no cycles, every member exists",
            )
        )
    return findings
