"""Admission decisions for pods and PodGroups of opted-in StormServices (pure: objects in, patch out).

The shell fetches the RoleSet and StormService an object belongs to and passes them in; these
functions decide what to change. Bad annotations change nothing here: the StormService gets a Warning
Event from the operator instead, and its pods are admitted as AIBrix made them.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from stormtopo.core.podgroup import desired_fields, service_group_name, spec_patch
from stormtopo.core.request import ClusterTiers, RequestError, Scope, TopologyRequest, parse_request
from stormtopo.core.vocabulary import (
    DEFAULT_SCHEDULERS,
    GROUP_NAME_ANNOTATION,
    REQUEST_ANNOTATION,
    ROLE_LABEL,
    STORMSERVICE_LABEL,
    TASK_SPEC_ANNOTATION,
    VOLCANO_SCHEDULER,
)


@dataclass
class Decision:
    allowed: bool = True
    patch: list[dict[str, Any]] = field(default_factory=list)
    message: str = ""


def _escape(key: str) -> str:
    return key.replace("~", "~0").replace("/", "~1")


def _annotations(obj: Mapping[str, Any]) -> dict[str, str]:
    return dict((obj.get("metadata") or {}).get("annotations") or {})


def request_of(stormservice: Mapping[str, Any] | None, cluster: ClusterTiers | None) -> TopologyRequest | None:
    """The valid request of a StormService, or None when it has none or a bad one (reported elsewhere)."""
    if stormservice is None:
        return None
    try:
        return parse_request(_annotations(stormservice), cluster)
    except RequestError:
        return None


def set_annotation_ops(obj: Mapping[str, Any], values: Mapping[str, str]) -> list[dict[str, Any]]:
    current = _annotations(obj)
    changes = {k: v for k, v in values.items() if current.get(k) != v}
    if not changes:
        return []
    if not (obj.get("metadata") or {}).get("annotations"):
        return [{"op": "add", "path": "/metadata/annotations", "value": {**current, **changes}}]
    return [{"op": "add", "path": f"/metadata/annotations/{_escape(k)}", "value": v} for k, v in changes.items()]


def admit_podgroup(
    podgroup: Mapping[str, Any], roleset: Mapping[str, Any] | None, stormservice: Mapping[str, Any] | None, cluster: ClusterTiers | None
) -> Decision:
    """Give a replica's PodGroup the gang and network topology of its StormService, on create and update.

    AIBrix replaces the whole spec of its PodGroups whenever it differs from its own; admitting every
    create and update this way means its writes can never strip the constraint.
    """
    request = request_of(stormservice, cluster)
    if request is None or roleset is None or request.scope is Scope.STORMSERVICE:
        return Decision()  # with scope StormService the replicas' pods join the service's own PodGroup
    desired = desired_fields(request, roleset.get("spec") or {})
    patch = spec_patch(podgroup.get("spec"), desired)
    patch += set_annotation_ops(podgroup, {REQUEST_ANNOTATION: request.describe()})
    return Decision(patch=patch)


def admit_pod(
    pod: Mapping[str, Any],
    roleset: Mapping[str, Any] | None,
    stormservice: Mapping[str, Any] | None,
    cluster: ClusterTiers | None,
    named_group_service: str | None = None,
) -> Decision:
    """Point an opted-in replica's pod at its gang: group name, Volcano task (its role) and scheduler.

    `named_group_service` is the StormService owning the PodGroup the pod names, if known: a pod of
    one StormService may not join another's gang, whether or not either asks for a topology.
    """
    labels = (pod.get("metadata") or {}).get("labels") or {}
    own_service = labels.get(STORMSERVICE_LABEL)
    named = _annotations(pod).get(GROUP_NAME_ANNOTATION)
    if named and named_group_service and own_service and named_group_service != own_service:
        return Decision(
            allowed=False,
            message=(
                f"pod of StormService {own_service!r} names PodGroup {named!r} in {GROUP_NAME_ANNOTATION}, which belongs to "
                f"StormService {named_group_service!r}; a pod may only join its own StormService's PodGroups"
            ),
        )
    request = request_of(stormservice, cluster)
    if request is None or roleset is None:
        return Decision()
    replica_group = roleset["metadata"]["name"]
    group = replica_group
    if request.scope is Scope.STORMSERVICE and stormservice is not None:
        group = service_group_name(stormservice["metadata"]["name"])
    if named and named not in (group, replica_group):
        return Decision(
            allowed=False,
            message=(
                f"pod names PodGroup {named!r} in {GROUP_NAME_ANNOTATION}, but it belongs to RoleSet {group!r} of StormService "
                f"{stormservice['metadata']['name'] if stormservice else '?'}; its pods may only join PodGroup {group!r}"
            ),
        )
    values = {GROUP_NAME_ANNOTATION: group}
    role = labels.get(ROLE_LABEL)
    if role:
        values[TASK_SPEC_ANNOTATION] = role
    patch = set_annotation_ops(pod, values)
    spec = pod.get("spec") or {}
    if spec.get("schedulerName") in DEFAULT_SCHEDULERS:
        patch.append({"op": "add", "path": "/spec/schedulerName", "value": VOLCANO_SCHEDULER})
    return Decision(patch=patch)
