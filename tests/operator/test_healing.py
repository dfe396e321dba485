"""Healing's shell: a move's writes run in order, and an eviction the API server refuses midway (a
PodDisruptionBudget that changed since it was read) ends the move, is said, and backs the replica off."""

from __future__ import annotations

import asyncio
from typing import Any, cast

import pytest

from stormtopo.core.healing import BACKOFF, HealMemory, plan_healing
from stormtopo.kube.errors import ApiError
from stormtopo.operator.healing import Healer
from tests.core.test_healing import NOW, SOFT1, WIDE, service, snap


class RecordingApi:
    """Records each call; the second eviction is refused as a PodDisruptionBudget refuses it."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, ...]] = []

    def evict_pod(self, namespace: str, name: str) -> None:
        self.calls.append(("evict", name))
        if len([c for c in self.calls if c[0] == "evict"]) == 2:
            raise ApiError(
                429,
                "POST",
                f"/api/v1/namespaces/{namespace}/pods/{name}/eviction",
                "Cannot evict pod as it would violate the pod's disruption budget.",
            )

    def get(self, *args: Any) -> dict[str, Any]:
        self.calls.append(("get", args[-1]))
        return {"metadata": {"name": "svc", "namespace": "ns", "resourceVersion": "1", "annotations": {}}}

    def annotate_stormservice(self, namespace: str, name: str, key: str, value: str, version: str | None = None) -> dict[str, Any]:
        self.calls.append(("annotate", key, value))
        return {}


def test_a_refused_eviction_ends_the_move_says_why_and_backs_off() -> None:
    api = RecordingApi()
    said: list[tuple[str, str]] = []
    healer = Healer(
        cast(Any, None),
        cast(Any, api),
        lambda _obj, kind, reason, message: said.append((reason, message)),
        cast(Any, None),
        cast(Any, None),
    )
    snapshot = snap(service(SOFT1), WIDE)
    plan = plan_healing(snapshot, HealMemory())
    healer._memory[("ns", "svc")] = plan.memory
    asyncio.run(healer.carry_out(("ns", "svc"), snapshot, plan))
    assert [c[1] for c in api.calls if c[0] == "evict"] == ["svc-a-decode-0", "svc-a-prefill-0"]
    annotations = [c[2] for c in api.calls if c[0] == "annotate"]
    assert '"done":true' not in annotations[0] and '"done":true' in annotations[-1]  # the move begun, then recorded over
    assert [r for r, _ in said] == ["ReplicaMoving", "ReplicaNotMoved"]
    assert "eviction of pod svc-a-prefill-0 was refused" in said[-1][1]
    assert healer._memory[("ns", "svc")].next_try["svc-a"] == NOW + BACKOFF


def test_evictions_wait_for_the_move_to_be_recorded_over_what_was_read() -> None:
    class Moved(RecordingApi):
        def get(self, *args: Any) -> dict[str, Any]:
            return {"metadata": {"name": "svc", "namespace": "ns", "resourceVersion": "2", "annotations": {}}}  # changed since

    api = Moved()
    healer = Healer(cast(Any, None), cast(Any, api), lambda *_: None, cast(Any, None), cast(Any, None))
    svc = service(SOFT1)
    svc["metadata"]["resourceVersion"] = "1"
    snapshot = snap(svc, WIDE)
    asyncio.run(healer.carry_out(("ns", "svc"), snapshot, plan_healing(snapshot, HealMemory())))
    assert not [c for c in api.calls if c[0] in ("evict", "annotate")], api.calls


def test_an_error_that_is_no_budget_refusal_leaves_the_move_under_way() -> None:
    class Forbidden(RecordingApi):
        def evict_pod(self, namespace: str, name: str) -> None:
            self.calls.append(("evict", name))
            raise ApiError(403, "POST", "/eviction", '{"kind":"Status","message":"pods \\"x\\" is forbidden"}')

    api = Forbidden()
    said: list[str] = []
    healer = Healer(cast(Any, None), cast(Any, api), lambda _o, _k, reason, _m: said.append(reason), cast(Any, None), cast(Any, None))
    snapshot = snap(service(SOFT1), WIDE)
    with pytest.raises(ApiError):
        asyncio.run(healer.carry_out(("ns", "svc"), snapshot, plan_healing(snapshot, HealMemory())))
    assert said == ["ReplicaMoving"]  # no refusal said or recorded: the next pass resumes the move
    assert len([c for c in api.calls if c[0] == "annotate"]) == 1
