"""`stormtopo explain NAMESPACE/STORMSERVICE`: where each replica landed, or why it is Pending, by the
operator's own planner (core/replica.py) over what the API says now."""

from __future__ import annotations

import time

from rich.console import Console

from stormtopo.core.capabilities import cluster_tiers
from stormtopo.core.explanation import allowed_tier, explain
from stormtopo.core.placement import placement_record
from stormtopo.core.replica import ReplicaSnapshot, gang_name, replica_state
from stormtopo.core.request import RequestError, request_of
from stormtopo.core.topology.hypernodes import topology_from_hypernodes
from stormtopo.core.vocabulary import AIBRIX, PODGROUP_CRD, STORMSERVICE_LABEL, VOLCANO_SCHEDULING, VOLCANO_TOPOLOGY
from stormtopo.kube.client import Api


class NotFound(LookupError):
    pass


def run(api: Api, namespace: str, name: str, console: Console) -> int:
    stormservice = api.get(AIBRIX, "stormservices", namespace, name)
    if stormservice is None:
        raise NotFound(f"StormService {namespace}/{name} not found")
    hypernodes = api.list_objects(VOLCANO_TOPOLOGY, "hypernodes")
    free = api.free_gpus()
    topology = topology_from_hypernodes(hypernodes, api.node_labels())  # every node: HyperNodes may select by regex or label
    tiers = cluster_tiers(hypernodes, api.crd_schema(PODGROUP_CRD))
    request = request_of(stormservice, tiers)
    if isinstance(request, RequestError):
        console.print(f"{namespace}/{name}: invalid network-topology request, nothing is applied: {request}", highlight=False)
        return 1
    console.print(f"{namespace}/{name}: {request.describe() if request else 'no network-topology request'}", highlight=False)
    rolesets = api.list_objects(AIBRIX, "rolesets", namespace, label_selector=f"{STORMSERVICE_LABEL}={name}")
    if not rolesets:
        console.print("  no replicas (RoleSets) yet")
    for roleset in sorted(rolesets, key=lambda r: r["metadata"]["name"]):
        replica = roleset["metadata"]["name"]
        group = gang_name(stormservice, roleset, request)
        podgroup = api.get(VOLCANO_SCHEDULING, "podgroups", namespace, group)
        phase = ((podgroup or {}).get("status") or {}).get("phase", "no PodGroup")
        pods = tuple(api.pods_of_group(namespace, replica))
        state = replica_state(ReplicaSnapshot(roleset, stormservice, pods, podgroup, tiers, topology, all_pods=True, now=time.monotonic()))
        nodes = sorted(p["spec"]["nodeName"] for p in state.bound)
        if state.created and state.complete:
            record = placement_record(topology, nodes)
            where = f"{record['hyperNode']} (tier {record['tier']})" if record["hyperNode"] else "no common HyperNode"
            console.print(f"  replica {replica}: placed in {where} on {', '.join(nodes)}; PodGroup {group} {phase}", highlight=False)
            continue
        console.print(f"  replica {replica}: {len(nodes)}/{len(state.wanted)} pods bound; PodGroup {group} {phase}", highlight=False)
        tier = allowed_tier(request, topology) if request else None
        if tier is None:
            continue
        explanation = explain(topology, free, state.wanted, tier)
        verdict = "capacity exists; Volcano should place it in its next cycles" if explanation.fits else "it cannot be placed now"
        console.print(f"    {verdict}: {explanation.render()}", highlight=False)
    return 0
