"""Desired Volcano PodGroups: the fields stormtopo owns on a replica's PodGroup, and the PodGroups it
creates itself (for replicas without AIBrix's scheduling strategy, and for scope StormService)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from stormtopo.core.gang import followers, gang_of, template_spec
from stormtopo.core.jsonpatch import remove_annotation
from stormtopo.core.ownership import owner_reference
from stormtopo.core.priority import replica_priority_class
from stormtopo.core.request import Mode, TopologyRequest
from stormtopo.core.vocabulary import MANAGED_BY_LABEL, OPERATOR_NAME, PODGROUP_API, REQUEST_ANNOTATION, ROLESET_LABEL, STORMSERVICE_LABEL
from stormtopo.core.writes import PatchPodGroup

OWNED_FIELDS = ("minMember", "minTaskMember", "networkTopology", "subGroupPolicy", "priorityClassName")  # of a PodGroup spec


def desired_fields(
    request: TopologyRequest,
    roleset_spec: Mapping[str, Any],
    moving_tier: int | None = None,
    priorities: Mapping[str, int] | None = None,
) -> dict[str, Any]:
    """The spec fields stormtopo owns on a replica's PodGroup. Under a hard request, roles whose pods
    ask for no resources follow the gang instead of being part of it (see gang.followers). A replica
    that healing moves is held `hard` within `moving_tier` until it lands (see core/moves.py), as is a soft
    replica narrowed while it preempts (core/narrowing.py); its gang stays as its request makes it. The
    priority class its pods run at goes on it too (core/priority.py; `priorities`: each class's value, to
    choose where roles differ)."""
    gang = gang_of(roleset_spec, followers(roleset_spec) if request.mode is Mode.HARD else ())
    topology = request.network_topology() if moving_tier is None else held_within(request, moving_tier)
    fields: dict[str, Any] = {
        "minMember": gang.min_member,
        "minTaskMember": dict(gang.min_task_member),
        "networkTopology": topology,
    }
    priority_class = replica_priority_class(roleset_spec, priorities or {})
    if priority_class is not None:
        fields["priorityClassName"] = priority_class
    return fields


def held_within(request: TopologyRequest, tier: int) -> dict[str, object]:
    """The request's networkTopology, but `hard` within `tier` (a move's hold, or a soft replica's narrowing)."""
    kept = {k: v for k, v in request.network_topology().items() if k != "highestTierName"}
    return kept | {"mode": Mode.HARD.value, "highestTierAllowed": tier}


def stale_priority_class(current: Mapping[str, Any], desired_spec: Mapping[str, Any]) -> list[dict[str, Any]]:
    """The op that takes a priority class off a PodGroup stormtopo created once its replica's pods name none any
    more (else the gang kept outranking the work it no longer ranks above). AIBrix's own PodGroups are left:
    AIBrix rewrites their spec from its strategy, and the webhook adds the roles' class only where they name one."""
    managed = ((current.get("metadata") or {}).get("labels") or {}).get(MANAGED_BY_LABEL) == OPERATOR_NAME
    spec = current.get("spec") or {}
    if managed and "priorityClassName" in spec and "priorityClassName" not in desired_spec:
        return [{"op": "remove", "path": "/spec/priorityClassName"}]
    return []


def owned_fields(podgroup_spec: Mapping[str, Any] | None) -> dict[str, Any]:
    """The fields stormtopo owns, as a PodGroup carries them now (to keep them while a request is invalid)."""
    return {k: v for k, v in (podgroup_spec or {}).items() if k in OWNED_FIELDS}


def _podgroup(
    name: str, namespace: str, labels: dict[str, str], owner: dict[str, Any], request: TopologyRequest, spec: dict[str, Any]
) -> dict[str, Any]:
    return {
        "apiVersion": PODGROUP_API,
        "kind": "PodGroup",
        "metadata": {
            "name": name,
            "namespace": namespace,
            "labels": {**labels, MANAGED_BY_LABEL: OPERATOR_NAME},
            "annotations": {REQUEST_ANNOTATION: request.record()},
            "ownerReferences": [owner],
        },
        "spec": spec,
    }


def owned_podgroup(
    roleset: Mapping[str, Any], request: TopologyRequest, queue: str = "default", priorities: Mapping[str, int] | None = None
) -> dict[str, Any]:
    """A PodGroup stormtopo creates for a RoleSet that has no scheduling strategy of its own.

    Named after the RoleSet (as AIBrix names its own) and owned by it, so deleting the StormService
    deletes the RoleSet and then the PodGroup.
    """
    meta = roleset["metadata"]
    spec: dict[str, Any] = {"queue": queue, **desired_fields(request, roleset.get("spec") or {}, priorities=priorities)}
    labels = {ROLESET_LABEL: meta["name"]}
    if STORMSERVICE_LABEL in (meta.get("labels") or {}):
        labels[STORMSERVICE_LABEL] = meta["labels"][STORMSERVICE_LABEL]
    return _podgroup(meta["name"], meta["namespace"], labels, owner_reference(roleset, "RoleSet"), request, spec)


def service_group_name(stormservice_name: str) -> str:
    """With scope StormService all replicas share one gang, named after the StormService."""
    return stormservice_name


def service_fields(
    request: TopologyRequest, roleset_spec: Mapping[str, Any], replicas: int, priorities: Mapping[str, int] | None = None
) -> dict[str, Any]:
    """Spec fields of the one PodGroup of a StormService-scoped request: every pod of every replica,
    within the outer tier; with a replica tier, each replica (pods sharing a roleset-name) a subgroup."""
    gang = gang_of(roleset_spec)
    fields: dict[str, Any] = {"minMember": gang.min_member * replicas, "networkTopology": request.network_topology()}
    priority_class = replica_priority_class(roleset_spec, priorities or {})
    if priority_class is not None:
        fields["priorityClassName"] = priority_class
    replica_topology = request.replica_network_topology()
    if replica_topology is None:
        fields["minTaskMember"] = {role: n * replicas for role, n in gang.min_task_member.items()}
    else:
        # Volcano advises against minTaskMember together with subGroupPolicy; the subgroups carry the gang.
        fields["subGroupPolicy"] = [
            {
                "name": "replica",
                "matchLabelKeys": [ROLESET_LABEL],
                "subGroupSize": gang.min_member,
                "minSubGroups": replicas,
                "networkTopology": replica_topology,
            }
        ]
    return fields


def service_podgroup(
    stormservice: Mapping[str, Any], request: TopologyRequest, queue: str = "default", priorities: Mapping[str, int] | None = None
) -> dict[str, Any]:
    """The PodGroup stormtopo owns for a StormService-scoped request; deleting the StormService deletes it."""
    meta = stormservice["metadata"]
    spec = stormservice.get("spec") or {}
    replicas = int(spec.get("replicas", 1) if spec.get("replicas") is not None else 1)
    return _podgroup(
        service_group_name(meta["name"]),
        meta["namespace"],
        {STORMSERVICE_LABEL: meta["name"]},
        owner_reference(stormservice, "StormService"),
        request,
        {"queue": queue, **service_fields(request, template_spec(stormservice), replicas, priorities)},
    )


def has_scheduling_strategy(roleset_spec: Mapping[str, Any]) -> bool:
    """True when AIBrix itself creates the replica's PodGroup (volcanoSchedulingStrategy)."""
    strategy = roleset_spec.get("schedulingStrategy") or {}
    return bool(strategy.get("volcanoSchedulingStrategy") is not None)


def carries_constraint(podgroup: Mapping[str, Any] | None) -> bool:
    """A PodGroup that stormtopo gave a request to (and that still has it)."""
    annotations = ((podgroup or {}).get("metadata") or {}).get("annotations") or {}
    return REQUEST_ANNOTATION in annotations and "networkTopology" in ((podgroup or {}).get("spec") or {})


def is_owned(podgroup: Mapping[str, Any]) -> bool:
    """A PodGroup stormtopo created (a replica without a scheduling strategy, or scope StormService)."""
    return ((podgroup.get("metadata") or {}).get("labels") or {}).get(MANAGED_BY_LABEL) == OPERATOR_NAME


def withdraw(namespace: str, podgroup: Mapping[str, Any] | None) -> list[PatchPodGroup]:
    """The StormService no longer asks for a topology: take the constraint off its PodGroup. The
    request annotation goes first: the admission policy refuses stripping a PodGroup that still
    carries it (which is what AIBrix's rewrites would do while stormtopo is down)."""
    if podgroup is None:
        return []
    name = podgroup["metadata"]["name"]
    writes: list[PatchPodGroup] = []
    if REQUEST_ANNOTATION in (podgroup["metadata"].get("annotations") or {}):
        writes.append(PatchPodGroup(namespace, name, [remove_annotation(REQUEST_ANNOTATION)]))
    elif not is_owned(podgroup):
        # AIBrix's own PodGroup: its next sync rewrites the spec without networkTopology, now that the
        # webhook no longer adds it back. Another's topology there is not stormtopo's to remove.
        return []
    if "networkTopology" in (podgroup.get("spec") or {}):
        # Also when only the first patch landed before: stormtopo's own PodGroup never keeps a topology.
        writes.append(PatchPodGroup(namespace, name, [{"op": "remove", "path": "/spec/networkTopology"}]))
    return writes
