"""Volcano HyperNodes: rendered from the tree, read back into one, and the diff that syncs a cluster's."""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
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
    # taken as they are (the operator's 16,384 nodes: no copy per tree), judged by their first value: every caller
    # gives name -> labels for every node, or no labels at all.
    if isinstance(nodes, Mapping):
        first: object = next(iter(nodes.values()), {})
        if isinstance(first, Mapping):
            return nodes
        return {str(n): (labels if isinstance(labels, Mapping) else {}) for n, labels in nodes.items()}
    return {str(n): {} for n in nodes}


@dataclass
class TreeMemo:
    """What one build of the tree resolved, for the next over mostly the same HyperNodes (the operator rebuilds it
    at each HyperNode change: at 16,384 nodes, about 25 ms of its event loop resolving every member again). Per
    HyperNode, by the object it was (the index replaces a HyperNode's object when it changes) and, where it
    selects by label or pattern, the node labels it was resolved over: its nodes and its HyperNode members."""

    resolved: dict[str, tuple[Mapping[str, Any], object, _Resolved]] = field(default_factory=dict)
    specs: dict[str, NodeSpec] = field(default_factory=dict)  # each node's, as last built (one object while unchanged)


@dataclass(frozen=True)
class _Resolved:
    nodes: tuple[str, ...]  # sorted
    children: tuple[str, ...]  # HyperNode members by exactMatch, in order (tier-0 ones folded at each build)
    by_nodes: bool  # some member selects by label or pattern: resolved over the labels it was given


def _resolve(hn: Mapping[str, Any], labels: Mapping[str, Mapping[str, str]], lookup: NodeLookup) -> _Resolved:
    nodes: set[str] = set()
    children: list[str] = []
    by_nodes = False
    for member in (hn.get("spec") or {}).get("members") or []:
        selector = member.get("selector") or {}
        if member.get("type") == "HyperNode":
            child = (selector.get("exactMatch") or {}).get("name")
            if child:
                children.append(str(child))
        elif member.get("type") == "Node":
            if len(selector) == 1 and (exact := selector.get("exactMatch")) is not None:  # (most members: one name)
                if exact.get("name"):
                    nodes.add(str(exact["name"]))
                continue
            by_nodes = True
            nodes |= selected_nodes(selector, labels, lookup)
    return _Resolved(tuple(sorted(nodes)), tuple(children), by_nodes)


def topology_from_hypernodes(
    hypernodes: Iterable[Mapping[str, Any]], nodes: Mapping[str, Mapping[str, str]] | Iterable[str] = (), memo: TreeMemo | None = None
) -> Topology:
    """The tree a cluster's HyperNodes describe, resolved as Volcano does. Node members by exactMatch,
    regexMatch (a search in the names of `nodes`) or labelMatch (against the labels of `nodes`, node name
    -> labels; given names alone, labelMatch selects nothing). HyperNode members by exactMatch only.
    A tier-0 HyperNode of one node (the node tier) is read as that node, a member of its parent. `memo`: what
    the last build over the same caller's HyperNodes resolved (kept up to date by this one)."""
    hypernodes = list(hypernodes)
    folded = node_tier_members(hypernodes)
    hypernodes = [hn for hn in hypernodes if hn["metadata"]["name"] not in folded]
    labels = _labels_by_node(nodes)
    lookup = NodeLookup(labels)
    memo = memo if memo is not None else TreeMemo()
    resolved: dict[str, tuple[Mapping[str, Any], object, _Resolved]] = {}
    specs: dict[str, NodeSpec] = {}
    switches: dict[str, Switch] = {}
    parents: dict[str, str] = {}
    members: dict[str, NodeSpec] = {}
    for hn in hypernodes:
        name = hn["metadata"]["name"]
        kept = memo.resolved.get(name)
        if kept is not None and kept[0] is hn and (not kept[2].by_nodes or kept[1] is labels):
            resolved[name] = kept
        else:
            these = _resolve(hn, labels, lookup)
            resolved[name] = (hn, labels if these.by_nodes else None, these)  # (no older labels kept alive for nothing)
        these = resolved[name][2]
        member_nodes = these.nodes
        if any(child in folded for child in these.children):
            member_nodes = tuple(sorted({*member_nodes, *(folded[c] for c in these.children if c in folded)}))
        children = tuple(c for c in these.children if c not in folded)
        for child in children:
            parents.setdefault(child, name)
        switches[name] = Switch(name, int((hn.get("spec") or {}).get("tier", 1)), None, children, member_nodes)
        for node in member_nodes:
            if node not in members:
                spec = memo.specs.get(node)
                if spec is None or spec.switch != name:
                    spec = NodeSpec(node, name, 0, "0", "0")
                members[node] = specs[node] = spec
    memo.resolved, memo.specs = resolved, specs  # (only what this build saw: nothing gone is kept)
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
