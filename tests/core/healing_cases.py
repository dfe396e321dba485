"""Healing's cases (core/healing.py) on the feature request's tree: leaves s0..s3 of two 8-GPU nodes each.
StormService svc, of roles BIG and updated by RollingUpdate (tests/builders.py: service(SOFT1, BIG,
update_strategy="RollingUpdate")), its replicas of two whole-node pods (16 GPUs: a leaf), read at NOW;
SOFT1 asks for tier 1, softly, and for healing. WIDE is a replica of it that found no leaf with room."""

from __future__ import annotations

import json
from typing import Any

from stormtopo.core.capabilities import cluster_tiers
from stormtopo.core.heal_snapshot import HealSnapshot
from stormtopo.core.replica_pods import Replica
from stormtopo.core.topology.fabric import parse_topology
from stormtopo.core.topology.hypernodes import hypernode_manifests
from stormtopo.core.vocabulary import HEAL_ANNOTATION, HIGHEST_TIER, MODE, PLACEMENT_ANNOTATION
from stormtopo.devenv.workloads import Role
from tests import builders
from tests.builders import pod, roleset, running
from tests.conftest import TOPOLOGY_FILE

TOPOLOGY = parse_topology(TOPOLOGY_FILE.read_text())
TIERS = cluster_tiers(hypernode_manifests(TOPOLOGY), None)
BIG = (Role("prefill", gpus=8), Role("decode", gpus=8))  # a whole leaf: 16 GPUs
SOFT1 = {MODE: "soft", HIGHEST_TIER: "1", HEAL_ANNOTATION: "true"}
NOW = 1_800_000_000.0  # 2027-01-15


def stamp(seconds: float) -> str:
    import datetime

    return datetime.datetime.fromtimestamp(seconds, datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def wide_service() -> dict[str, Any]:
    """The service soft within tier 1, its replica svc-a recorded placed in s4 (tier 2): one to look at."""
    svc = builders.service(SOFT1, BIG, update_strategy="RollingUpdate")
    svc["metadata"]["annotations"][PLACEMENT_ANNOTATION] = json.dumps({"svc-a": {"hyperNode": "s4", "tier": 2}})
    return svc


def replica(name: str, prefill: str | None, decode: str | None, created: float = NOW - 3600, ready: bool = True) -> Replica:
    """Replica `name` of the service, its pods created at `created` and running on the nodes given (none where None)."""
    pods = tuple(
        pod(
            f"{name}-{role}-0",
            role,
            node,
            replica=name,
            labels={"app": "svc"},
            status=running(ready, stamp(created + 5)),
            uid=f"{name}-{role}-{created:.0f}",
            created=stamp(created),
            kind=None,
        )
        for role, node in (("prefill", prefill), ("decode", decode))
        if node is not None
    )
    return Replica(roleset(name, BIG, kind=None), pods)


def free(busy: dict[str, int]) -> dict[str, int]:
    """Free GPUs per node with the given GPUs in use (fillers and replicas alike)."""
    return {n: 8 - busy.get(n, 0) for n in TOPOLOGY.nodes}


# A soft replica that found no leaf with room: prefill on node1 (s0), decode on node3 (s1); fillers on
# node2, node4..node7. node0 has just freed up: s0 holds the whole replica once it leaves node1.
WIDE = replica("svc-a", "node1", "node3")
BUSY = {"node1": 8, "node3": 8, "node2": 8, "node4": 8, "node5": 8, "node6": 8, "node7": 8}


def snap(svc: dict[str, Any], *replicas: Replica, busy: dict[str, int] = BUSY, budgets: tuple[dict[str, Any], ...] = ()) -> HealSnapshot:
    return HealSnapshot(svc, replicas, TIERS, TOPOLOGY, free(busy), budgets, NOW)
