"""`stormtopo explain NAMESPACE/STORMSERVICE`: where each replica landed, or why it is Pending, by the
operator's own planner (core/replica.py) over what the API says now."""

from __future__ import annotations

import time
from collections.abc import Mapping
from typing import Any

from rich.console import Console

from stormtopo.commands.report import NotFound, cluster_view, print_report
from stormtopo.core.explanation import allowed_tier, explain
from stormtopo.core.moves import recorded_time
from stormtopo.core.narrowing import narrowed_tier, narrowing_ends, narrowing_held
from stormtopo.core.placement import is_held_for_room, is_live, placement_record
from stormtopo.core.priority import known_replica_priority
from stormtopo.core.priority import priority_values as class_values
from stormtopo.core.replica import ReplicaSnapshot, gang_name, replica_state
from stormtopo.core.request import RequestError, request_of
from stormtopo.core.spread import replicas_per_domain, spread_tier
from stormtopo.core.vocabulary import AIBRIX, DOMAIN_GATE, ROOM_GATE, STORMSERVICE_LABEL, VOLCANO_SCHEDULING
from stormtopo.core.volcano_conf import SchedulerConf
from stormtopo.kube.client import Api, Forbidden, Unauthorized
from stormtopo.kube.errors import KubeError
from stormtopo.operator.room import NodeRoom
from stormtopo.operator.scheduler_conf import read_scheduler_conf

__all__ = ["NotFound", "explain_stormservice", "render", "run"]


def run(api: Api, namespace: str, name: str, console: Console, output: str = "text", scheduler_configmap: str = "") -> int:
    """Print where each replica landed or why it is Pending: as text, or as json or yaml for tools; with
    `scheduler_configmap` (NAMESPACE/NAME), whether Volcano's scheduler preempts for a Pending replica."""
    report = explain_stormservice(api, namespace, name, scheduler_configmap)
    print_report(report, render, console, output)
    return 1 if report.get("invalid") else 0


def explain_stormservice(api: Api, namespace: str, name: str, scheduler_configmap: str = "") -> dict[str, Any]:
    """The same state the operator's planner reads, as data."""
    stormservice = api.get(AIBRIX, "stormservices", namespace, name)
    if stormservice is None:
        raise NotFound(f"StormService {namespace}/{name} not found")
    room = NodeRoom.read(api)  # the operator's reading: each node's free GPUs and the pods that hold them
    free, holders, gangs = room.free_now(taking_new_pods=False), room.holders_now(), room.gangs_now()
    values = priority_values(api)
    volcano = _scheduler_conf(api, scheduler_configmap) if values is not None else None
    topology, tiers = cluster_view(api)
    request = request_of(stormservice, tiers)
    report: dict[str, Any] = {"namespace": namespace, "stormservice": name}
    if isinstance(request, RequestError):
        return {**report, "invalid": str(request)}
    report["request"] = request.describe() if request else None
    report["replicas"] = []
    rolesets = api.list_objects(AIBRIX, "rolesets", namespace, label_selector=f"{STORMSERVICE_LABEL}={name}")
    bound: dict[str, list[str]] = {}  # replica -> the nodes its pods are bound to
    for roleset in sorted(rolesets, key=lambda r: r["metadata"]["name"]):
        replica = roleset["metadata"]["name"]
        group = gang_name(stormservice, roleset, request)
        podgroup = api.get(VOLCANO_SCHEDULING, "podgroups", namespace, group)
        pods = tuple(api.pods_of_group(namespace, replica))
        state = replica_state(ReplicaSnapshot(roleset, stormservice, pods, podgroup, tiers, topology, all_pods=True, now=time.monotonic()))
        nodes = sorted(p["spec"]["nodeName"] for p in state.bound)
        bound[replica] = nodes
        entry: dict[str, Any] = {
            "replica": replica,
            "podGroup": group,
            "phase": ((podgroup or {}).get("status") or {}).get("phase", "no PodGroup"),
            "bound": len(nodes),
            "pods": len(state.wanted),
        }
        held = request is not None and narrowing_held(podgroup) is not None  # its PodGroup hard by it, not by a move
        narrowed = narrowed_tier(podgroup, request, tiers, time.time()) if held and request else None
        if narrowed is not None:  # a soft replica held hard while Volcano preempts for it (core/narrowing.py)
            entry["narrowed"] = {"tier": narrowed, "until": recorded_time(narrowing_ends(podgroup) or 0.0)}
        gated = {"room": sum(1 for p in pods if is_held_for_room(p) and is_live(p)), "spread": len(state.held)}
        if any(gated.values()):  # pods Volcano does not see yet: why, and where its Events say more
            entry["held"] = gated
        if state.created and state.complete:
            entry["placed"] = placement_record(topology, nodes)
        else:
            tier = allowed_tier(request, topology) if request else None
            if tier is not None:
                priority = gang_priority(podgroup, roleset, values)
                # (nothing of preemption without a priority)
                explanation = explain(topology, free, state.wanted, tier, holders, priority, gangs, volcano)
                entry["pending"] = {"fits": explanation.fits, "explanation": explanation.render()}
        report["replicas"].append(entry)
    tier = spread_tier(request, topology)
    if tier is not None:
        report["spread"] = {"tier": tier, "domains": replicas_per_domain(topology, tier, bound)}
    return report


def _scheduler_conf(api: Api, configmap: str) -> SchedulerConf | None:
    """Volcano's scheduler configuration where it can be read; else nothing is said of it (the operator's
    Warning reads it the same way)."""
    if not configmap:
        return None
    try:
        read = read_scheduler_conf(api, configmap)
    except KubeError:
        return None
    return read if isinstance(read, SchedulerConf) else None


def priority_values(api: Api) -> dict[str, int] | None:
    """Every PriorityClass's value, and the cluster's default (core/priority.py), as the operator reads them;
    None where this user may not list them (then nothing is said of preemption)."""
    try:
        classes = api.list_objects(("scheduling.k8s.io", "v1"), "priorityclasses")
    except (Forbidden, Unauthorized):
        return None
    return class_values(classes)


def gang_priority(podgroup: Mapping[str, Any] | None, roleset: Mapping[str, Any], values: Mapping[str, int] | None) -> int | None:
    """The priority Volcano ranks the gang by: its PodGroup's class (what stormtopo writes there, or
    AIBrix), else the class stormtopo would write (core/priority.py)."""
    if values is None:
        return None
    named = ((podgroup or {}).get("spec") or {}).get("priorityClassName")
    if isinstance(named, str) and named:
        return values.get(named)  # a class that does not exist (any more): nothing is said of preemption
    return known_replica_priority(roleset.get("spec") or {}, values)


def render(report: Mapping[str, Any]) -> list[str]:
    where = f"{report['namespace']}/{report['stormservice']}"
    if report.get("invalid"):
        return [f"{where}: invalid network-topology request, nothing is applied: {report['invalid']}"]
    lines = [f"{where}: {report['request'] or 'no network-topology request'}"]
    if not report["replicas"]:
        lines.append("  no replicas (RoleSets) yet")
    for entry in report["replicas"]:
        placed = entry.get("placed")
        gang = f"PodGroup {entry['podGroup']} {entry['phase']}"
        if placed:
            at = f"{placed['hyperNode']} (tier {placed['tier']})" if placed["hyperNode"] else "no common HyperNode"
            lines.append(f"  replica {entry['replica']}: placed in {at} on {', '.join(placed['nodes'])}; {gang}")
            continue
        lines.append(f"  replica {entry['replica']}: {entry['bound']}/{entry['pods']} pods bound; {gang}")
        narrowed = entry.get("narrowed")
        if narrowed:
            lines.append(
                f"    held hard within tier {narrowed['tier']} until {narrowed['until']}, so that Volcano's gangpreempt takes its "
                "victims within one domain (stormtopo.io/narrowed); then as its request asks"
            )
        held = entry.get("held") or {}
        if held.get("room"):
            lines.append(
                f"    {held['room']} pod(s) held at stormtopo's gate {ROOM_GATE} while it plans how the replica preempts (at most "
                "the preemption hold, 30 s by default, from its oldest pod): its Events say what it decided (ReplicaNarrowed, "
                "ReplicaNotNarrowed, ReplicaWaitingForRoom, ReplicaPreempting, ReplicaLetGo)"
            )
        if held.get("spread"):
            lines.append(
                f"    {held['spread']} pod(s) held at stormtopo's gate {DOMAIN_GATE} until a sibling replica is placed "
                "(replicas of a spread service are let go one at a time)"
            )
        pending = entry.get("pending")
        if pending:
            verdict = "capacity exists; Volcano should place it in its next cycles" if pending["fits"] else "it cannot be placed now"
            lines.append(f"    {verdict}: {pending['explanation']}")
    spread = report.get("spread")
    if spread:
        lines.append(f"  replicas per tier-{spread['tier']} domain (spread over tier {spread['tier']}):")
        lines += [f"    {domain}: {', '.join(replicas) or 'none'}" for domain, replicas in spread["domains"].items()]
    return lines
