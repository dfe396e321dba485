"""The fabric file: the switch tree described in a small YAML document, parsed and validated.

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

The file is someone's input, so it is bounded: at most MAX_BYTES, and no YAML anchors or aliases, which
would let a few hundred bytes expand to gigabytes (and a fabric has nothing to repeat by reference).
"""

from __future__ import annotations

from typing import Any

import yaml

from stormtopo.core.tier import tier_number
from stormtopo.core.topology.tree import NAME_MAX, NAME_RULE, NodeSpec, Switch, Topology, TopologyError, is_name

_DEFAULTS = {"gpus": 8, "cpu": "96", "memory": "1Ti"}
MAX_BYTES = 4 * 1024 * 1024  # about 200,000 nodes; a real fabric is far smaller


class _NoAliases(yaml.SafeLoader):
    """Composes the document as written and refuses anchors and aliases before anything expands."""

    def compose_node(self, parent: yaml.Node | None, index: int) -> yaml.Node | None:
        event = self.peek_event()  # type: ignore[no-untyped-call]
        if isinstance(event, yaml.AliasEvent) or getattr(event, "anchor", None):
            kind = "alias *" if isinstance(event, yaml.AliasEvent) else "anchor &"
            raise TopologyError(
                f"line {event.start_mark.line + 1}: YAML anchors and aliases are not accepted in a fabric file "
                f"(found {kind}{event.anchor}); write each switch and node out in full"
            )
        return super().compose_node(parent, index)


def _fail(message: str, node: yaml.Node | None = None) -> TopologyError:
    where = f"line {node.start_mark.line + 1}: " if node is not None else ""
    return TopologyError(where + message)


def _scalar(node: yaml.Node, what: str) -> str:
    if not isinstance(node, yaml.ScalarNode):
        raise _fail(f"{what} must be a plain value", node)
    return str(node.value)


def _check_name(name: str, what: str, node: yaml.Node) -> None:
    if not is_name(name):
        shown = repr(name) if len(name) <= 80 else f"{name[:60]!r}... ({len(name)} characters)"
        raise _fail(f"{what} {shown} is not a valid Kubernetes object name; accepted: {NAME_RULE}", node)


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


def check_size(size: int) -> None:
    """Refuse a fabric file of `size` bytes if it is over the limit (before reading it, where possible)."""
    if size > MAX_BYTES:
        raise TopologyError(f"the fabric file is {size:,} bytes; accepted: at most {MAX_BYTES:,} bytes (4 MiB)")


def parse_topology(text: str) -> Topology:
    """Parse and validate a switch-tree description. Raises TopologyError naming the offending line."""
    check_size(len(text.encode()))
    try:
        root = yaml.compose(text, Loader=_NoAliases)
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
            if len(tier_names[tier]) > NAME_MAX:  # HyperNode spec.tierName is at most 253 characters
                raise _fail(f"tierNames[{tier_text}] is {len(tier_names[tier])} characters long; accepted: at most {NAME_MAX}", value)
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
