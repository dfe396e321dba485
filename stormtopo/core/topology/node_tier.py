"""The node tier: tier-0 HyperNodes of one node each, for a short list of nodes, so that Volcano tries single
nodes before the leaf (issue 21; BENCHMARKS.md "Node first at scale: the simulator").

Volcano v1.15.1 tries a hard gang's eligible HyperNodes lowest tier first and keeps the fullest that holds it,
so a tier-0 HyperNode per node puts a replica on one node wherever one holds it. A HyperNode for every node
costs packing (equally full nodes tie in map order, in any leaf) and time (Volcano dry-runs the gang in each
and walks every HyperNode on each allocate event). The short list keeps both: of the nodes already partly
used, a few per amount of free GPUs (nodes with the same free GPUs are interchangeable for a replica that fits
one node), in the fullest leaves; and the next empty node(s) a best-fit packer would open. A replica that no
listed node holds falls back to the leaf, chosen by Volcano as before. Tier 1 stays the leaf, so every request's
`highestTierAllowed` keeps its meaning. The list changes with every placement: whoever renders it must
re-render it as pods come and go (the simulator assumes it is never late).
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable, Mapping
from typing import Any

from stormtopo.core.topology.tree import NAME_MAX, Topology

NODE_TIER = 0
NODE_TIER_SUFFIX = ".node"


def node_hypernode_name(node: str) -> str:
    """The tier-0 HyperNode of `node`: its name and a suffix, shortened with a digest past the name limit."""
    name = node + NODE_TIER_SUFFIX
    if len(name) <= NAME_MAX:
        return name
    digest = hashlib.sha256(node.encode()).hexdigest()[:10]
    return f"{node[: NAME_MAX - len(NODE_TIER_SUFFIX) - 11]}-{digest}{NODE_TIER_SUFFIX}"


def shortlist(topology: Topology, used_gpus: Mapping[str, int], per_free: int = 2, next_empty: int = 1) -> list[str]:
    """The nodes that get a tier-0 HyperNode, given the GPUs in use per node.

    `per_free`: partly used nodes listed per amount of free GPUs; `next_empty`: empty nodes listed. Both
    should be at least the number of replicas that may be scheduled before the list is rendered again.
    """
    leaves = [s for s in topology.switches.values() if s.nodes]
    in_leaf = {leaf.name: sum(used_gpus.get(n, 0) for n in leaf.nodes) for leaf in leaves}
    # Fullest leaf first (then by name): the order a best-fit packer fills leaves in.
    ordered = sorted(leaves, key=lambda leaf: (-in_leaf[leaf.name], leaf.name))
    listed: list[str] = []
    per_amount: dict[int, int] = {}
    empty: list[str] = []
    for leaf in ordered:
        for node in leaf.nodes:
            gpus, used = topology.nodes[node].gpus, used_gpus.get(node, 0)
            free = gpus - used
            if used == 0 and gpus > 0:
                if len(empty) < next_empty:
                    empty.append(node)
            elif free > 0 and per_amount.get(free, 0) < per_free:
                per_amount[free] = per_amount.get(free, 0) + 1
                listed.append(node)
    return listed + empty


def node_tier_manifests(hypernodes: Iterable[Mapping[str, Any]], listed: Iterable[str]) -> list[dict[str, Any]]:
    """`hypernodes` (as rendered from the tree) with a tier-0 HyperNode for each listed node, which its leaf
    names in place of the node. Tier-0 HyperNodes come first, so a leaf never names one that does not exist."""
    wanted = set(listed)
    tier0: list[dict[str, Any]] = []
    out: list[dict[str, Any]] = []
    for hn in hypernodes:
        manifest = {**hn, "spec": {**hn["spec"], "members": []}}
        for member in hn["spec"]["members"]:
            node = (member.get("selector") or {}).get("exactMatch", {}).get("name")
            if member.get("type") == "Node" and node in wanted:
                name = node_hypernode_name(node)
                tier0.append(
                    {
                        "apiVersion": hn["apiVersion"],
                        "kind": "HyperNode",
                        "metadata": {"name": name, "labels": dict(hn["metadata"].get("labels") or {})},
                        "spec": {"tier": NODE_TIER, "members": [member]},
                    }
                )
                member = {"type": "HyperNode", "selector": {"exactMatch": {"name": name}}}
            manifest["spec"]["members"].append(member)
        out.append(manifest)
    return sorted(tier0, key=lambda m: m["metadata"]["name"]) + out


def node_tier_members(hypernodes: Iterable[Mapping[str, Any]]) -> dict[str, str]:
    """Tier-0 HyperNodes of one node (exactMatch) -> that node: what reading a tree back folds away, so
    explain, the placement record and the pictures see nodes where Volcano sees the node tier."""
    out = {}
    for hn in hypernodes:
        spec = hn.get("spec") or {}
        members = spec.get("members") or []
        if int(spec.get("tier", 1)) != NODE_TIER or len(members) != 1 or members[0].get("type") != "Node":
            continue
        node = ((members[0].get("selector") or {}).get("exactMatch") or {}).get("name")
        if node:
            out[hn["metadata"]["name"]] = node
    return out
