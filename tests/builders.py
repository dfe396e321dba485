"""The AIBrix and Kubernetes objects the unit tests hand the planners and the operator's index, as plain
manifests: a StormService, a RoleSet (one replica), a replica's pod (or another tenant's), its PodGroup, a
PodDisruptionBudget, a batch pod.

Every default is StormService svc in namespace ns, of one prefill and one decode role, asking for no
topology. The StormService is devenv/workloads.py's, as the integration tests and the demo create it."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from stormtopo.core.vocabulary import (
    ADMITTED_LABEL,
    DOMAIN_GATE,
    REVISION_LABEL,
    ROLE_LABEL,
    ROLESET_LABEL,
    STORMSERVICE_API,
    STORMSERVICE_LABEL,
)
from stormtopo.devenv.workloads import IMAGE, PD_1P1D, Role, stormservice

ADMITTED = {ADMITTED_LABEL: "true"}  # the label the webhook puts on the pods it admitted
HARD_TIER_1_RECORD = '{"v":1,"mode":"hard","highestTierAllowed":1,"scope":"RoleSet"}'  # stormtopo.io/request, as stormtopo writes it


def service(
    annotations: Mapping[str, str] | None = None,
    roles: Sequence[Role] = PD_1P1D,
    *,
    name: str = "svc",
    namespace: str = "ns",
    replicas: int = 1,
    volcano_strategy: bool = True,
    uid: str | None = None,
    update_strategy: str | None = None,
    version: str | None = None,
) -> dict[str, Any]:
    """A StormService asking for what `annotations` say; `update_strategy` replaces AIBrix's InPlaceUpdate;
    `version` is its resourceVersion."""
    svc = stormservice(name, namespace, roles, replicas=replicas, annotations=annotations, volcano_strategy=volcano_strategy)
    if uid is not None:
        svc["metadata"]["uid"] = uid
    if version is not None:
        svc["metadata"]["resourceVersion"] = version
    if update_strategy is not None:
        svc["spec"]["updateStrategy"] = {"type": update_strategy}
    return svc


def service_meta(name: str = "svc", annotations: Mapping[str, str] | None = None, version: str = "7", uid: str = "u-1") -> dict[str, Any]:
    """A StormService of metadata alone, as the gate and the opted-in lists read it (no spec: they read none)."""
    meta: dict[str, Any] = {"name": name, "namespace": "ns", "uid": uid, "resourceVersion": version}
    if annotations is not None:
        meta["annotations"] = dict(annotations)
    return {"apiVersion": "orchestration.aibrix.ai/v1alpha1", "kind": "StormService", "metadata": meta}


def roleset(
    name: str = "svc-rs",
    roles: Sequence[Role] = PD_1P1D,
    *,
    spec: dict[str, Any] | None = None,
    service: str = "svc",
    namespace: str = "ns",
    uid: str | None = None,
    revision: str | None = None,
    volcano_strategy: bool = True,
    api_version: str | None = None,
    kind: str | None = "RoleSet",
) -> dict[str, Any]:
    """A replica of StormService `service`: its `spec` (the very object given), or the one AIBrix copies
    from the service's template for `roles`; with `api_version` and `kind` where given (None: left out)."""
    meta: dict[str, Any] = {"name": name, "namespace": namespace}
    if uid is not None:
        meta["uid"] = uid
    meta["labels"] = {STORMSERVICE_LABEL: service}
    if revision is not None:
        meta["labels"][REVISION_LABEL] = revision
    obj: dict[str, Any] = {}
    if api_version is not None:
        obj["apiVersion"] = api_version
    if kind is not None:
        obj["kind"] = kind
    obj["metadata"] = meta
    if spec is None:
        spec = stormservice(service, namespace, roles, volcano_strategy=volcano_strategy)["spec"]["template"]["spec"]
    obj["spec"] = spec
    return obj


def aibrix_roleset(roles: Sequence[Role] = PD_1P1D, *, spec: dict[str, Any] | None = None, volcano_strategy: bool = True) -> dict[str, Any]:
    """Replica svc-roleset-abcde of svc as the API server serves it, named as AIBrix names them, with its
    apiVersion and uid (u-1): what an admission review, the reconciler and the doctor read."""
    return roleset("svc-roleset-abcde", roles, spec=spec, uid="u-1", volcano_strategy=volcano_strategy, api_version=STORMSERVICE_API)


def pod(
    name: str,
    role: str | None,
    node: str | None = None,
    held: bool = False,
    *,
    replica: str = "svc-rs",
    service: str = "svc",
    namespace: str = "ns",
    labels: Mapping[str, str] = ADMITTED,
    annotations: Mapping[str, str] | None = None,
    spec: Mapping[str, Any] | None = None,
    status: Mapping[str, Any] | None = None,
    uid: str | None = None,
    version: str | None = None,
    created: str | None = None,
    owner_uid: str | None = None,
    kind: str | None = "Pod",
) -> dict[str, Any]:
    """A pod of `role` in `replica`: bound to `node`, or `held` at stormtopo's gate, or neither; `role=None`
    is a pod of no StormService, without AIBrix's labels. `labels` come after AIBrix's own (by default the
    webhook's admitted label), `spec` before the node's name; `version` is its resourceVersion; `kind=None`
    leaves the kind out."""
    meta: dict[str, Any] = {"name": name}
    if uid is not None:
        meta["uid"] = uid
    meta["namespace"] = namespace
    if version is not None:
        meta["resourceVersion"] = version
    if created is not None:
        meta["creationTimestamp"] = created
    aibrix = {} if role is None else {STORMSERVICE_LABEL: service, ROLESET_LABEL: replica, ROLE_LABEL: role}
    meta["labels"] = {**aibrix, **labels}
    if annotations is not None:
        meta["annotations"] = dict(annotations)
    if owner_uid is not None:
        meta["ownerReferences"] = [{"uid": owner_uid}]
    body = dict(spec or {})
    if node:
        body["nodeName"] = node
    if held:
        body["schedulingGates"] = [{"name": DOMAIN_GATE}]
    obj: dict[str, Any] = {} if kind is None else {"kind": kind}
    obj.update({"metadata": meta, "spec": body, "status": dict(status or {})})
    return obj


def running(ready: bool, since: str) -> dict[str, Any]:
    """A running pod's status: Ready (or not) since `since`."""
    return {"phase": "Running", "conditions": [{"type": "Ready", "status": "True" if ready else "False", "lastTransitionTime": since}]}


def pdb(name: str, allowed: int, selector: dict[str, Any]) -> dict[str, Any]:
    """A PodDisruptionBudget over the pods `selector` selects that allows `allowed` disruptions now."""
    return {"metadata": {"name": name, "namespace": "ns"}, "spec": {"selector": selector}, "status": {"disruptionsAllowed": allowed}}


def podgroup(
    name: str,
    *,
    namespace: str = "ns",
    spec: Mapping[str, Any] | None = None,
    annotations: Mapping[str, str] | None = None,
    labels: Mapping[str, str] | None = None,
    unschedulable: str | None = None,
    kind: bool = False,
) -> dict[str, Any]:
    """A PodGroup as Volcano keeps it: `spec` as given (none: no spec at all), and with `unschedulable`
    (a reason, "" for none) Pending with Volcano's Unschedulable condition."""
    meta: dict[str, Any] = {"name": name, "namespace": namespace}
    if annotations is not None:
        meta["annotations"] = dict(annotations)
    if labels is not None:
        meta["labels"] = dict(labels)
    body: dict[str, Any] = {"kind": "PodGroup"} if kind else {}
    body["metadata"] = meta
    if spec is not None:
        body["spec"] = dict(spec)
    if unschedulable is not None:
        condition = {"type": "Unschedulable", "status": "True", **({"reason": unschedulable} if unschedulable else {})}
        body["status"] = {"phase": "Pending", "conditions": [condition]}
    return body


BATCH_LABEL = "stormtopo.io/test-batch"  # on every batch pod: select them with f"{BATCH_LABEL}=true"


def batch_pod(
    name: str, namespace: str, priority_class: str, gpus: int = 4, node: str | None = None, queue: str | None = None
) -> dict[str, Any]:
    """A Volcano job of one pod asking for `gpus` GPUs at `priority_class` (Volcano makes its PodGroup, with
    the pod's class, in `queue` where given): lower-priority work to preempt. Bound to `node` where given, else
    Volcano places it."""
    resources = {"requests": {"nvidia.com/gpu": str(gpus)}, "limits": {"nvidia.com/gpu": str(gpus)}}
    spec: dict[str, Any] = {
        "schedulerName": "volcano",
        "priorityClassName": priority_class,
        "containers": [{"name": "batch", "image": IMAGE, "resources": resources}],
    }
    if node is not None:
        spec["nodeName"] = node
    metadata: dict[str, Any] = {"name": name, "namespace": namespace, "labels": {BATCH_LABEL: "true"}}
    if queue is not None:  # Volcano's pg-controller gives the pod's PodGroup this queue
        metadata["annotations"] = {"scheduling.volcano.sh/queue-name": queue}
    return {"apiVersion": "v1", "kind": "Pod", "metadata": metadata, "spec": spec}
