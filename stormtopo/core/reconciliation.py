"""What a StormService's PodGroups should be, against what they are: the writes that close the gap.

A planner over an immutable snapshot of one StormService (its RoleSets and PodGroups, the cluster's
tiers and Volcano's fields). It is level-triggered and idempotent: a snapshot that already matches
plans nothing, so the operator can run it on every event and every resync, after any restart.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from stormtopo.core.gang import requests_resources, template_spec
from stormtopo.core.jsonpatch import set_annotations, set_spec_fields
from stormtopo.core.movable import not_movable_reason
from stormtopo.core.moves import asks_healing, heal_annotation_problem
from stormtopo.core.narrowing import held_tier, released_hold
from stormtopo.core.optin import listing
from stormtopo.core.podgroup import (
    carries_constraint,
    desired_fields,
    has_scheduling_strategy,
    owned_podgroup,
    service_group_name,
    service_podgroup,
    stale_priority_class,
    withdraw,
)
from stormtopo.core.request import ClusterTiers, Mode, RequestError, Scope, TopologyRequest, request_of
from stormtopo.core.switches import SWITCHES, switch_problem
from stormtopo.core.vocabulary import HEAL_ANNOTATION, REQUEST_ANNOTATION
from stormtopo.core.writes import CreatePodGroup, ListOptedIn, PatchPodGroup, PostEvent, Say, Write


@dataclass(frozen=True)
class ServiceSnapshot:
    stormservice: Mapping[str, Any]
    rolesets: tuple[Mapping[str, Any], ...]
    podgroups: Mapping[str, Mapping[str, Any]]  # by name, in the StormService's namespace
    tiers: ClusterTiers
    prefix_shared_with: str | None = None  # another StormService of its namespace its pods could be taken for (core/movable.py)


@dataclass(frozen=True)
class ServicePlan:
    writes: tuple[Write, ...]  # the PodGroups' writes
    verdict: str | None  # what is said of the request; an Event only when it changes
    say: Say | None
    invalid: bool = False
    listing: ListOptedIn | None = None  # what the opted-in list says of it: written before the PodGroups

    def all_writes(self, stormservice: Mapping[str, Any]) -> tuple[Write, ...]:
        """Everything to carry out, in order: the Event, the listing, the PodGroups."""
        said: tuple[Write, ...] = (PostEvent(stormservice, self.say),) if self.say is not None else ()
        listed: tuple[Write, ...] = (self.listing,) if self.listing is not None else ()
        return said + listed + self.writes


def plan_stormservice(snapshot: ServiceSnapshot, said: str | None = None, now: float | None = None) -> ServicePlan:
    """The writes for one StormService, and the Event about its request if it differs from `said`.

    `now` (wall-clock seconds, from the shell: the core reads no clock) ends a move's hold on its
    replica's PodGroup at the move's deadline (core/moves.py); None judges no deadline, as the admission
    webhook must then too."""
    request = request_of(snapshot.stormservice, snapshot.tiers)
    verdict, say = _verdict(snapshot, request)
    if say is not None and verdict == said:
        say = None
    meta = snapshot.stormservice["metadata"]
    scope = listing(snapshot.stormservice, snapshot.prefix_shared_with, snapshot.rolesets)
    listed = ListOptedIn(meta.get("namespace", ""), meta["name"], scope)
    if isinstance(request, RequestError):
        # Bad input changes nothing (the Warning says why), but a move's hold is no request: it is let go.
        return ServicePlan(tuple(_let_go(snapshot)), verdict, say, invalid=True, listing=listed)
    namespace = snapshot.stormservice["metadata"]["namespace"]
    service_group = snapshot.podgroups.get(service_group_name(snapshot.stormservice["metadata"]["name"]))
    writes: list[Write] = []
    if request is not None and request.scope is Scope.STORMSERVICE:
        writes += _service_group(snapshot, request, service_group)
        for roleset in snapshot.rolesets:  # from scope RoleSet: the replicas' own PodGroups carry no constraint now
            writes += withdraw(namespace, snapshot.podgroups.get(roleset["metadata"]["name"]))
    else:
        writes += withdraw(namespace, service_group)
        for roleset in snapshot.rolesets:
            name = roleset["metadata"]["name"]
            podgroup = snapshot.podgroups.get(name)
            held = None if request is None else held_tier(snapshot.stormservice, name, podgroup, request, snapshot.tiers, now)
            writes += _replica_group(namespace, roleset, podgroup, request, held, dict(snapshot.tiers.priority_values))
    return ServicePlan(tuple(writes), verdict, say, listing=listed)


def _verdict(snapshot: ServiceSnapshot, request: TopologyRequest | RequestError | None) -> tuple[str | None, Say | None]:
    if isinstance(request, RequestError):
        kept = any(carries_constraint(snapshot.podgroups.get(r["metadata"]["name"])) for r in snapshot.rolesets)
        outcome = "the last valid request stays applied" if kept else "nothing changed"
        text = f"invalid network-topology request, {outcome}: {request}"
        return text, Say("Warning", "InvalidTopologyRequest", text)
    if request is not None:
        idle = unanchored_roles(snapshot.stormservice)
        if request.mode is Mode.HARD and idle:
            text = (
                f"network-topology request accepted ({request.describe()}), but it cannot be enforced: no role asks for "
                f"resources (roles {', '.join(idle)}), and Volcano places such pods in its backfill action, which ignores "
                "HyperNodes; give at least one role a resource request, and the others follow it into its domain"
            )
            return text, Say("Warning", "TopologyNotEnforceable", text)
        text = f"network-topology request accepted: {request.describe()}"
        heal = heal_annotation_problem(snapshot.stormservice, request.scope is Scope.ROLESET) or not_movable(snapshot)
        others = [p for key in SWITCHES if key != HEAL_ANNOTATION and (p := switch_problem(snapshot.stormservice, key))]
        if heal is not None or others:
            text += "; " + "; ".join([*([heal] if heal else []), *others])
            return text, Say("Warning", "InvalidHealAnnotation" if heal is not None else "InvalidAnnotation", text)
        return text, Say("Normal", "TopologyRequest", text)
    return None, None


def not_movable(snapshot: ServiceSnapshot) -> str | None:
    """Why healing stays off for a service that asks for it, when its pods' names cannot be told apart."""
    if snapshot.prefix_shared_with is None or not asks_healing(snapshot.stormservice):
        return None
    return not_movable_reason(snapshot.stormservice["metadata"]["name"], snapshot.prefix_shared_with)


def unanchored_roles(stormservice: Mapping[str, Any]) -> list[str]:
    """The roles of a replica when none of them asks for resources: nothing anchors it to a domain."""
    roles = template_spec(stormservice).get("roles") or []
    if not roles or any(requests_resources((r.get("template") or {}).get("spec") or {}) for r in roles):
        return []
    return [str(r.get("name", "")) for r in roles]


def _service_group(snapshot: ServiceSnapshot, request: TopologyRequest, current: Mapping[str, Any] | None) -> list[Write]:
    desired = service_podgroup(snapshot.stormservice, request, priorities=dict(snapshot.tiers.priority_values))
    if current is None:
        return [CreatePodGroup(desired)]
    wanted = {k: v for k, v in desired["spec"].items() if k != "queue"}
    ops = set_spec_fields(current.get("spec"), wanted) + stale_priority_class(current, wanted)
    meta = desired["metadata"]
    return [PatchPodGroup(meta["namespace"], meta["name"], ops)] if ops else []


def _replica_group(
    namespace: str,
    roleset: Mapping[str, Any],
    current: Mapping[str, Any] | None,
    request: TopologyRequest | None,
    moving: int | None = None,
    priorities: Mapping[str, int] | None = None,
) -> list[Write]:
    if request is None:
        return list(withdraw(namespace, current))
    if current is None:
        if has_scheduling_strategy(roleset.get("spec") or {}):
            return []  # AIBrix creates its own; the webhook gives it the constraint at creation
        return [CreatePodGroup(owned_podgroup(roleset, request, priorities=priorities))]
    wanted = desired_fields(request, roleset.get("spec") or {}, moving, priorities)
    ops = set_spec_fields(current.get("spec"), wanted) + stale_priority_class(current, wanted)
    # The request annotation marks a constrained gang; without it the pod webhook waits for one forever.
    if REQUEST_ANNOTATION not in ((current.get("metadata") or {}).get("annotations") or {}):
        ops += set_annotations(current, {REQUEST_ANNOTATION: request.record()})
    return [PatchPodGroup(namespace, roleset["metadata"]["name"], ops)] if ops else []


def _let_go(snapshot: ServiceSnapshot) -> list[Write]:
    """While the request is invalid, the PodGroups that a move holds go back to the networkTopology of
    their last valid request (core/narrowing.py released_hold: a move's or a narrowing's); their gang, and every other PodGroup,
    stay as they are."""
    namespace = snapshot.stormservice["metadata"].get("namespace", "")
    defaults = snapshot.tiers.network_topology_defaults
    writes: list[Write] = []
    for roleset in snapshot.rolesets:
        name = roleset["metadata"]["name"]
        podgroup = snapshot.podgroups.get(name)
        topology = released_hold(podgroup, snapshot.stormservice, name, defaults)
        if podgroup is not None and topology is not None:
            writes.append(PatchPodGroup(namespace, name, set_spec_fields(podgroup.get("spec"), {"networkTopology": topology})))
    return writes
