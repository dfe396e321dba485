"""The node tier: tier-0 HyperNodes of one node each, for a short list of nodes, so that Volcano tries single
nodes before the leaf (BENCHMARKS.md "Node first at scale: the simulator").

Volcano v1.15.1 tries a hard gang's eligible HyperNodes lowest tier first and keeps the fullest that holds it,
so a tier-0 HyperNode per node puts a replica on one node wherever one holds it. A HyperNode for every node
costs packing (equally full nodes tie in map order, in any leaf) and time (Volcano dry-runs the gang in each
and walks every HyperNode on each allocate event). The short list keeps both: of the nodes already partly
used, a few per amount of free GPUs (nodes with the same free GPUs are interchangeable for a replica that fits
one node), in the fullest leaves; and the next empty node(s) to open, from the leaves with the fewest empty
nodes. Once a StormService asks for a topology for replicas of k >= 2 whole-node pods, which need a run of k
empty nodes in one leaf, no empty node is listed from a leaf whose run is room for at most two such replicas
(2..2k empty nodes) while the other leaves' runs hold fewer than SPARE_RUNS more: a replica that fits one node
must not break a run that may be needed (it goes to its leaf, as without the node tier). A longer run, an
empty node alone in its leaf, or a run where runs are plentiful, is still opened. A
replica that no listed node holds falls back to the leaf, chosen by Volcano as before. Tier 1 stays the
leaf, so every request's `highestTierAllowed` keeps its meaning. The list changes with every placement:
whoever renders it must re-render it as pods come and go (the simulator assumes it is never late).
"""

from __future__ import annotations

import hashlib
from collections.abc import Collection, Iterable, Mapping, Sequence
from typing import Any

from stormtopo.core.topology.selectors import NodeLookup, selected_nodes
from stormtopo.core.topology.tree import NAME_MAX, NodeSpec, Switch, Topology
from stormtopo.core.vocabulary import HYPERNODE_API, MANAGED_BY, MANAGED_BY_LABEL, NODE_TIER_LABEL, OPERATOR_NAME, TOPOLOGY_SOURCE_LABEL
from stormtopo.core.writes import CreateHyperNode, DeleteHyperNode, SetHyperNodeMembers, Write

NODE_TIER = 0
NODE_TIER_SUFFIX = ".node"
# A run of empty nodes is kept for whole-node replicas only while the other leaves' runs hold fewer than
# this many more: in a mostly empty cluster every replica that fits one node then gets one (the simulator,
# bench/results/sim-abundant-r3.md).
SPARE_RUNS = 6
# Empty nodes listed beside the next to open, from its leaf: the list follows a bind within a fraction of a
# second, and a replica that arrives in that window finds the one the previous replica took gone; a
# second in the same leaf is as good (its nodes are interchangeable), where one in another leaf would tie
# with the first in Volcano's map order and cost packing (the simulator: 212 against 220 of 227).
SPARE_EMPTY = 1


def node_hypernode_name(node: str) -> str:
    """The tier-0 HyperNode of `node`: its name and a suffix, shortened with a digest past the name limit."""
    name = node + NODE_TIER_SUFFIX
    if len(name) <= NAME_MAX:
        return name
    digest = hashlib.sha256(node.encode()).hexdigest()[:10]
    return f"{node[: NAME_MAX - len(NODE_TIER_SUFFIX) - 11]}-{digest}{NODE_TIER_SUFFIX}"


def whole_node_run(replicas: Iterable[Sequence[int]], node_gpus: int) -> int:
    """The most pods of one replica (the GPUs of each of its pods) that each take a whole node of
    `node_gpus` GPUs (the largest node's): such a replica needs a run of as many empty nodes in one
    leaf. 0 when no replica has two or more."""
    most = max((sum(1 for gpus in pods if gpus >= node_gpus) for pods in replicas), default=0) if node_gpus > 0 else 0
    return most if most >= 2 else 0


def shortlist(
    topology: Topology,
    used_gpus: Mapping[str, int],
    per_free: int = 2,
    next_empty: int = 1,
    whole_node_run: int = 0,
    spare_runs: int = SPARE_RUNS,
    spare_empty: int = 0,
    keep: Collection[str] = (),
    keep_pairs: bool = False,
) -> list[str]:
    """The nodes that get a tier-0 HyperNode, given the GPUs in use per node.

    `per_free`: partly used nodes listed per amount of free GPUs; `next_empty`: empty nodes listed. Both
    should be at least the number of replicas that may be scheduled before the list is rendered again.
    The empty nodes come from the leaves with the fewest empty nodes first (then the fullest): a replica
    that fits one node then opens an empty node where no replica of whole-node pods could use it, and
    a leaf's run of empty nodes is kept for the replica that needs all of them. `whole_node_run` (k, the
    most whole-node pods of a replica in the cluster): none from a leaf with 2..2k empty nodes, a run
    that is room for at most two such replicas, which a replica that fits one node must not break (its
    leaf places it, on partly used nodes where they hold it); unless the other leaves' runs hold
    `spare_runs` or more such replicas, when there is room to spare and node-first costs no packing.
    `spare_empty`: more empty nodes listed from the leaf of the first to open (SPARE_EMPTY). `keep`: the
    nodes listed now; those partly used keep their places while their amount of free GPUs has room.
    `keep_pairs`: a leaf's partly used nodes with half a node free or more hold, two by two, a replica of
    half-node pods that no node holds whole; a node that is one of an even number of them in its leaf (taking
    it costs such a pair) is not listed while a node that costs none has as much room or more, and those
    that cost none come first (the simulator: with it, every replica that one node holds goes on one node
    and packing equals hindsight's on 12 streams; bench/results/sim-pairs.md).
    """
    leaves = [s for s in topology.switches.values() if s.nodes]
    in_leaf = {leaf.name: sum(used_gpus.get(n, 0) for n in leaf.nodes) for leaf in leaves}
    # Fullest leaf first (then by name): the order a best-fit packer fills leaves in.
    ordered = sorted(leaves, key=lambda leaf: (-in_leaf[leaf.name], leaf.name))
    listed: list[str] = []
    per_amount: dict[int, int] = {}
    in_order = [node for leaf in ordered for node in leaf.nodes]
    costing, unlisted = _pairs(topology, used_gpus) if keep_pairs else (set(), set())
    in_order = sorted(in_order, key=lambda node: node in costing)  # stable: fullest leaf first within each
    # The nodes listed now first, while they qualify: each placement reorders the leaves, and a list
    # chosen afresh moves many HyperNodes for nothing (writes, and windows while Volcano places a replica).
    for node in [*(n for n in in_order if n in keep), *(n for n in in_order if n not in keep)]:
        gpus, used = topology.nodes[node].gpus, used_gpus.get(node, 0)
        free = gpus - used
        if used > 0 and free > 0 and per_amount.get(free, 0) < per_free and node not in unlisted:
            per_amount[free] = per_amount.get(free, 0) + 1
            listed.append(node)
    empty = {leaf.name: [n for n in leaf.nodes if used_gpus.get(n, 0) == 0 and topology.nodes[n].gpus > 0] for leaf in leaves}
    # A run counts the empty nodes a whole-node pod fits: those of the largest size (others take other pods).
    largest = max((topology.nodes[n].gpus for leaf in leaves for n in leaf.nodes), default=0)
    run = {name: sum(1 for n in nodes if topology.nodes[n].gpus >= largest) for name, nodes in empty.items()}
    room = sum(r // whole_node_run for r in run.values()) if whole_node_run else 0  # such replicas the runs hold

    def kept(leaf: str) -> bool:
        # A run of 2..2k, while the other leaves' runs hold fewer than `spare_runs` more such replicas.
        return 2 <= run[leaf] <= 2 * whole_node_run and room - run[leaf] // whole_node_run < spare_runs

    opening = sorted((leaf for leaf in ordered if empty[leaf.name] and not kept(leaf.name)), key=lambda leaf: len(empty[leaf.name]))
    nexts = [n for leaf in opening for n in empty[leaf.name]][:next_empty]  # sorted is stable: fullest next
    spares = [n for n in empty[opening[0].name] if n not in nexts][:spare_empty] if opening else []
    return listed + nexts + spares


def _pairs(topology: Topology, used_gpus: Mapping[str, int]) -> tuple[set[str], set[str]]:
    """For `keep_pairs`: the partly used nodes whose taking costs a pair (each one of an even number of
    nodes with half a node free or more in its leaf), and of those the ones not listed (a node that costs
    none has as much room or more). Only nodes of the largest size count: two of them with half a node
    free hold what one of them holds whole, which nodes of other sizes need not."""
    largest = max((spec.gpus for spec in topology.nodes.values()), default=0)
    half = largest // 2
    roomy: dict[str, list[str]] = {}
    for node, spec in topology.nodes.items():
        used = used_gpus.get(node, 0)
        if spec.gpus == largest > 0 and 0 < used < spec.gpus and spec.gpus - used >= half:
            roomy.setdefault(spec.switch, []).append(node)
    pairing = {node for nodes in roomy.values() if len(nodes) % 2 == 0 for node in nodes}
    free = {node: largest - used_gpus.get(node, 0) for nodes in roomy.values() for node in nodes}
    most = max((free[node] for node in free if node not in pairing), default=-1)
    return pairing, {node for node in pairing if free[node] <= most}


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
                        "apiVersion": hn.get("apiVersion", HYPERNODE_API),
                        "kind": "HyperNode",
                        # stormtopo's own labels only: a copied volcano.sh/network-topology-source would make
                        # Volcano's discovery delete it as one of its own it did not discover.
                        "metadata": {"name": name, "labels": {**MANAGED_BY, NODE_TIER_LABEL: "true"}},
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


def exact_name(member: Mapping[str, Any]) -> str | None:
    """The name a Node or HyperNode member selects by exactMatch alone; None for any other member."""
    selector = member.get("selector") or {}
    if member.get("type") not in ("Node", "HyperNode") or set(selector) != {"exactMatch"}:
        return None
    return (selector.get("exactMatch") or {}).get("name") or None


def _node_tier_member(hn: Mapping[str, Any]) -> Mapping[str, Any] | None:
    """The Node member of a tier-0 HyperNode the node tier made (its label, its suffix, one exactMatch
    node); None for any other HyperNode, a user's own tier-0 ones included."""
    meta = hn.get("metadata") or {}
    if (meta.get("labels") or {}).get(NODE_TIER_LABEL) != "true" or not str(meta.get("name", "")).endswith(NODE_TIER_SUFFIX):
        return None
    if meta["name"] not in node_tier_members([hn]):
        return None
    member: Mapping[str, Any] = hn["spec"]["members"][0]
    return member if exact_name(member) else None


def _member_key(members: Iterable[Mapping[str, Any]]) -> list[tuple[Any, str | None]]:
    # Compared by what they select, so a member the API server returns with defaults filled in is no change.
    return [(m.get("type"), exact_name(m)) for m in members]


def foreign_owner(hypernode: Mapping[str, Any]) -> str | None:
    """Who else keeps this HyperNode, if anyone: Volcano's discovery (its source label: it rewrites the
    members of what it discovered), a controller (an ownerReference), GitOps (Argo CD's or Flux's marks)
    or another manager (app.kubernetes.io/managed-by). The node tier does not rewrite such a leaf unless
    the user names it (--node-tier-leaf): its writer would undo the change, or fight it."""
    meta = hypernode.get("metadata") or {}
    labels, annotations = meta.get("labels") or {}, meta.get("annotations") or {}
    if TOPOLOGY_SOURCE_LABEL in labels:
        return f"Volcano's HyperNode discovery ({TOPOLOGY_SOURCE_LABEL}={labels[TOPOLOGY_SOURCE_LABEL]})"
    for ref in meta.get("ownerReferences") or []:
        return f"its owner {ref.get('kind')}/{ref.get('name')}"
    for key in (*labels, *annotations):
        if key.startswith(_GITOPS_KEYS):
            return f"GitOps ({key})"
    manager = labels.get(MANAGED_BY_LABEL)
    if manager and manager != OPERATOR_NAME:
        return f"{MANAGED_BY_LABEL}={manager}"
    if "app.kubernetes.io/instance" in labels and manager != OPERATOR_NAME:
        return f"GitOps (app.kubernetes.io/instance={labels['app.kubernetes.io/instance']}: Argo CD's label tracking)"
    return None


_GITOPS_KEYS = ("argocd.argoproj.io/", "kustomize.toolkit.fluxcd.io/", "helm.toolkit.fluxcd.io/")


def unusable_named_leaves(hypernodes: Iterable[Mapping[str, Any]], named_leaves: Collection[str], nodes: Collection[str]) -> dict[str, str]:
    """The leaves named with --node-tier-leaf (chart value nodeTier.leaves) that the node tier cannot
    change, each with why: a typo or a leaf not yet discovered would otherwise be ignored in silence.
    `nodes`: the cluster's nodes; a deleted tier-0 HyperNode of ours stands for its node if it is one."""
    current = {hn["metadata"]["name"]: hn for hn in hypernodes}
    gone = {name for name, member in _gone(current, nodes).items() if exact_name(member) in nodes}

    def holds_nodes(member: Mapping[str, Any]) -> bool:  # a node, or a tier-0 HyperNode of the node tier's
        named = current.get(exact_name(member) or "")
        return member.get("type") == "Node" or (named is not None and _node_tier_member(named) is not None) or exact_name(member) in gone

    why: dict[str, str] = {}
    for name in sorted(named_leaves):
        spec = (current.get(name) or {}).get("spec") or {}
        members = spec.get("members") or []
        if name not in current:
            why[name] = "no HyperNode has this name"
        elif int(spec.get("tier", 1)) == NODE_TIER or not any(holds_nodes(m) for m in members):
            why[name] = "not a leaf (a HyperNode of tier 1 or more with nodes among its members)"
        elif not all(exact_name(m) for m in members):
            why[name] = "its members are not all exactMatch (regexMatch and labelMatch leaves are never rewritten)"
    return why


def plan_node_tier(
    hypernodes: Iterable[Mapping[str, Any]],
    used_gpus: Mapping[str, int],
    allocatable_gpus: Mapping[str, int],
    per_free: int = 2,
    next_empty: int = 1,
    replicas: Collection[Sequence[int]] = (),
    spare_empty: int = SPARE_EMPTY,
    sticky: bool = True,
    keep_pairs: bool = True,
    node_labels: Mapping[str, Mapping[str, str]] | None = None,
    named_leaves: Collection[str] = (),
    enabled: bool = True,
) -> list[Write]:
    """The writes that bring the cluster's HyperNodes (as the API has them, the node tier's own tier-0
    ones included) to the short list for `used_gpus`: tier-0 HyperNodes created first, then leaves
    whose members change (each conditional on the version read), then the node tier's tier-0
    HyperNodes that nothing names any more deleted, so a leaf never names a HyperNode that is not there.
    Nothing to write when the list has not moved. `enabled=False` (the node tier turned off, or
    uninstalled): every leaf gets its nodes back and every tier-0 HyperNode of the node tier goes.

    `allocatable_gpus`: the nodes that take new pods and their GPUs (a node missing is never listed).
    `replicas`: the GPUs of each pod of one replica of each StormService that asks for a topology
    (`whole_node_run`). `sticky`: the partly used nodes listed now stay listed while they qualify.
    The defaults are the rule the operator ships (tests/core/test_node_tier_parity.py holds the Go
    simulator's copy to them).
    `keep_pairs`: see `shortlist`. `node_labels`: every node's labels (what labelMatch members read).

    Never a second parent (Volcano refuses a HyperNode with two, and then places no gang with a network
    topology anywhere in the cluster): a node is listed only if exactly one HyperNode selects it, by
    whatever selector (exactMatch, regexMatch, labelMatch; without `node_labels`, any labelMatch member
    may select any node), and its tier-0 HyperNode is named by that leaf alone. Only leaves whose
    members are all exactMatch are changed, none kept by another writer (`foreign_owner`) unless named
    in `named_leaves`, and only tier-0 HyperNodes labelled as the node tier's are created or deleted:
    a user's own are left alone. A leaf that names a tier-0 HyperNode of the node tier but may not keep
    it (another writer took it over, or a second leaf names it) gets the node back.
    """
    current = {hn["metadata"]["name"]: hn for hn in hypernodes}
    ours = {name: member for name, hn in current.items() if (member := _node_tier_member(hn)) is not None}
    # A leaf may name a tier-0 HyperNode of the node tier's that is gone (deleted by hand, a deposed
    # leader's late delete, a create that failed): its node is then in no domain at all. Read as that
    # node, so the leaf is written again (named again, or given the node back).
    mine = {**_gone(current, {*allocatable_gpus, *(node_labels or {})}), **ours}
    selectors = _selecting(current, ours, mine, node_labels, allocatable_gpus)
    named_by: dict[str, list[str]] = {}  # a tier-0 HyperNode of ours -> the HyperNodes that name it
    for name, hn in current.items():
        for m in (hn.get("spec") or {}).get("members") or []:
            if m.get("type") == "HyperNode" and (child := exact_name(m) or "") in mine and name not in ours:
                named_by.setdefault(child, []).append(name)
    leaves: list[dict[str, Any]] = []  # the eligible leaves, each tier-0 HyperNode of ours unfolded into its node
    restored: list[dict[str, Any]] = []  # leaves that name ours but may not keep them: unfolded, nothing listed
    others: list[Mapping[str, Any]] = []  # every other HyperNode: what it names stays
    for name, hn in sorted(current.items()):
        if name in ours:
            continue
        spec = hn.get("spec") or {}
        members = spec.get("members") or []
        names_mine = any(m.get("type") == "HyperNode" and exact_name(m) in mine for m in members)
        unfolded = [mine[n] if m.get("type") == "HyperNode" and (n := exact_name(m) or "") in mine else m for m in members]
        exact = int(spec.get("tier", 1)) != NODE_TIER and members and all(exact_name(m) for m in members)
        if enabled and exact and any(m.get("type") == "Node" for m in unfolded) and (name in named_leaves or foreign_owner(hn) is None):
            leaves.append({**hn, "spec": {**spec, "members": unfolded}})
        elif names_mine:
            restored.append({**hn, "spec": {**spec, "members": unfolded}})
        else:
            others.append(hn)

    # The short list over the eligible leaves only, sized by the nodes' allocatable GPUs (a tree read from
    # HyperNodes knows no sizes). A node that another HyperNode selects too, or whose tier-0 name someone
    # else's HyperNode has or another leaf names, is not listed: its tier-0 HyperNode would get two parents.
    switches: dict[str, Switch] = {}
    nodes: dict[str, NodeSpec] = {}
    for leaf in leaves:
        name = leaf["metadata"]["name"]
        members = tuple(
            node
            for m in leaf["spec"]["members"]
            if m.get("type") == "Node"
            and (node := exact_name(m))
            and selectors.get(node) == {name}
            and set(named_by.get(node_hypernode_name(node), [name])) == {name}
        )
        switches[name] = Switch(name, int(leaf["spec"].get("tier", 1)), None, (), members)
        for node in members:
            nodes.setdefault(node, NodeSpec(node, name, allocatable_gpus.get(node, 0), "0", "0"))
    run = whole_node_run(replicas, max((n.gpus for n in nodes.values()), default=0))  # the largest node of these leaves
    keep = {node for member in ours.values() if (node := exact_name(member))} if sticky else set()
    listed = [
        n
        for n in shortlist(
            Topology(switches, nodes), used_gpus, per_free, next_empty, run, spare_empty=spare_empty, keep=keep, keep_pairs=keep_pairs
        )
        if node_hypernode_name(n) in mine or node_hypernode_name(n) not in current
    ]

    desired = node_tier_manifests(leaves, listed) + restored
    creates: list[Write] = [CreateHyperNode(m) for m in desired if m["spec"]["tier"] == NODE_TIER and m["metadata"]["name"] not in current]
    updates: list[Write] = [
        SetHyperNodeMembers(name, m["spec"]["members"], (current[name].get("metadata") or {}).get("resourceVersion"))
        for m in desired
        if m["spec"]["tier"] != NODE_TIER
        and _member_key(m["spec"]["members"]) != _member_key(current[name := m["metadata"]["name"]]["spec"]["members"])
    ]
    named = {
        exact_name(m)
        for hn in [*(m for m in desired if m["spec"]["tier"] != NODE_TIER), *others]
        for m in (hn.get("spec") or {}).get("members") or []
        if m.get("type") == "HyperNode"
    }
    deletes: list[Write] = [
        DeleteHyperNode(name, (current[name].get("metadata") or {}).get("resourceVersion")) for name in sorted(ours) if name not in named
    ]
    return creates + updates + deletes


def _gone(current: Mapping[str, Mapping[str, Any]], known: Collection[str]) -> dict[str, dict[str, Any]]:
    """Names of tier-0 HyperNodes of the node tier that a HyperNode names but that do not exist -> the
    Node member they stood for: from the nodes known (the name shortened with a digest), else the name
    without its suffix where that is the node's tier-0 name."""
    by_name = {node_hypernode_name(node): node for node in known}
    out: dict[str, dict[str, Any]] = {}
    for hn in current.values():
        for m in (hn.get("spec") or {}).get("members") or []:
            name = exact_name(m) if m.get("type") == "HyperNode" else None
            if not name or name in current or not name.endswith(NODE_TIER_SUFFIX):
                continue
            node = by_name.get(name) or name.removesuffix(NODE_TIER_SUFFIX)
            if node_hypernode_name(node) == name:
                out[name] = {"type": "Node", "selector": {"exactMatch": {"name": node}}}
    return out


def _selecting(
    current: Mapping[str, Mapping[str, Any]],
    ours: Mapping[str, Mapping[str, Any]],
    mine: Mapping[str, Mapping[str, Any]],
    node_labels: Mapping[str, Mapping[str, str]] | None,
    allocatable_gpus: Mapping[str, int],
) -> dict[str, set[str]]:
    """Each node -> the HyperNodes that select it (a tier-0 HyperNode of ours counts as its parent). A
    labelMatch member read without the nodes' labels may select any node: it counts for every one."""
    names = {*allocatable_gpus, *(node_labels or {})}
    for hn in current.values():
        names |= {n for m in (hn.get("spec") or {}).get("members") or [] if m.get("type") == "Node" and (n := exact_name(m))}
    labels: Mapping[str, Mapping[str, str]] = node_labels if node_labels is not None else {n: {} for n in names}
    named = {n: labels.get(n, {}) for n in names}
    lookup = NodeLookup(named)  # one for every member (at 16,384 nodes a scan per member cost seconds)
    out: dict[str, set[str]] = {}
    for name, hn in current.items():
        if name in ours:
            continue
        for m in (hn.get("spec") or {}).get("members") or []:
            if m.get("type") == "HyperNode" and (child := exact_name(m) or "") in mine:
                selected = {exact_name(mine[child]) or ""}
            elif m.get("type") == "Node":
                selector = m.get("selector") or {}
                blind = "labelMatch" in selector and node_labels is None
                selected = set(names) if blind else selected_nodes(selector, named, lookup)
            else:
                continue
            for node in selected:
                out.setdefault(node, set()).add(name)
    return out
