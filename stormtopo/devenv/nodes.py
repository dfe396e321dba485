"""Fake GPU nodes for kwok: Node objects with GPU capacity, one per node of a switch tree."""

from __future__ import annotations

from typing import Any

from stormtopo.core.topology.tree import NodeSpec, Topology
from stormtopo.core.vocabulary import GPU


def node_manifest(spec: NodeSpec) -> dict[str, Any]:
    capacity = {"cpu": spec.cpu, "memory": spec.memory, "pods": "110", GPU: str(spec.gpus)}
    return {
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {
            "name": spec.name,
            "annotations": {"kwok.x-k8s.io/node": "fake", "node.alpha.kubernetes.io/ttl": "0"},
            "labels": {
                "kubernetes.io/hostname": spec.name,
                "kubernetes.io/os": "linux",
                "kubernetes.io/arch": "amd64",
                "type": "kwok",
                "stormtopo.io/leaf-switch": spec.switch,
            },
        },
        "status": {"capacity": capacity, "allocatable": dict(capacity)},
    }


def node_manifests(topology: Topology) -> list[dict[str, Any]]:
    return [node_manifest(topology.nodes[name]) for name in sorted(topology.nodes)]
