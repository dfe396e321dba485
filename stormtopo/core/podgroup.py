"""Desired Volcano PodGroups for a RoleSet (one StormService replica), and the patch that gets them there.

A replica is one gang: minMember counts every pod of every role (replicas x podGroupSize) and
minTaskMember counts each role, keyed by the role name that pods carry in volcano.sh/task-spec.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from stormtopo.core.request import TopologyRequest
from stormtopo.core.vocabulary import (
    GPU,
    MANAGED_BY_LABEL,
    OPERATOR_NAME,
    PODGROUP_API,
    REQUEST_ANNOTATION,
    ROLESET_LABEL,
    STORMSERVICE_API,
    STORMSERVICE_LABEL,
)


@dataclass(frozen=True)
class Gang:
    min_member: int
    min_task_member: Mapping[str, int]


def role_pod_count(role: Mapping[str, Any]) -> int:
    replicas = role.get("replicas")
    group_size = role.get("podGroupSize")
    return int(1 if replicas is None else replicas) * max(1, int(group_size or 1))


def gang_of(roleset_spec: Mapping[str, Any]) -> Gang:
    """The gang of one replica: all of its pods, and per role."""
    per_role = {str(role.get("name", "")): role_pod_count(role) for role in roleset_spec.get("roles") or []}
    per_role = {name: count for name, count in per_role.items() if count > 0}
    return Gang(sum(per_role.values()), per_role)


def gpus_of(roleset_spec: Mapping[str, Any], resource: str = GPU) -> dict[str, int]:
    """GPUs one pod of each role requests (requests, else limits, summed over containers)."""
    out = {}
    for role in roleset_spec.get("roles") or []:
        containers = ((role.get("template") or {}).get("spec") or {}).get("containers") or []
        total = 0
        for c in containers:
            res = c.get("resources") or {}
            value = (res.get("requests") or {}).get(resource, (res.get("limits") or {}).get(resource, 0))
            total += int(str(value) or 0)
        out[str(role.get("name", ""))] = total
    return out


def replica_pods(roleset_spec: Mapping[str, Any]) -> list[int]:
    """GPU requests of every pod of one replica."""
    gpus = gpus_of(roleset_spec)
    return [gpus.get(role, 0) for role, count in gang_of(roleset_spec).min_task_member.items() for _ in range(count)]


def desired_fields(request: TopologyRequest, roleset_spec: Mapping[str, Any]) -> dict[str, Any]:
    """The spec fields stormtopo owns on a replica's PodGroup."""
    gang = gang_of(roleset_spec)
    return {
        "minMember": gang.min_member,
        "minTaskMember": dict(gang.min_task_member),
        "networkTopology": request.network_topology(),
    }


def spec_patch(current_spec: Mapping[str, Any] | None, desired: Mapping[str, Any]) -> list[dict[str, Any]]:
    """JSON-patch operations that set `desired` fields on a PodGroup spec; empty when it already matches."""
    if current_spec is None:
        return [{"op": "add", "path": "/spec", "value": dict(desired)}]
    ops = []
    for key, value in desired.items():
        if current_spec.get(key) != value:
            ops.append({"op": "replace" if key in current_spec else "add", "path": f"/spec/{key}", "value": value})
    return ops


def owned_podgroup(
    roleset: Mapping[str, Any], request: TopologyRequest, queue: str = "default", priority_class: str | None = None
) -> dict[str, Any]:
    """A PodGroup stormtopo creates for a RoleSet that has no scheduling strategy of its own.

    Named after the RoleSet (as AIBrix names its own) and owned by it, so deleting the StormService
    deletes the RoleSet and then the PodGroup.
    """
    meta = roleset["metadata"]
    spec: dict[str, Any] = {"queue": queue, **desired_fields(request, roleset.get("spec") or {})}
    if priority_class:
        spec["priorityClassName"] = priority_class
    labels = {ROLESET_LABEL: meta["name"], MANAGED_BY_LABEL: OPERATOR_NAME}
    if STORMSERVICE_LABEL in (meta.get("labels") or {}):
        labels[STORMSERVICE_LABEL] = meta["labels"][STORMSERVICE_LABEL]
    return {
        "apiVersion": PODGROUP_API,
        "kind": "PodGroup",
        "metadata": {
            "name": meta["name"],
            "namespace": meta["namespace"],
            "labels": labels,
            "annotations": {REQUEST_ANNOTATION: request.describe()},
            "ownerReferences": [
                {
                    "apiVersion": roleset.get("apiVersion", STORMSERVICE_API),
                    "kind": "RoleSet",
                    "name": meta["name"],
                    "uid": meta["uid"],
                    "blockOwnerDeletion": True,
                    "controller": False,
                }
            ],
        },
        "spec": spec,
    }


def service_group_name(stormservice_name: str) -> str:
    """With scope StormService all replicas share one gang, named after the StormService."""
    return stormservice_name


def service_fields(request: TopologyRequest, template_spec: Mapping[str, Any], replicas: int) -> dict[str, Any]:
    """Spec fields of the one PodGroup of a StormService-scoped request: every pod of every replica,
    within the outer tier; with a replica tier, each replica (pods sharing a roleset-name) a subgroup."""
    gang = gang_of(template_spec)
    fields: dict[str, Any] = {"minMember": gang.min_member * replicas, "networkTopology": request.network_topology()}
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


def service_podgroup(stormservice: Mapping[str, Any], request: TopologyRequest, queue: str = "default") -> dict[str, Any]:
    """The PodGroup stormtopo owns for a StormService-scoped request; deleting the StormService deletes it."""
    meta = stormservice["metadata"]
    spec = stormservice.get("spec") or {}
    template_spec = (spec.get("template") or {}).get("spec") or {}
    replicas = int(spec.get("replicas", 1) if spec.get("replicas") is not None else 1)
    return {
        "apiVersion": PODGROUP_API,
        "kind": "PodGroup",
        "metadata": {
            "name": service_group_name(meta["name"]),
            "namespace": meta["namespace"],
            "labels": {STORMSERVICE_LABEL: meta["name"], MANAGED_BY_LABEL: OPERATOR_NAME},
            "annotations": {REQUEST_ANNOTATION: request.describe()},
            "ownerReferences": [
                {
                    "apiVersion": stormservice.get("apiVersion", STORMSERVICE_API),
                    "kind": "StormService",
                    "name": meta["name"],
                    "uid": meta["uid"],
                    "blockOwnerDeletion": True,
                    "controller": False,
                }
            ],
        },
        "spec": {"queue": queue, **service_fields(request, template_spec, replicas)},
    }


def has_scheduling_strategy(roleset_spec: Mapping[str, Any]) -> bool:
    """True when AIBrix itself creates the replica's PodGroup (volcanoSchedulingStrategy)."""
    strategy = roleset_spec.get("schedulingStrategy") or {}
    return bool(strategy.get("volcanoSchedulingStrategy") is not None)
