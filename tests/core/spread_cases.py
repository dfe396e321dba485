"""The spread's cases (core/spread.py): StormService svc spreading its 1P1D replicas over the leaves of
the feature request's tree, each replica a RoleSet and its two pods, in the operator's index."""

from __future__ import annotations

from typing import Any

from stormtopo.core.vocabulary import HIGHEST_TIER, MODE, REPLICA_SPREAD_TIER
from stormtopo.devenv.workloads import PD_1P1D, Role
from stormtopo.operator.index import Index
from tests import example_index
from tests.builders import pod, roleset, service

LEAF_SPREAD = {MODE: "hard", HIGHEST_TIER: "1", REPLICA_SPREAD_TIER: "1"}
ALL_FREE = {f"node{i}": 8 for i in range(8)}


def replica(name: str, nodes: tuple[str, str] | None = None, held: bool = False, revision: str = "r1") -> list[dict[str, Any]]:
    """A 1P1D replica's RoleSet and pods: bound to `nodes`, or held at the gate, or let go and unbound."""
    prefill, decode = nodes or (None, None)
    return [
        roleset(name, revision=revision),
        pod(f"{name}-p", "prefill", prefill, held, replica=name),
        pod(f"{name}-d", "decode", decode, held, replica=name),
    ]


def index_of(*objects: dict[str, Any], annotations: dict[str, str] | None = None, roles: tuple[Role, ...] = PD_1P1D) -> Index:
    """The index holding the service (spread over the leaves unless `annotations` say otherwise) and `objects`."""
    return example_index.index_of(service(LEAF_SPREAD if annotations is None else annotations, roles), *objects)
