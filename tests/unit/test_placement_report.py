"""The placement path's shell: one snapshot, one plan, its writes executed; the pending-gangs gauge
counts only replicas that are unsatisfiable now."""

from __future__ import annotations

import asyncio
from typing import Any, cast

from prometheus_client import REGISTRY

from stormtopo.core.replica import ReplicaMemory
from stormtopo.operator.index import Index
from stormtopo.operator.placement_report import PlacementReporter


def _gauge() -> float | None:
    return REGISTRY.get_sample_value("stormtopo_pending_gangs")


def test_a_replica_whose_service_opts_out_leaves_the_pending_gauge() -> None:
    index = Index(cast(Any, None))  # no API call: objects arrive as events
    index.set_nodes({}, float("inf"))  # nodes read "now": no API read of them either
    said: list[tuple[str, str]] = []
    reporter = PlacementReporter(index, lambda _obj, kind, reason, _msg: said.append((kind, reason)), cast(Any, None))
    service = {"kind": "StormService", "metadata": {"name": "svc", "namespace": "ns", "annotations": {}}, "spec": {"replicas": 1}}
    roleset = {"kind": "RoleSet", "metadata": {"name": "svc-rs", "namespace": "ns", "labels": {"storm-service-name": "svc"}}, "spec": {}}
    index.observe("StormService", "ADDED", service)
    index.observe("RoleSet", "ADDED", roleset)
    key = ("ns", "svc-rs")
    reporter._remember(key, ReplicaMemory(unsatisfiable=True))  # it was, while the service asked for hard tier 1
    assert _gauge() == 1.0
    asyncio.run(reporter.replica_changed(key))  # the service no longer asks for a topology
    assert _gauge() == 0.0
    reporter.forget(key)
    assert _gauge() == 0.0 and said == []
