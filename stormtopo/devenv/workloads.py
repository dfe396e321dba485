"""StormServices and filler pods for tests, the demo and the benchmarks (plain manifests, no I/O)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from stormtopo.core.vocabulary import GPU, STORMSERVICE_API

IMAGE = "vllm/vllm-openai:v0.9.0"  # never pulled: kwok runs no containers


@dataclass(frozen=True)
class Role:
    name: str
    replicas: int = 1
    gpus: int = 1
    pod_group_size: int = 1
    strategy: bool = False  # a role-level volcanoSchedulingStrategy (AIBrix: a PodGroup per multi-node instance)
    stateful: bool = True  # False: pods get generated names
    requests: bool = True  # False: the pods ask for no resources (a router, a simulator), as in AIBrix's samples
    priority_class: str | None = None  # the pods' priorityClassName


PD_1P1D = (Role("prefill"), Role("decode"))


def stormservice(
    name: str,
    namespace: str,
    roles: Sequence[Role] = PD_1P1D,
    replicas: int = 1,
    annotations: Mapping[str, str] | None = None,
    volcano_strategy: bool = True,
    scheduler_name: str | None = "volcano",
    pod_annotations: Mapping[str, str] | None = None,
) -> dict[str, Any]:
    """A prefill/decode StormService; `volcano_strategy` selects AIBrix's own Volcano PodGroups."""
    role_specs = []
    for role in roles:
        resources = {"requests": {GPU: str(role.gpus), "cpu": "1"}, "limits": {GPU: str(role.gpus)}} if role.requests else {}
        pod_spec: dict[str, Any] = {"containers": [{"name": "engine", "image": IMAGE, "resources": resources}]}
        if scheduler_name:
            pod_spec["schedulerName"] = scheduler_name
        if role.priority_class:
            pod_spec["priorityClassName"] = role.priority_class
        spec: dict[str, Any] = {
            "name": role.name,
            "replicas": role.replicas,
            "stateful": role.stateful,
            "template": {
                "metadata": {"labels": {"app": name, "role": role.name}, "annotations": dict(pod_annotations or {})},
                "spec": pod_spec,
            },
        }
        if role.pod_group_size > 1:
            spec["podGroupSize"] = role.pod_group_size
        if role.strategy:
            spec["schedulingStrategy"] = {"volcanoSchedulingStrategy": {"minMember": role.pod_group_size, "queue": "default"}}
        role_specs.append(spec)
    roleset_spec: dict[str, Any] = {"roles": role_specs}
    if volcano_strategy:
        pods = sum(r.replicas * r.pod_group_size for r in roles)
        roleset_spec["schedulingStrategy"] = {"volcanoSchedulingStrategy": {"minMember": pods, "queue": "default"}}
    return {
        "apiVersion": STORMSERVICE_API,
        "kind": "StormService",
        "metadata": {"name": name, "namespace": namespace, "annotations": dict(annotations or {})},
        "spec": {
            "replicas": replicas,
            "stateful": True,
            "updateStrategy": {"type": "InPlaceUpdate"},
            "selector": {"matchLabels": {"app": name}},
            "template": {"metadata": {"labels": {"app": name}}, "spec": roleset_spec},
        },
    }


def filler_pod(name: str, namespace: str, node: str, gpus: int) -> dict[str, Any]:
    """A pod pinned to `node` that keeps `gpus` GPUs busy: how tests and the demo fragment a cluster."""
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "namespace": namespace, "labels": {"stormtopo.io/filler": "true"}},
        "spec": {
            "nodeName": node,
            "containers": [{"name": "busy", "image": IMAGE, "resources": {"requests": {GPU: str(gpus)}, "limits": {GPU: str(gpus)}}}],
        },
    }
