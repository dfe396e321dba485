"""Volcano HyperNodes: rendered from the tree, read back into one, and the diff that syncs a cluster's."""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from stormtopo.core.topology.node_tier import node_tier_members
from stormtopo.core.topology.selectors import NodeLookup, selected_nodes
from stormtopo.core.topology.tree import NodeSpec, Switch, Topology, TopologyError
from stormtopo.core.vocabulary import HYPERNODE_API, MANAGED_BY, MANAGED_BY_LABEL, OPERATOR_NAME


def hypernode_manifest(topology: Topology, switch: Switch) -> dict[str, Any]:
    """The Volcano HyperNode for one switch. Members are exactMatch: Volcano drops regex HyperNode members."""
    if switch.nodes:
        members = [{"type": "Node", "selector": {"exactMatch": {"name": n}}} for n in switch.nodes]
    else:
        members = [{"type": "HyperNode", "selector": {"exactMatch": {"name": c}}} for c in switch.children]
    spec: dict[str, Any] = {"tier": switch.tier, "members": members}
    if switch.tier in topology.tier_names:
        spec["tierName"] = topology.tier_names[switch.tier]
    return {
        "apiVersion": HYPERNODE_API,
        "kind": "HyperNode",
        "metadata": {"name": switch.name, "labels": dict(MANAGED_BY)},
        "spec": spec,
    }


def hypernode_manifests(topology: Topology) -> list[dict[str, Any]]:
    # Lowest tier first, so a parent never names a child that does not exist yet.
    ordered = sorted(topology.switches.values(), key=lambda s: (s.tier, s.name))
    return [hypernode_manifest(topology, s) for s in ordered]


def _labels_by_node(nodes: Mapping[str, Mapping[str, str]] | Iterable[str]) -> Mapping[str, Mapping[str, str]]:
    # A mapping to anything but labels (free GPUs per node, say) gives the names alone. Node labels themselves are
    # taken as they are (the operator's 16,384 nodes: no copy per tree).
    if isinstance(nodes, Mapping):
        first: object = next(iter(nodes.values()), {})
        if isinstance(first, Mapping):
            return nodes
        return {str(n): (labels if isinstance(labels, Mapping) else {}) for n, labels in nodes.items()}
    return {str(n): {} for n in nodes}


def topology_from_hypernodes(
    hypernodes: Iterable[Mapping[str, Any]], nodes: Mapping[str, Mapping[str, str]] | Iterable[str] = ()
) -> Topology:
    """The tree a cluster's HyperNodes describe, resolved as Volcano does. Node members by exactMatch,
    regexMatch (a search in the names of `nodes`) or labelMatch (against the labels of `nodes`, node name
    -> labels; given names alone, labelMatch selects nothing). HyperNode members by exactMatch only.
    A tier-0 HyperNode of one node (the node tier) is read as that node, a member of its parent."""
    hypernodes = list(hypernodes)
    folded = node_tier_members(hypernodes)
    hypernodes = [hn for hn in hypernodes if hn["metadata"]["name"] not in folded]
    labels = _labels_by_node(nodes)
    lookup = NodeLookup(labels)
    switches: dict[str, Switch] = {}
    parents: dict[str, str] = {}
    members: dict[str, NodeSpec] = {}
    for hn in hypernodes:
        name = hn["metadata"]["name"]
        spec = hn.get("spec") or {}
        member_nodes: set[str] = set()
        children: list[str] = []
        for member in spec.get("members") or []:
            selector = member.get("selector") or {}
            if member.get("type") == "HyperNode":
                child = (selector.get("exactMatch") or {}).get("name")
                if child in folded:
                    member_nodes.add(folded[child])
                elif child:
                    children.append(child)
                    parents.setdefault(child, name)
            elif member.get("type") == "Node":
                if len(selector) == 1 and (exact := selector.get("exactMatch")) is not None:  # (most members: one name)
                    if exact.get("name"):
                        member_nodes.add(str(exact["name"]))
                    continue
                member_nodes |= selected_nodes(selector, labels, lookup)
        switches[name] = Switch(name, int(spec.get("tier", 1)), None, tuple(children), tuple(sorted(member_nodes)))
        for node in sorted(member_nodes):
            members.setdefault(node, NodeSpec(node, name, 0, "0", "0"))
    linked = {
        name: Switch(s.name, s.tier, parents.get(name), tuple(c for c in s.children if c in switches), s.nodes)
        for name, s in switches.items()
    }
    tier_names = {int(h["spec"].get("tier", 1)): str(h["spec"]["tierName"]) for h in hypernodes if (h.get("spec") or {}).get("tierName")}
    gaps = frozenset(c for s in switches.values() for c in s.children if c not in switches)
    return Topology(linked, members, tier_names, gaps=gaps)


@dataclass(frozen=True)
class HyperNodeDiff:
    create: list[dict[str, Any]]
    update: list[dict[str, Any]]
    delete: list[str]

    def empty(self) -> bool:
        return not (self.create or self.update or self.delete)

    def lines(self) -> list[str]:
        out = [f"+ create HyperNode {m['metadata']['name']} (tier {m['spec']['tier']})" for m in self.create]
        out += [f"~ update HyperNode {m['metadata']['name']} (tier {m['spec']['tier']})" for m in self.update]
        out += [f"- delete HyperNode {name}" for name in self.delete]
        return out or ["no changes"]


def hypernode_diff(desired: list[dict[str, Any]], existing: Sequence[Mapping[str, Any]]) -> HyperNodeDiff:
    """What to create, update and prune so the cluster's HyperNodes match `desired`. Only HyperNodes
    stormtopo manages are pruned; one someone else made with a wanted name is an error, not overwritten."""
    current = {h["metadata"]["name"]: h for h in existing}
    create, update = [], []
    for manifest in desired:
        name = manifest["metadata"]["name"]
        have = current.get(name)
        if have is None:
            create.append(manifest)
            continue
        labels = (have.get("metadata") or {}).get("labels") or {}
        if labels.get(MANAGED_BY_LABEL) != OPERATOR_NAME:
            raise TopologyError(f"HyperNode {name} exists and is not managed by stormtopo; rename the switch or delete it first")
        if have.get("spec") != manifest["spec"]:
            update.append(manifest)
    wanted = {m["metadata"]["name"] for m in desired}
    delete = sorted(
        name
        for name, h in current.items()
        if name not in wanted and ((h.get("metadata") or {}).get("labels") or {}).get(MANAGED_BY_LABEL) == OPERATOR_NAME
    )
    return HyperNodeDiff(create, update, delete)


def selects_by_label(hypernodes: Iterable[Mapping[str, Any]]) -> bool:
    """Whether any HyperNode picks its nodes by label: only then does reading it back need node labels."""
    return any(
        "labelMatch" in (member.get("selector") or {})
        for hn in hypernodes
        for member in (hn.get("spec") or {}).get("members") or []
        if member.get("type") == "Node"
    )


def selects_among_nodes(hypernodes: Iterable[Mapping[str, Any]]) -> bool:
    """Whether any HyperNode picks its nodes by pattern or label: only then does the tree depend on which
    nodes exist (exactMatch names its nodes)."""
    return any(
        "labelMatch" in (member.get("selector") or {}) or "regexMatch" in (member.get("selector") or {})
        for hn in hypernodes
        for member in (hn.get("spec") or {}).get("members") or []
        if member.get("type") == "Node"
    )


def selector_label_keys(hypernodes: Iterable[Mapping[str, Any]]) -> frozenset[str]:
    """The node label keys the HyperNodes' labelMatch selectors read: all a node's labels that the tree needs."""
    keys: set[str] = set()
    for hn in hypernodes:
        for member in (hn.get("spec") or {}).get("members") or []:
            labels = (member.get("selector") or {}).get("labelMatch")
            if member.get("type") == "Node" and labels:
                keys |= {str(k) for k in labels.get("matchLabels") or {}}
                keys |= {str(e.get("key", "")) for e in labels.get("matchExpressions") or []}
    return frozenset(keys)
