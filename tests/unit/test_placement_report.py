"""The pending-gangs gauge counts only replicas that are unsatisfiable now."""

from __future__ import annotations

import asyncio
from typing import Any, cast

from prometheus_client import REGISTRY

from stormtopo.operator import metrics
from stormtopo.operator.index import Index
from stormtopo.operator.placement_report import PlacementReporter


def _gauge() -> float | None:
    return REGISTRY.get_sample_value("stormtopo_pending_gangs")


def test_a_replica_whose_service_opts_out_leaves_the_pending_gauge() -> None:
    index = Index(cast(Any, None))  # no API call: objects arrive as events
    said: list[tuple[str, str]] = []
    reporter = PlacementReporter(index, lambda _obj, kind, reason, _msg: said.append((kind, reason)), cast(Any, None))
    service = {"kind": "StormService", "metadata": {"name": "svc", "namespace": "ns", "annotations": {}}, "spec": {"replicas": 1}}
    roleset = {"kind": "RoleSet", "metadata": {"name": "svc-rs", "namespace": "ns", "labels": {"storm-service-name": "svc"}}, "spec": {}}
    index.observe("StormService", "ADDED", service)
    index.observe("RoleSet", "ADDED", roleset)
    key = ("ns", "svc-rs")
    reporter._unsatisfiable.add(key)  # it was, while the service asked for hard tier 1
    metrics.PENDING_GANGS.set(len(reporter._unsatisfiable))
    assert _gauge() == 1.0
    asyncio.run(reporter.replica_changed(key))  # the service no longer asks for a topology
    assert key not in reporter._unsatisfiable and _gauge() == 0.0
    assert said == []
