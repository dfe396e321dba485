"""The switch tree: switches by tier (1 = closest to the nodes), each with one parent, and the nodes under them."""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

from stormtopo.core.tier import tier_of_name

_DNS_LABEL = r"[a-z0-9]([-a-z0-9]*[a-z0-9])?"
# A Kubernetes object name (DNS-1123 subdomain) as the API server checks it: dot-separated labels, at most
# 253 characters in all. Use with fullmatch: `$` would also accept a trailing newline.
NAME = re.compile(rf"{_DNS_LABEL}(\.{_DNS_LABEL})*")
NAME_MAX = 253
NAME_RULE = (
    f"at most {NAME_MAX} characters: lowercase letters, digits and '-', in parts separated by single dots, "
    "each part starting and ending with a letter or digit"
)


def is_name(text: str) -> bool:
    """Whether `text` can name a HyperNode or a node (Kubernetes' IsDNS1123Subdomain)."""
    return len(text) <= NAME_MAX and NAME.fullmatch(text) is not None


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
class Span:
    """Where a set of nodes sits in the tree: their lowest common HyperNode and the tier they span."""

    hypernode: str | None  # the closest HyperNode holding every node (for one node: its leaf)
    tier: int | None  # 0: all on one node; else `hypernode`'s tier; None: a node unknown, or no common HyperNode


@dataclass(frozen=True)
class Topology:
    switches: Mapping[str, Switch]
    nodes: Mapping[str, NodeSpec]
    tier_names: Mapping[int, str] = field(default_factory=dict)
    lines: Mapping[str, int] = field(default_factory=dict)  # where each switch and node was described
    # HyperNodes a member names that do not exist (just deleted, not yet created, a deposed leader's stale
    # write): the tree has a gap there, and a node missing from it is unknown, not outside every domain.
    gaps: frozenset[str] = frozenset()

    @property
    def tiers(self) -> int:
        return max((s.tier for s in self.switches.values()), default=0)

    def tier_of_name(self, name: str | None) -> int | None:
        """The tier a tierName names in this tree (the HyperNodes' spec.tierName), the highest where several
        tiers carry it (as ClusterTiers.number); None if none is named so."""
        return tier_of_name(name, ((named, tier) for tier, named in self.tier_names.items()))

    def ancestors(self, node: str) -> list[str]:
        """Switches above a node, closest first."""
        chain: list[str] = []
        current: str | None = self.nodes[node].switch
        while current is not None:
            chain.append(current)
            current = self.switches[current].parent
        return chain

    def span(self, nodes: Iterable[str]) -> Span:
        """Which tier `nodes` span: 0 when they are all one node, else the tier of their lowest common
        HyperNode; tier and HyperNode are None when a node is not in the tree or they share no HyperNode."""
        names = set(nodes)
        if not names or not names <= self.nodes.keys():
            return Span(None, None)
        common = self.lowest_common_switch(names)
        if common is None:
            return Span(None, None)
        return Span(common.name, 0 if len(names) == 1 else common.tier)

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
