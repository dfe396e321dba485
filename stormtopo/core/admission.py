"""Admission decisions for pods and PodGroups of opted-in StormServices (pure: objects in, patch out).

The webhook fetches the RoleSet and StormService an object belongs to and passes them in; these
functions decide what to change. Bad annotations change nothing that was there: a PodGroup keeps
the constraint of the last valid request, and the StormService gets a Warning from the operator.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from stormtopo.core.gang import followers
from stormtopo.core.jsonpatch import pointer, set_annotations, set_labels, set_spec_fields
from stormtopo.core.narrowing import held_tier, released_hold
from stormtopo.core.ownership import stormservice_name
from stormtopo.core.podgroup import carries_constraint as carries_constraint  # the webhook's import
from stormtopo.core.podgroup import desired_fields, owned_fields, service_group_name
from stormtopo.core.request import ClusterTiers, Mode, RequestError, Scope, TierLimit, TopologyRequest, request_of, written_scope
from stormtopo.core.switches import switched_on
from stormtopo.core.vocabulary import (
    ADMITTED_LABEL,
    DEFAULT_SCHEDULERS,
    DOMAIN_GATE,
    GROUP_NAME_ANNOTATION,
    HOSTNAME_LABEL,
    OPTED_IN_LABEL,
    PREFER_SAME_NODE,
    REQUEST_ANNOTATION,
    ROLE_LABEL,
    ROLESET_LABEL,
    ROOM_GATE,
    TASK_SPEC_ANNOTATION,
    VOLCANO_SCHEDULER,
)

_OPT_IN_LABEL_PATH = pointer("metadata", "labels", OPTED_IN_LABEL)


@dataclass
class Decision:
    allowed: bool = True
    patch: list[dict[str, Any]] = field(default_factory=list)
    message: str = ""


def admit_podgroup(
    podgroup: Mapping[str, Any],
    roleset: Mapping[str, Any] | None,
    stormservice: Mapping[str, Any] | None,
    cluster: ClusterTiers | None,
    last_valid: Mapping[str, Any] | None = None,
    old: Mapping[str, Any] | None = None,
    now: float | None = None,
) -> Decision:
    """Give a replica's PodGroup the gang and network topology of its StormService, on create and update.

    AIBrix replaces the whole spec of its PodGroups whenever it differs from its own; admitting every
    create and update this way means its writes can never strip the constraint. While the request
    looks invalid (a typo, HyperNodes half rewritten), `last_valid` (the PodGroup as it was, or a
    sibling replica's) keeps the constraint it had: an invalid request changes nothing.

    AIBrix's update also drops the status Volcano wrote and every label and annotation it did not set
    itself. For an opted-in replica those are kept from `old` (the stored PodGroup): AIBrix's rewrite,
    twice a second while a replica is pending, then changes nothing, and the API server stores nothing.
    """
    if roleset is None:
        return Decision()
    request = request_of(stormservice, cluster)
    if isinstance(request, RequestError):
        if not carries_constraint(last_valid):
            return Decision()
        fields = owned_fields((last_valid or {}).get("spec"))
        if _name(last_valid) != _name(podgroup):  # a sibling's gang size is its own
            fields = {k: v for k, v in fields.items() if k == "networkTopology"}
        # A move's hold is no request: let go to what the last valid request asks, as the reconciler does.
        released = released_hold(old or last_valid, stormservice, roleset["metadata"]["name"])
        if released is not None:
            fields = {**fields, "networkTopology": released}
        recorded = ((last_valid or {}).get("metadata") or {}).get("annotations", {}).get(REQUEST_ANNOTATION, "")
    elif request is None or request.scope is Scope.STORMSERVICE:
        return Decision()  # with scope StormService the replicas' pods join the service's own PodGroup
    else:
        # Held only while the service still asks for healing and the move is within its deadline, by the
        # same clock the reconciler is given (core/moves.py): otherwise each would undo the other's write.
        fields = desired_fields(
            request,
            roleset.get("spec") or {},
            held_tier(stormservice, roleset["metadata"]["name"], podgroup, request, cluster, now, old),
            dict(cluster.priority_values) if cluster is not None else None,
        )
        recorded = request.record()
    patch = set_spec_fields(podgroup.get("spec"), fields)
    patch += set_annotations(podgroup, {**_dropped(podgroup, old, "annotations"), REQUEST_ANNOTATION: recorded})
    patch += set_labels(podgroup, _dropped(podgroup, old, "labels"))
    unchanged = {**(podgroup.get("spec") or {}), **fields} == ((old or {}).get("spec") or {})
    if old and old.get("status") and not podgroup.get("status") and unchanged:
        # Only a rewrite that changes nothing keeps Volcano's status: a new queue or priority must be admitted anew.
        patch.append({"op": "add", "path": "/status", "value": old["status"]})
    return Decision(patch=patch)


def _name(obj: Mapping[str, Any] | None) -> str | None:
    return ((obj or {}).get("metadata") or {}).get("name")


def _dropped(new: Mapping[str, Any], old: Mapping[str, Any] | None, field: str) -> dict[str, str]:
    """Labels or annotations the stored object has and an update left out."""
    kept = ((new.get("metadata") or {}).get(field)) or {}
    return {k: v for k, v in (((old or {}).get("metadata") or {}).get(field) or {}).items() if k not in kept}


def marked_admitted(pod: Mapping[str, Any], decision: Decision | None = None) -> Decision:
    """The pod goes as `decision` says (by default: as it would without stormtopo), marked admitted, so the
    outage policies (which hold unadmitted pods of listed services) let it through: stormtopo is up and
    found nothing more to add. A refusal stays one."""
    decision = decision or Decision()
    if not decision.allowed:
        return decision
    return Decision(patch=[*decision.patch, *set_labels(pod, {ADMITTED_LABEL: "true"})])


def strips_opt_in_label(decision: Decision) -> bool:
    """The decision lets a labelled pod go as if stormtopo were not installed (its service asks for nothing)."""
    return any(op.get("op") == "remove" and op.get("path") == _OPT_IN_LABEL_PATH for op in decision.patch)


def admit_pod(
    pod: Mapping[str, Any],
    roleset: Mapping[str, Any] | None,
    stormservice: Mapping[str, Any] | None,
    cluster: ClusterTiers | None,
    named_group_service: str | None = None,
    podgroups: Mapping[str, Mapping[str, Any]] | None = None,
    exact_preemption: bool = False,
    narrowing: bool = False,
) -> Decision:
    """Point an opted-in replica's pod at its gang: group name, Volcano task (its role) and scheduler.

    A pod that names another PodGroup of its own StormService (AIBrix gives each instance of a
    multi-node role its own PodSet PodGroup) joins the replica's gang instead: Volcano then sees one
    gang per replica, and the whole replica is placed within the tier. `named_group_service` is the
    StormService owning the PodGroup the pod names, if known: a pod of one StormService may not join
    another's gang, whether or not either asks for a topology. `podgroups` (by name, in the pod's
    namespace) are the PodGroups known: a pod waits while its replica's PodGroup exists without
    the constraint (created while stormtopo was down, not yet patched), so it is never placed
    unconstrained.
    """
    own_service = stormservice_name(pod)
    named = ((pod.get("metadata") or {}).get("annotations") or {}).get(GROUP_NAME_ANNOTATION)
    if named and named_group_service and own_service and named_group_service != own_service:
        return Decision(
            allowed=False,
            message=(
                f"pod of StormService {own_service!r} names PodGroup {named!r} in {GROUP_NAME_ANNOTATION}, which belongs to "
                f"StormService {named_group_service!r}; a pod may only join its own StormService's PodGroups"
            ),
        )
    request = request_of(stormservice, cluster)
    labelled = OPTED_IN_LABEL in ((pod.get("metadata") or {}).get("labels") or {})
    if labelled and request is None and (stormservice is not None or not own_service):
        # Its service opted out, its role templates keep the label (taking it off would roll every
        # replica), or it belongs to no StormService at all (a RoleSet of its own, its template copied
        # from a labelled one): the pod goes as if stormtopo were not installed, out of the policy's reach.
        return Decision(patch=[{"op": "remove", "path": _OPT_IN_LABEL_PATH}])
    if request is None or roleset is None or stormservice is None:
        return Decision()
    # While the request looks invalid, its pods still join the gang whose PodGroup keeps the last valid constraint.
    written = written_scope((stormservice.get("metadata") or {}).get("annotations"))
    scope = request.scope if isinstance(request, TopologyRequest) else written
    group = joined_gang(roleset, stormservice, cluster)
    gang = (podgroups or {}).get(group)
    if isinstance(request, RequestError) and not carries_constraint(gang):
        # A typo with no constraint to keep: the pod stays as it would be without stormtopo (naming a
        # gang nobody creates would strand it), only marked admitted for the outage policy.
        return marked_admitted(pod)
    if isinstance(request, TopologyRequest) and scope is Scope.ROLESET and gang is not None and not carries_constraint(gang):
        return Decision(
            allowed=False,
            message=f"PodGroup {group!r} does not carry its network-topology constraint yet; stormtopo is adding it, retry",
        )
    values = {GROUP_NAME_ANNOTATION: group}
    role = ((pod.get("metadata") or {}).get("labels") or {}).get(ROLE_LABEL)
    if role:
        values[TASK_SPEC_ANNOTATION] = role
    patch = set_annotations(pod, values) + set_labels(pod, {ADMITTED_LABEL: "true"})
    if scope is Scope.ROLESET and switched_on(stormservice, PREFER_SAME_NODE):
        patch += prefer_replica_peers(pod, group)
    unbound = not (pod.get("spec") or {}).get("nodeName")  # bound at creation: nothing to hold, and a gate makes it invalid
    if (
        isinstance(request, TopologyRequest)
        and scope is Scope.ROLESET
        and (request.spread is not None or (request.mode is Mode.HARD and role in followers(roleset["spec"])))
        and unbound
    ):
        # Volcano's backfill would place it anywhere: held until its replica's anchor is placed. With a
        # spread tier every pod is held, until the leader lets its replica go outside its siblings' domains.
        patch += _gate(pod, DOMAIN_GATE)
    elif (
        isinstance(request, TopologyRequest)
        and (exact_preemption or (narrowing and request.mode is Mode.SOFT and request.limit != TierLimit()))
        and scope is Scope.ROLESET
        and unbound
        and preempts(pod)
    ):
        # Held until the leader has evicted the fewest victims its replica needs, or found it needs none
        # (core/preempting.py): Volcano's gangpreempt would take more (BENCHMARKS.md, "Preemption"). Or, soft,
        # until its PodGroup is narrowed to one tier if it must preempt (core/narrowing.py): gangpreempt
        # would take its victims anywhere.
        patch += _gate(pod, ROOM_GATE)
    if (pod.get("spec") or {}).get("schedulerName") in DEFAULT_SCHEDULERS:
        patch.append({"op": "add", "path": "/spec/schedulerName", "value": VOLCANO_SCHEDULER})
    return Decision(patch=patch)


def preempts(pod: Mapping[str, Any]) -> bool:
    """A pod that may preempt: a priority above 0 (the Priority admission plugin has set it from its class
    before any webhook runs), and not a class that never preempts."""
    spec = pod.get("spec") or {}
    priority = spec.get("priority")
    return isinstance(priority, int) and priority > 0 and spec.get("preemptionPolicy") != "Never"


def _gate(pod: Mapping[str, Any], name: str) -> list[dict[str, Any]]:
    gates = (pod.get("spec") or {}).get("schedulingGates") or []
    gate = {"name": name}
    if gate in gates:  # the webhook may be invoked again for the same pod
        return []
    if gates:
        return [{"op": "add", "path": "/spec/schedulingGates/-", "value": gate}]
    return [{"op": "add", "path": "/spec/schedulingGates", "value": [gate]}]


def joined_gang(roleset: Mapping[str, Any], stormservice: Mapping[str, Any], cluster: ClusterTiers | None) -> str:
    """The PodGroup an opted-in replica's pods join: the StormService's own with scope StormService
    (as written, while the request looks invalid), else the replica's."""
    request = request_of(stormservice, cluster)
    written = written_scope((stormservice.get("metadata") or {}).get("annotations"))
    scope = request.scope if isinstance(request, TopologyRequest) else written
    if scope is Scope.STORMSERVICE:
        return service_group_name(stormservice["metadata"]["name"])
    return str(roleset["metadata"]["name"])


def _annotation(obj: Mapping[str, Any], key: str) -> str:
    return str(((obj.get("metadata") or {}).get("annotations") or {}).get(key, "")).strip()


PEER_WEIGHT = 100  # the highest preference a pod can state


def prefer_replica_peers(pod: Mapping[str, Any], replica: str) -> list[dict[str, Any]]:
    """A preferred pod affinity to the node of the replica's other pods: within the domain Volcano
    chose, its nodeorder plugin then puts prefill and decode on one node where they fit, and the KV
    cache moves over NVLink instead of the leaf switch. Added to what the pod prefers, never replacing it.
    Only where the StormService asks for it (PREFER_SAME_NODE): pods with affinity terms make every
    scheduling decision in the cluster scan them, and the gain is not yet measured at scale."""
    term = {
        "weight": PEER_WEIGHT,
        "podAffinityTerm": {"labelSelector": {"matchLabels": {ROLESET_LABEL: replica}}, "topologyKey": HOSTNAME_LABEL},
    }
    affinity = (pod.get("spec") or {}).get("affinity")
    if not affinity:
        return [
            {"op": "add", "path": "/spec/affinity", "value": {"podAffinity": {"preferredDuringSchedulingIgnoredDuringExecution": [term]}}}
        ]
    pod_affinity = affinity.get("podAffinity")
    if not pod_affinity:
        return [{"op": "add", "path": "/spec/affinity/podAffinity", "value": {"preferredDuringSchedulingIgnoredDuringExecution": [term]}}]
    preferred = pod_affinity.get("preferredDuringSchedulingIgnoredDuringExecution")
    if not preferred:
        return [{"op": "add", "path": "/spec/affinity/podAffinity/preferredDuringSchedulingIgnoredDuringExecution", "value": [term]}]
    if term in preferred:
        return []
    return [{"op": "add", "path": "/spec/affinity/podAffinity/preferredDuringSchedulingIgnoredDuringExecution/-", "value": term}]
