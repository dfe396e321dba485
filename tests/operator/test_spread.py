"""The placement shell's part of the spread (core/spread.py): two workers never let two replicas of one
StormService go together, a placed replica wakes its held siblings, and a deleted replica is forgotten."""

from __future__ import annotations

import asyncio
import time
from typing import Any, cast

from stormtopo.core.writes import DeleteUnboundPod
from stormtopo.kube.client import Api as KubeApi
from stormtopo.kube.client import Conflict
from stormtopo.operator.index import Index
from stormtopo.operator.replica import PlacementReporter
from stormtopo.operator.writer import execute
from tests.core.spread_cases import ALL_FREE, index_of, replica


class Api:
    """Records the pod patches and labels; every call takes a while, as over the network."""

    def __init__(self) -> None:
        self.patched: list[str] = []
        self.ops: dict[str, list[dict[str, Any]]] = {}

    def patch_pod(self, _namespace: str, name: str, ops: list[dict[str, Any]]) -> None:
        time.sleep(0.01)
        self.patched.append(name)
        self.ops[name] = ops

    def label_pod(self, *_: object) -> None:
        time.sleep(0.01)

    def get(self, *_: object) -> None:
        return None  # the StormService as read for its record: gone, so nothing is recorded


class Room:
    async def free_gpus(self, taking_new_pods: bool = True) -> dict[str, int]:
        await asyncio.sleep(0.01)  # an await between the snapshot and the plan
        return dict(ALL_FREE)


def reporter_of(index: Index, api: Api, woken: list[tuple[str, str]]) -> PlacementReporter:
    index.set_nodes(index.nodes, float("inf"))  # read "now": no API read of the nodes
    reporter = PlacementReporter(index, cast(Any, api), lambda *_: None, cast(Any, None), cast(Any, Room()))
    reporter.wake = woken.append
    return reporter


def test_workers_planning_held_replicas_together_let_one_go_then_the_next_when_it_is_placed() -> None:
    index = index_of(*replica("svc-a", held=True), *replica("svc-b", held=True), *replica("svc-c", ("node6", "node7")))
    api, woken = Api(), []
    reporter = reporter_of(index, api, woken)

    async def scenario() -> None:
        await asyncio.gather(reporter.replica_changed(("ns", "svc-a")), reporter.replica_changed(("ns", "svc-b")))
        first = sorted(api.patched)
        assert first in (["svc-a-d", "svc-a-p"], ["svc-b-d", "svc-b-p"]), api.patched  # one replica, not both
        went, waits = first[0][:5], ("svc-b" if first[0].startswith("svc-a") else "svc-a")
        assert set(reporter._spread[("ns", "svc")].settling) == {went}
        assert ("ns", waits) in reporter._rechecks  # looked at again once the first no longer counts

        for pod in replica(went, ("node0", "node1"))[1:]:  # Volcano binds it in s0
            index.observe("Pod", "MODIFIED", pod)
        await reporter.replica_changed(("ns", went))
        assert woken == [("ns", waits)] and ("ns", "svc") not in reporter._spread
        await reporter.replica_changed(("ns", waits))
        assert sorted(api.patched[2:]) == [f"{waits}-d", f"{waits}-p"]
        excluded = api.ops[f"{waits}-p"][2]["value"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]
        assert excluded["nodeSelectorTerms"][0]["matchExpressions"][0]["values"] == ["node0", "node1", "node6", "node7"]
        reporter.forget(("ns", waits))
        assert ("ns", "svc") not in reporter._spread and ("ns", waits) not in reporter._rechecks

    asyncio.run(scenario())


class PodsApi:
    """A waiting pod whose status Volcano rewrites: a delete at an old version is a Conflict."""

    def __init__(self, node: str | None = None) -> None:
        self.pod = {"metadata": {"name": "p", "namespace": "ns", "resourceVersion": "42"}, "spec": {"nodeName": node} if node else {}}
        self.calls: list[str] = []

    def delete_unbound_pod(self, namespace: str, name: str, resource_version: str) -> None:
        self.calls.append(f"DELETE@{resource_version}")
        if resource_version != self.pod["metadata"]["resourceVersion"]:
            raise Conflict.of(409, "DELETE", name, "the object has been modified")

    def request(self, method: str, path: str, *_: object, **__: object) -> object:
        self.calls.append(method)
        return self.pod


def test_a_pod_to_hold_again_is_deleted_at_its_current_version_while_unbound_and_never_once_bound() -> None:
    waiting = PodsApi()
    asyncio.run(execute(cast(KubeApi, waiting), [DeleteUnboundPod("ns", "p", "41")]))
    assert waiting.calls == ["DELETE@41", "GET", "DELETE@42"]
    bound = PodsApi(node="node0")
    asyncio.run(execute(cast(KubeApi, bound), [DeleteUnboundPod("ns", "p", "41")]))
    assert bound.calls == ["DELETE@41", "GET"]  # bound meanwhile: it stays
