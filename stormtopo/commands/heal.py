"""`stormtopo heal NAMESPACE/STORMSERVICE --dry-run`: which replicas healing would move now, where to and
why, or why not; by the operator's own planner (core/heal_pass.py plan_alone: a pass of this one service,
against the cluster's moves under way and its cap) over what the API says now. For a wide replica with
nowhere to go, also which replica of another opted-in service an operator started with --heal-make-room
would move out of its way (core/room.py). It never moves anything: the operator moves replicas of
StormServices annotated stormtopo.io/heal: "true"."""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from rich.console import Console

from stormtopo.commands.explain import priority_values
from stormtopo.commands.report import NotFound, cluster_view, print_report
from stormtopo.core.cluster_moves import moves_under_way
from stormtopo.core.heal_pass import ServicePlan, ServiceReading, in_play, plan_alone
from stormtopo.core.heal_request import wants_healing
from stormtopo.core.heal_snapshot import HealSnapshot
from stormtopo.core.movable import not_movable_reason, prefix_sharing, shares_prefix_with
from stormtopo.core.replica_pods import Replica
from stormtopo.core.request import RequestError, request_of
from stormtopo.core.room import Resident
from stormtopo.core.room_search import RoomSearch, lenders, next_offer, wide_waiting
from stormtopo.core.topology.node_tier import node_tier_members
from stormtopo.core.vocabulary import AIBRIX, MOVES_ANNOTATION, PLACEMENT_ANNOTATION, ROLESET_LABEL, STORMSERVICE_LABEL, VOLCANO_TOPOLOGY
from stormtopo.kube.client import Api, ApiError
from stormtopo.operator.room import NodeRoom

__all__ = ["NotFound", "heal_report", "render", "run"]


def run(api: Api, namespace: str, name: str, console: Console, output: str = "text") -> int:
    report = heal_report(api, namespace, name)
    print_report(report, render, console, output, soft_wrap=True)  # one line per replica, whatever the width
    return 1 if report.get("invalid") else 0


def heal_snapshot(api: Api, namespace: str, name: str) -> HealSnapshot:
    """What the operator's healing pass reads for one StormService, read the same way."""
    stormservice = api.get(AIBRIX, "stormservices", namespace, name)
    if stormservice is None:
        raise NotFound(f"StormService {namespace}/{name} not found")
    topology, tiers = cluster_view(api)
    pods = api.raw_list(f"/api/v1/namespaces/{namespace}/pods", labelSelector=f"{STORMSERVICE_LABEL}={name}")
    rolesets = api.list_objects(AIBRIX, "rolesets", namespace, label_selector=f"{STORMSERVICE_LABEL}={name}")
    replicas = tuple(Replica.of(r, pods) for r in sorted(rolesets, key=lambda r: r["metadata"]["name"]))
    room = NodeRoom.read(api)  # the operator's reading of room, GPUs and where pods could run at all
    budgets = tuple(api.disruption_budgets(namespace))
    return HealSnapshot(stormservice, replicas, tiers, topology, room.free_now(), budgets, time.time(), nodes=room.facts_now())


def heal_report(api: Api, namespace: str, name: str) -> dict[str, Any]:
    snapshot = heal_snapshot(api, namespace, name)
    report: dict[str, Any] = {"namespace": namespace, "stormservice": name, "healing": wants_healing(snapshot.stormservice)}
    request = request_of(snapshot.stormservice, snapshot.tiers)
    if isinstance(request, RequestError):
        return {**report, "invalid": str(request)}
    report["request"] = request.describe() if request else None
    if report["healing"]:  # the operator heals it only while no other service shares its pods' name prefix
        try:
            names = [str(s["metadata"]["name"]) for s in api.list_objects(AIBRIX, "stormservices", namespace)]
        except ApiError as exc:
            report["movableUnknown"] = str(exc)
        else:
            if (other := shares_prefix_with(name, names)) is not None:
                report["notMovable"] = not_movable_reason(name, other)
    key = (namespace, name)
    services: dict[tuple[str, str], Mapping[str, Any]] = {}
    try:
        services = services_in_play(api)
        planned = pass_plan(api, snapshot, key, services)
    except ApiError as exc:  # no right to list StormServices in every namespace: the plan as if nothing else moved
        planned, report["movesUnknown"] = plan_alone(snapshot, key, {}, ()), str(exc)
    plan = planned.plan
    try:
        rooms = rooms_made(snapshot, planned, {**services, key: snapshot.stormservice}, lambda: read_lenders(api, snapshot, key))
    except ApiError as exc:  # e.g. no right to list StormServices in every namespace: the rest still holds
        rooms, report["makeRoomUnknown"] = {}, str(exc)
    report["replicas"] = [
        {
            "replica": v.replica,
            "span": v.span,
            "wide": v.why is not None,
            **({"why": str(v.why)} if v.why else {}),
            **({"to": v.target.switch.name, "toTier": v.target.switch.tier, "freeGPUs": v.target.free_gpus} if v.target else {}),
            **({"blocked": v.blocked} if v.blocked else {}),
            "wouldMove": plan.moving is not None and plan.moving.replica == v.replica,
            **({"makeRoom": rooms[v.replica]} if v.replica in rooms else {}),
        }
        for v in plan.verdicts
    ]
    if plan.moving is not None:
        try:
            policies = api.list_objects(("admissionregistration.k8s.io", "v1"), "validatingadmissionpolicies")
        except ApiError as exc:  # no right to read them: say so, the rest still holds
            report["policyUnknown"] = str(exc)
        else:
            if refusal := refusing_policy(policies):
                report["policyRefuses"] = refusal
    return report


def services_in_play(api: Api) -> dict[tuple[str, str], Mapping[str, Any]]:
    """Every StormService a healing pass looks at, as the operator's index holds them (core/heal_pass.py in_play)."""
    return {(s["metadata"].get("namespace", ""), s["metadata"]["name"]): s for s in api.list_objects(AIBRIX, "stormservices") if in_play(s)}


def pass_plan(api: Api, snapshot: HealSnapshot, key: tuple[str, str], services: Mapping[tuple[str, str], Mapping[str, Any]]) -> ServicePlan:
    """The plan the operator's healing pass would make of this service now (core/heal_pass.py plan_alone):
    every StormService in play read for the cluster's moves, and the replicas of those with moves recorded."""
    moving = tuple(service_reading(api, k, s) for k, s in services.items() if moves_under_way(s, snapshot.now))
    return plan_alone(snapshot, key, services, moving)


def service_reading(api: Api, key: tuple[str, str], stormservice: Mapping[str, Any]) -> ServiceReading:
    """A StormService with moves recorded, each RoleSet with its pods: what the pass sets aside for its moves."""
    namespace, name = key
    pods = api.raw_list(f"/api/v1/namespaces/{namespace}/pods", labelSelector=f"{STORMSERVICE_LABEL}={name}")
    rolesets = api.list_objects(AIBRIX, "rolesets", namespace, label_selector=f"{STORMSERVICE_LABEL}={name}")
    return ServiceReading(key, stormservice, tuple((r, Replica.of(r, pods).pods) for r in rolesets))


def refusing_policy(policies: Sequence[Mapping[str, Any]]) -> str | None:
    """Whether an installed chart's policy would refuse the move's first write: an older chart's own-keys-only
    policy let stormtopo write stormtopo.io/placement on a StormService, not its move record, and healing
    then moved nothing under that chart."""
    for policy in policies:
        name = str(policy["metadata"]["name"])
        text = json.dumps((policy.get("spec") or {}).get("validations") or [])
        if name.endswith("own-keys-only") and PLACEMENT_ANNOTATION in text and MOVES_ANNOTATION not in text:
            return (
                f"the installed admission policy {name} lets stormtopo write {PLACEMENT_ANNOTATION} but not its move record "
                f"{MOVES_ANNOTATION}: the operator's move would be refused (a HealingRefused Warning); upgrade the chart"
            )
    return None


@dataclass(frozen=True)
class Lenders:
    """What making room's search reads beyond the service: the replicas that may be moved, every node's
    allocatable GPUs, the node tier's short list and each PriorityClass's value."""

    residents: tuple[Resident, ...]
    allocatable: Mapping[str, int]
    listed: frozenset[str] = frozenset()
    priorities: Mapping[str, int] = field(default_factory=dict)


def read_lenders(api: Api, snapshot: HealSnapshot, own: tuple[str, str]) -> Lenders:
    values = priority_values(api) or {}  # none where this user may not list them: every replica counts as 0
    listed = frozenset(node_tier_members(api.list_objects(VOLCANO_TOPOLOGY, "hypernodes")).values())
    tiers = replace(snapshot.tiers, priority_values=tuple(sorted(values.items())))
    return Lenders(tuple(residents(api, replace(snapshot, tiers=tiers), own)), api.gpu_totals(), listed, values)


def rooms_made(
    snapshot: HealSnapshot, planned: ServicePlan, services: Mapping[tuple[str, str], Mapping[str, Any]], read: Callable[[], Lenders]
) -> dict[str, dict[str, Any]]:
    """For each wide replica with nowhere to go that the operator's pass would make room for now (its pass's
    `no_room`, then core/room_search.py wide_waiting over every service in play: none while a move to make room
    is under way, none within its cool-down, the highest priority first), the first replica of another service
    that lends room that the operator's search (next_offer) would offer to move out of its way: not one on the
    node tier's short list, nor one of higher priority, nor one where the wide replica's pods could not run (its
    own plan may still refuse it: a budget, not ready). The others are read only if needed."""
    if not planned.heal_pass.no_room:
        return {}
    lenders_read = read()
    waiting = wide_waiting(planned.heal_pass.no_room, list(services.values()), snapshot.now, snapshot.cooldown, lenders_read.priorities)
    out = {}
    for wide in waiting:
        search = RoomSearch(
            (wide,),
            lenders_read.residents,
            lenders_read.allocatable,
            snapshot.nodes,
            snapshot.topology,
            lenders_read.listed,
            lenders_read.priorities,
        )
        if (offer := next_offer(search, planned.snapshot.free)) is not None:
            room = offer.room
            out[wide[1].name] = {
                "replica": room.resident.replica,
                "stormservice": f"{room.resident.namespace}/{room.resident.stormservice}",
                "to": room.to.switch.name,
                "frees": room.frees.switch.name,
            }
    return out


def residents(api: Api, snapshot: HealSnapshot, own: tuple[str, str]) -> list[Resident]:
    """Replicas of the other StormServices that lend room and may make it, as the operator finds them
    (core/room_search.py lenders), and only of services whose pods the eviction policy can tell apart (no other
    StormService of the namespace shares their RoleSet name prefix): three cluster-wide lists (StormServices,
    their RoleSets, their pods), not a read per service."""
    everything = api.list_objects(AIBRIX, "stormservices")
    names: dict[str, list[str]] = {}
    for s in everything:
        names.setdefault(str(s["metadata"].get("namespace", "")), []).append(str(s["metadata"]["name"]))
    shared = {(namespace, name) for namespace, listed in names.items() for name in prefix_sharing(listed)}
    services = {
        key: s
        for s in everything
        if wants_healing(s) and (key := (str(s["metadata"].get("namespace", "")), str(s["metadata"]["name"]))) != own and key not in shared
    }
    if not services:
        return []
    pods: dict[tuple[str, str], list[dict[str, Any]]] = {}
    for pod in api.raw_list("/api/v1/pods", labelSelector=ROLESET_LABEL):
        labels = pod["metadata"].get("labels") or {}
        pods.setdefault((pod["metadata"].get("namespace", ""), labels[ROLESET_LABEL]), []).append(pod)
    found = []
    for roleset in api.list_objects(AIBRIX, "rolesets", label_selector=STORMSERVICE_LABEL):
        meta = roleset["metadata"]
        service = services.get((meta.get("namespace", ""), (meta.get("labels") or {}).get(STORMSERVICE_LABEL, "")))
        if service is not None:
            found.append((service, roleset, pods.get((meta.get("namespace", ""), meta["name"]), [])))
    return lenders(found, snapshot.tiers, snapshot.topology, snapshot.now, snapshot.cooldown)


def render(report: Mapping[str, Any]) -> list[str]:
    where = f"{report['namespace']}/{report['stormservice']}"
    if report.get("invalid"):
        return [f"{where}: invalid network-topology request, nothing would move: {report['invalid']}"]
    if not report["request"]:
        return [f"{where}: no network-topology request: nothing to heal"]
    lines = [f"{where}: {report['request']}"]
    if not report["healing"]:
        lines.append('  not opted in to healing (stormtopo.io/heal: "true"): the operator moves nothing; as if it were:')
    elif report.get("notMovable"):
        lines.append(f"  {report['notMovable']}: the operator moves nothing; as if it did:")
    elif report.get("movableUnknown"):
        lines.append(f"  whether another StormService shares its RoleSet name prefix is unknown: {report['movableUnknown']}")
    if not report["replicas"]:
        lines.append("  no replicas (RoleSets) yet")
    for entry in report["replicas"]:
        if not entry["wide"] and entry.get("blocked"):
            lines.append(f"  replica {entry['replica']}: not judged: {entry['blocked']}")
        elif not entry["wide"]:
            lines.append(f"  replica {entry['replica']}: {entry['span']}, within its request: stays")
        elif entry["wouldMove"]:
            lines.append(
                f"  replica {entry['replica']}: {entry['span']} ({entry['why']}): would move to {entry['to']} "
                f"(tier {entry['toTier']}, {entry['freeGPUs']} free GPUs)"
            )
        else:
            lines.append(f"  replica {entry['replica']}: {entry['span']} ({entry['why']}): stays: {entry.get('blocked', '')}")
        if room := entry.get("makeRoom"):
            lines.append(
                f"    with --heal-make-room: replica {room['replica']} of StormService {room['stormservice']} would first move "
                f"to {room['to']}, making room in {room['frees']}"
            )
    if report.get("policyRefuses"):
        lines.append(f"  but: {report['policyRefuses']}")
    if report.get("policyUnknown"):
        lines.append(f"  whether the installed admission policies allow the move is unknown: {report['policyUnknown']}")
    if report.get("movesUnknown"):
        lines.append(f"  planned as if no other replica were moving (the cluster's moves and its cap unknown): {report['movesUnknown']}")
    if report.get("makeRoomUnknown"):
        lines.append(f"  which replica --heal-make-room would move is unknown: {report['makeRoomUnknown']}")
    lines.append("  (dry run: nothing was moved)")
    return lines
