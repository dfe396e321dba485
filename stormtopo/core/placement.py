"""Where a replica landed: its span in the switch tree, the record on the StormService, the domain
labels on its pods, and whether it keeps to its request."""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from stormtopo.core.request import Mode, TopologyRequest
from stormtopo.core.topology.tree import Topology
from stormtopo.core.vocabulary import DOMAIN_GATE, DOMAIN_LABEL_PREFIX, HOSTNAME_LABEL, ROOM_GATE
from stormtopo.core.writes import LabelPod, PatchPod, Say

LABEL_VALUE_LIMIT = 63


def label_value(hypernode: str) -> str:
    """A HyperNode name as a label value: names may be 253 long, label values 63. A long name is
    shortened with a digest of the whole, so two domains never share a value."""
    if len(hypernode) <= LABEL_VALUE_LIMIT:
        return hypernode
    digest = hashlib.sha256(hypernode.encode()).hexdigest()[:10]
    return f"{hypernode[: LABEL_VALUE_LIMIT - 11].rstrip('.-')}-{digest}"


def domain_labels(topology: Topology, node: str) -> dict[str, str]:
    """One label per tier naming the HyperNode above `node`, so a router can pair prefill and decode
    within a domain (as llm-d's and Dynamo's topology-aware routing read such labels)."""
    if node not in topology.nodes:
        return {}
    return {f"{DOMAIN_LABEL_PREFIX}{topology.switches[s].tier}": label_value(s) for s in topology.ancestors(node)}


PLACEMENT_RECORD_VERSION = 1  # of each replica's record in stormtopo.io/placement ("v"; the release before wrote none)


def placement_record(topology: Topology, nodes: Sequence[str]) -> dict[str, object]:
    """Where one replica landed: its lowest common HyperNode, that HyperNode's tier, and its nodes."""
    span = topology.span(nodes)
    tier = topology.switches[span.hypernode].tier if span.hypernode else None
    return {"v": PLACEMENT_RECORD_VERSION, "hyperNode": span.hypernode, "tier": tier, "nodes": sorted(set(nodes))}


def recorded_placement(current: str | None, replica: str) -> Mapping[str, object] | None:
    """`replica`'s record in the placement annotation, if it has one of a version this release reads: its own, or the
    release before's (no version, the same fields), read as its own, so that an upgrade neither says nor records
    again where every replica landed (they get the version when they land anew)."""
    try:
        table = json.loads(current) if current else {}
    except ValueError:
        return None
    record = table.get(replica) if isinstance(table, dict) else None
    if not isinstance(record, dict) or record.get("v", PLACEMENT_RECORD_VERSION) != PLACEMENT_RECORD_VERSION:
        return None
    return {"v": PLACEMENT_RECORD_VERSION, **record}


def merge_placements(current: str | None, replica: str, record: Mapping[str, object], live: Iterable[str]) -> str:
    """The placement annotation with `replica`'s record set and replicas that no longer exist dropped."""
    try:
        table = json.loads(current) if current else {}
        if not isinstance(table, dict):
            table = {}
    except ValueError:
        table = {}
    keep = set(live) | {replica}
    table = {k: v for k, v in table.items() if k in keep}
    table[replica] = dict(record)
    return json.dumps(table, sort_keys=True, separators=(",", ":"))


@dataclass(frozen=True)
class Placed:
    """What to write once a replica's pods are bound."""

    record: Mapping[str, object]
    says: tuple[Say, ...]
    labels: tuple[LabelPod, ...]
    violated: bool


def plan_placed(
    topology: Topology, request: TopologyRequest, allowed_tier: int | None, replica: str, pods: Sequence[Mapping[str, Any]]
) -> Placed | None:
    """The record, the Events and the domain labels of a replica whose pods are bound; None if none is.

    A hard replica that spans more than its tier allows (a pod pinned elsewhere, a pod placed by a
    scheduler that ignores HyperNodes) is marked violated and gets a Warning naming pods and nodes."""
    bound = [p for p in pods if (p.get("spec") or {}).get("nodeName")]
    if not bound:
        return None
    nodes = sorted(p["spec"]["nodeName"] for p in bound)
    record = placement_record(topology, nodes)
    where = f"{record['hyperNode']}, tier {record['tier']}" if record["hyperNode"] else "no common HyperNode"
    says = [Say("Normal", "ReplicaPlaced", f"replica {replica} placed in {where} on {', '.join(sorted(set(nodes)))}")]
    tier = record["tier"]
    # A node outside the tree while the tree has a gap (a leaf naming a HyperNode that is not there) is
    # unknown, not a violation: the violation alert is critical, and a gap closes within a pass.
    unknown = not isinstance(tier, int) and bool(topology.gaps) and not set(nodes) <= topology.nodes.keys()
    violated = request.mode is Mode.HARD and allowed_tier is not None and not unknown and (not isinstance(tier, int) or tier > allowed_tier)
    if violated:
        record = {**record, "violated": True}
        spread = ", ".join(
            f"{p['metadata']['name']} on {p['spec']['nodeName']}" for p in sorted(bound, key=lambda p: p["metadata"]["name"])
        )
        says.append(
            Say(
                "Warning",
                "TopologyViolated",
                f"replica {replica} spans {where}, beyond the allowed tier {allowed_tier} ({request.describe()}): {spread}",
            )
        )
    labels = []
    for pod in bound:
        wanted = domain_labels(topology, pod["spec"]["nodeName"])
        if wanted and any((pod["metadata"].get("labels") or {}).get(k) != v for k, v in wanted.items()):
            labels.append(LabelPod(pod["metadata"].get("namespace", ""), pod["metadata"]["name"], wanted))
    return Placed(record, tuple(says), tuple(labels), violated)


EMPTY_TOPOLOGY = Topology({}, {})


def is_live(pod: Mapping[str, Any]) -> bool:
    """A pod that holds its node: not being deleted, not finished. A terminating or evicted pod is
    no anchor for its replica's domain, and no evidence of a violation."""
    if (pod.get("metadata") or {}).get("deletionTimestamp"):
        return False
    return (pod.get("status") or {}).get("phase") not in ("Succeeded", "Failed")


def is_held(pod: Mapping[str, Any]) -> bool:
    """A pod stormtopo holds at its scheduling gate until its replica's anchor is placed."""
    return held_at(pod, DOMAIN_GATE)


def is_held_for_room(pod: Mapping[str, Any]) -> bool:
    """A pod of a replica that preempts, held until its victims are on their way out (core/preempting.py)."""
    return held_at(pod, ROOM_GATE)


def held_at(pod: Mapping[str, Any], gate: str) -> bool:
    return any(g.get("name") == gate for g in (pod.get("spec") or {}).get("schedulingGates") or [])


def plan_release(
    topology: Topology,
    anchors: Sequence[Mapping[str, Any]],
    expected: int,
    held: Sequence[Mapping[str, Any]],
    hostnames: Mapping[str, str] | None = None,
) -> list[PatchPod]:
    """Release the pods held at their gate into the domain of their replica's bound anchor pods (the
    lowest HyperNode holding them, within the requested tier by construction): a required node
    affinity to that domain's nodes, which Volcano's backfill honours, then the gate removed.
    Kubernetes lets a gated pod's node affinity be set or narrowed, never widened. `topology` must know
    every node of the cluster, so that the domain is the whole HyperNode, not only the anchors' nodes."""
    nodes = [p["spec"]["nodeName"] for p in anchors if (p.get("spec") or {}).get("nodeName")]
    if len(nodes) < expected:
        return []  # wait for every anchor pod (`expected` of them) to be bound
    span = topology.span(nodes)
    domain = sorted(topology.nodes_under(span.hypernode)) if span.hypernode else []  # none: released unconstrained
    return release_into(domain, hostnames or {}, held, DOMAIN_GATE)


def release_into(domain: Sequence[str], hostnames: Mapping[str, str], held: Sequence[Mapping[str, Any]], gate: str) -> list[PatchPod]:
    """Take `gate` off each held pod, with a required node affinity to the domain's nodes (none: let go
    unconstrained)."""
    hosts = by_hostname(domain, hostnames)
    return [PatchPod(p["metadata"].get("namespace", ""), p["metadata"]["name"], _release_ops(p, domain, hosts, gate)) for p in held]


def by_hostname(domain: Sequence[str], hostnames: Mapping[str, str]) -> list[str] | None:
    """The domain as hostname label values, if that names exactly its nodes: each has the label, and no
    node of the cluster shares a value. One requirement, a few bytes a node; by node name it takes a
    term per node (a node-name field selector takes one value): 121 KB at 1,024 nodes."""
    hosts = [hostnames.get(node) or "" for node in domain]
    if not all(hosts) or len(set(hostnames.values())) < len(hostnames):
        return None
    return sorted(hosts)


def _release_ops(
    pod: Mapping[str, Any], domain: Sequence[str], hosts: Sequence[str] | None, name: str = DOMAIN_GATE
) -> list[dict[str, Any]]:
    spec = pod.get("spec") or {}
    gate = next(i for i, g in enumerate(spec.get("schedulingGates") or []) if g.get("name") == name)
    ops: list[dict[str, Any]] = [
        {"op": "test", "path": f"/spec/schedulingGates/{gate}/name", "value": name},
        {"op": "remove", "path": f"/spec/schedulingGates/{gate}"},
    ]
    if not domain:
        return ops  # no anchor, or one on nodes no HyperNode holds: nothing to keep it within
    within = {"key": HOSTNAME_LABEL, "operator": "In", "values": list(hosts or domain)}
    affinity = spec.get("affinity") or {}
    node_affinity = affinity.get("nodeAffinity") or {}
    required = node_affinity.get("requiredDuringSchedulingIgnoredDuringExecution") or {}
    terms = required.get("nodeSelectorTerms") or []
    if terms:
        # A gated pod's terms may only be narrowed, not multiplied: each gets the domain as a requirement.
        base = "/spec/affinity/nodeAffinity/requiredDuringSchedulingIgnoredDuringExecution/nodeSelectorTerms"
        for i, term in enumerate(terms):
            ops.append(
                {"op": "add", "path": f"{base}/{i}/matchExpressions/-", "value": within}
                if term.get("matchExpressions")
                else {"op": "add", "path": f"{base}/{i}/matchExpressions", "value": [within]}
            )
        return ops
    if hosts is not None:
        each = [{"matchExpressions": [within]}]
    else:  # exact whatever the nodes' labels: one term per node, by name (terms are ORed)
        each = [{"matchFields": [{"key": "metadata.name", "operator": "In", "values": [node]}]} for node in domain]
    wanted = {"requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": each}}
    if node_affinity:
        ops.append(
            {
                "op": "add",
                "path": "/spec/affinity/nodeAffinity/requiredDuringSchedulingIgnoredDuringExecution",
                "value": wanted["requiredDuringSchedulingIgnoredDuringExecution"],
            }
        )
    elif affinity:
        ops.append({"op": "add", "path": "/spec/affinity/nodeAffinity", "value": wanted})
    else:
        ops.append({"op": "add", "path": "/spec/affinity", "value": {"nodeAffinity": wanted}})
    return ops
