"""The switch tree: parsed from a small YAML description, validated, and turned into HyperNodes.

The description nests switches; a switch maps either to child switches or to a list of nodes:

    tierNames: {1: leaf, 2: spine, 3: core}      # optional: HyperNode spec.tierName per tier
    nodeDefaults: {gpus: 8, cpu: "96", memory: 1Ti}
    switches:
      s6:
        s4:
          s0: [node0, node1]
          s1: [node2, {name: node3, gpus: 4}]
        s5: ...

A switch's tier is its height: switches holding nodes are tier 1 (closest), their parents tier 2, ...
Nesting gives every HyperNode one parent and no cycles by construction; what remains to check is
names, duplicates and that all children of a switch sit on the same tier. Errors name the line.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import yaml

from stormtopo.core.tier import tier_number
from stormtopo.core.vocabulary import HYPERNODE_API, MANAGED_BY, MANAGED_BY_LABEL, OPERATOR_NAME

_NAME = re.compile(r"^[a-z0-9]([-a-z0-9.]*[a-z0-9])?$")
_DEFAULTS = {"gpus": 8, "cpu": "96", "memory": "1Ti"}


class TopologyError(ValueError):
    """A switch-tree description is invalid; the message names the item and, where known, its line."""


@dataclass(frozen=True)
class NodeSpec:
    name: str
    switch: str
    gpus: int
    cpu: str
    memory: str


@dataclass(frozen=True)
class Switch:
    name: str
    tier: int
    parent: str | None
    children: tuple[str, ...] = ()  # child switches
    nodes: tuple[str, ...] = ()  # member nodes (tier-1 switches only)


@dataclass(frozen=True)
class Topology:
    switches: Mapping[str, Switch]
    nodes: Mapping[str, NodeSpec]
    tier_names: Mapping[int, str] = field(default_factory=dict)
    lines: Mapping[str, int] = field(default_factory=dict)  # where each switch and node was described

    @property
    def tiers(self) -> int:
        return max((s.tier for s in self.switches.values()), default=0)

    def ancestors(self, node: str) -> list[str]:
        """Switches above a node, closest first."""
        chain: list[str] = []
        current: str | None = self.nodes[node].switch
        while current is not None:
            chain.append(current)
            current = self.switches[current].parent
        return chain

    def lowest_common_switch(self, nodes: Iterable[str]) -> Switch | None:
        """The closest switch that holds every one of `nodes`; None if they share none (a forest)."""
        names = list(nodes)
        if not names:
            return None
        common = self.ancestors(names[0])
        for other in names[1:]:
            theirs = set(self.ancestors(other))
            common = [s for s in common if s in theirs]
        return self.switches[common[0]] if common else None

    def nodes_under(self, switch: str) -> list[str]:
        s = self.switches[switch]
        if s.nodes:
            return list(s.nodes)
        return [n for child in s.children for n in self.nodes_under(child)]


def _fail(message: str, node: yaml.Node | None = None) -> TopologyError:
    where = f"line {node.start_mark.line + 1}: " if node is not None else ""
    return TopologyError(where + message)


def _scalar(node: yaml.Node, what: str) -> str:
    if not isinstance(node, yaml.ScalarNode):
        raise _fail(f"{what} must be a plain value", node)
    return str(node.value)


def _check_name(name: str, what: str, node: yaml.Node) -> None:
    if len(name) > 253 or not _NAME.match(name):
        raise _fail(
            f"{what} {name!r} is not a valid Kubernetes object name: use lowercase letters, digits, '-' and '.', "
            "starting and ending with a letter or digit",
            node,
        )


def _mapping(node: yaml.Node, what: str) -> list[tuple[str, yaml.Node, yaml.Node]]:
    if not isinstance(node, yaml.MappingNode):
        raise _fail(f"{what} must be a mapping", node)
    return [(_scalar(k, f"a key of {what}"), k, v) for k, v in node.value]


class _Builder:
    def __init__(self, defaults: dict[str, Any]) -> None:
        self.defaults = defaults
        self.switches: dict[str, Switch] = {}
        self.nodes: dict[str, NodeSpec] = {}
        self.seen: dict[str, int] = {}

    def _claim(self, name: str, what: str, node: yaml.Node) -> None:
        _check_name(name, what, node)
        if name in self.seen:
            raise _fail(
                f"{what} {name!r} appears twice (first on line {self.seen[name]}): a HyperNode has one parent "
                "and a node belongs to one leaf switch",
                node,
            )
        self.seen[name] = node.start_mark.line + 1

    def switch(self, name: str, key: yaml.Node, body: yaml.Node, parent: str | None) -> int:
        """Add switch `name` and everything below it; return its tier."""
        self._claim(name, "switch", key)
        if isinstance(body, yaml.SequenceNode):
            if not body.value:
                raise _fail(f"switch {name!r} has an empty node list", body)
            members = tuple(self.node(item, name) for item in body.value)
            self.switches[name] = Switch(name, 1, parent, nodes=members)
            return 1
        if isinstance(body, yaml.MappingNode):
            if not body.value:
                raise _fail(f"switch {name!r} has no children", body)
            tiers: dict[int, str] = {}
            children = []
            for child, child_key, child_body in _mapping(body, f"switch {name!r}"):
                tier = self.switch(child, child_key, child_body, name)
                tiers.setdefault(tier, child)
                children.append(child)
            if len(tiers) > 1:
                detail = ", ".join(f"{c} is tier {t}" for t, c in sorted(tiers.items()))
                raise _fail(f"switch {name!r} has children on different tiers ({detail}); every child must sit one tier below it", key)
            tier = next(iter(tiers)) + 1
            self.switches[name] = Switch(name, tier, parent, children=tuple(children))
            return tier
        raise _fail(f"switch {name!r} must map to child switches or to a list of nodes", body)

    def node(self, item: yaml.Node, switch: str) -> str:
        attrs: dict[str, Any] = dict(self.defaults)
        if isinstance(item, yaml.ScalarNode):
            name = str(item.value)
        else:
            given = {k: yaml.safe_load(yaml.serialize(v)) for k, _, v in _mapping(item, f"a node of switch {switch!r}")}
            unknown = set(given) - {"name", *_DEFAULTS}
            if unknown:
                raise _fail(f"node of switch {switch!r}: unknown field(s) {sorted(unknown)}; accepted: name, gpus, cpu, memory", item)
            if "name" not in given:
                raise _fail(f"node of switch {switch!r} has no name", item)
            name = str(given.pop("name"))
            attrs.update(given)
        self._claim(name, "node", item)
        gpus = attrs["gpus"]
        if not isinstance(gpus, int) or isinstance(gpus, bool) or gpus < 0:
            raise _fail(f"node {name!r}: gpus must be a whole number >= 0, got {gpus!r}", item)
        self.nodes[name] = NodeSpec(name, switch, gpus, str(attrs["cpu"]), str(attrs["memory"]))
        return name


def parse_topology(text: str) -> Topology:
    """Parse and validate a switch-tree description. Raises TopologyError naming the offending line."""
    try:
        root = yaml.compose(text)
    except yaml.YAMLError as exc:
        raise TopologyError(f"not valid YAML: {exc}") from exc
    if root is None:
        raise TopologyError("the topology description is empty; it needs a 'switches' mapping")
    top = {k: (kn, v) for k, kn, v in _mapping(root, "the topology description")}
    unknown = set(top) - {"switches", "nodeDefaults", "tierNames"}
    if unknown:
        key = top[sorted(unknown)[0]][0]
        raise _fail(f"unknown top-level key(s) {sorted(unknown)}; accepted: switches, nodeDefaults, tierNames", key)
    if "switches" not in top:
        raise _fail("the topology description has no 'switches' mapping", root)
    defaults = dict(_DEFAULTS)
    if "nodeDefaults" in top:
        given = yaml.safe_load(yaml.serialize(top["nodeDefaults"][1])) or {}
        if not isinstance(given, dict) or set(given) - set(_DEFAULTS):
            raise _fail("nodeDefaults accepts only gpus, cpu and memory", top["nodeDefaults"][1])
        defaults.update(given)
    tier_names: dict[int, str] = {}
    if "tierNames" in top:
        for tier_text, key, value in _mapping(top["tierNames"][1], "tierNames"):
            tier = tier_number(tier_text)
            if tier is None:
                raise _fail(f"tierNames key {tier_text!r} must be a tier number >= 1", key)
            tier_names[tier] = _scalar(value, f"tierNames[{tier_text}]")
    builder = _Builder(defaults)
    roots = _mapping(top["switches"][1], "switches")
    if not roots:
        raise _fail("'switches' is empty", top["switches"][1])
    for name, key, body in roots:
        builder.switch(name, key, body, None)
    topology = Topology(builder.switches, builder.nodes, tier_names, builder.seen)
    extra = set(tier_names) - {s.tier for s in topology.switches.values()}
    if extra:
        raise _fail(
            f"tierNames names tier(s) {sorted(extra)} that no switch has; the tree has tiers 1..{topology.tiers}", top["tierNames"][0]
        )
    return topology


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


def topology_from_hypernodes(hypernodes: Iterable[Mapping[str, Any]], node_names: Iterable[str] = ()) -> Topology:
    """The tree a cluster's HyperNodes describe. Node members by exactMatch or regexMatch (against
    `node_names`); HyperNode members by exactMatch only, as Volcano resolves them."""
    hypernodes = list(hypernodes)
    names = sorted(node_names)
    switches: dict[str, Switch] = {}
    parents: dict[str, str] = {}
    nodes: dict[str, NodeSpec] = {}
    for hn in hypernodes:
        name = hn["metadata"]["name"]
        spec = hn.get("spec") or {}
        members_nodes: list[str] = []
        children: list[str] = []
        for member in spec.get("members") or []:
            selector = member.get("selector") or {}
            exact = (selector.get("exactMatch") or {}).get("name")
            if member.get("type") == "HyperNode":
                if exact:
                    children.append(exact)
                    parents.setdefault(exact, name)
            elif exact:
                members_nodes.append(exact)
            elif (selector.get("regexMatch") or {}).get("pattern"):
                pattern = re.compile(selector["regexMatch"]["pattern"])
                members_nodes += [n for n in names if pattern.match(n)]
        switches[name] = Switch(name, int(spec.get("tier", 1)), None, tuple(children), tuple(sorted(set(members_nodes))))
        for node in members_nodes:
            nodes.setdefault(node, NodeSpec(node, name, 0, "0", "0"))
    linked = {
        name: Switch(s.name, s.tier, parents.get(name), tuple(c for c in s.children if c in switches), s.nodes)
        for name, s in switches.items()
    }
    tier_names = {int(h["spec"].get("tier", 1)): str(h["spec"]["tierName"]) for h in hypernodes if (h.get("spec") or {}).get("tierName")}
    return Topology(linked, nodes, tier_names)


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
            if len(value) > 253 or not _NAME.match(value):
                raise TopologyError(
                    f"node {node}: label {levels[i]}={value!r} cannot name a HyperNode (lowercase letters, digits, '-', '.')"
                )
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
