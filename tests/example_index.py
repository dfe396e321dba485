"""The operator's index (operator/index.py) as the placement shell fills it, on the feature request's tree
(examples/topology/aibrix-1730.yaml: leaves s0..s3 of two 8-GPU nodes each, node0..node7), with no API
server: the HyperNodes and the given objects arrive as events, the nodes as read "at 0"."""

from __future__ import annotations

from typing import Any, cast

from stormtopo.core.topology.fabric import parse_topology
from stormtopo.core.topology.hypernodes import hypernode_manifests
from stormtopo.operator.index import Index
from tests.conftest import TOPOLOGY_FILE


def index_of(*objects: dict[str, Any], hypernodes: list[dict[str, Any]] | None = None, nodes: list[str] | None = None) -> Index:
    """The index holding `objects` (each by its kind), over `hypernodes` and `nodes` if given."""
    index = Index(cast(Any, None))
    for hypernode in hypernodes if hypernodes is not None else hypernode_manifests(parse_topology(TOPOLOGY_FILE.read_text())):
        index.observe("HyperNode", "ADDED", hypernode)
    index.set_nodes({n: {"kubernetes.io/hostname": n} for n in nodes or [f"node{i}" for i in range(8)]}, 0.0)
    for obj in objects:
        index.observe(str(obj["kind"]), "ADDED", obj)
    return index
