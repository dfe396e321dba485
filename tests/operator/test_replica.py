"""The placement path's shell: one snapshot, one plan, its writes executed; the pending-gangs gauge
counts only replicas that are unsatisfiable now."""

from __future__ import annotations

import asyncio
from typing import Any, cast

from prometheus_client import REGISTRY

from stormtopo.core.replica import ReplicaMemory
from stormtopo.operator.index import Index
from stormtopo.operator.replica import PlacementReporter


def _gauge() -> float | None:
    return REGISTRY.get_sample_value("stormtopo_pending_gangs")


def test_a_replica_whose_service_opts_out_leaves_the_pending_gauge() -> None:
    index = Index(cast(Any, None))  # no API call: objects arrive as events
    index.set_nodes({}, float("inf"))  # nodes read "now": no API read of them either
    said: list[tuple[str, str]] = []
    reporter = PlacementReporter(
        index, cast(Any, None), lambda _obj, kind, reason, _msg: said.append((kind, reason)), cast(Any, None), cast(Any, None)
    )
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


def test_pods_read_from_a_list_keep_their_status_so_a_failed_anchor_is_not_live() -> None:
    from stormtopo.core.placement import is_live
    from stormtopo.operator.index import slim_listed_pods

    item = {"metadata": {"name": "p", "namespace": "ns"}, "spec": {"nodeName": "node0"}, "status": {"phase": "Failed"}}  # no kind
    (pod,) = slim_listed_pods([item])
    assert pod["status"]["phase"] == "Failed" and not is_live(pod)


def test_an_explanation_that_answers_after_the_replica_was_placed_says_nothing() -> None:
    from stormtopo.core.explanation import Explanation, Pending
    from stormtopo.core.replica import Explain
    from stormtopo.core.vocabulary import HIGHEST_TIER, MODE
    from tests.builders import pod, roleset, service
    from tests.example_index import index_of

    index = index_of(service({MODE: "hard", HIGHEST_TIER: "1"}), roleset(), pod("p", "prefill", "node4"), pod("d", "decode", "node5"))
    said: list[str] = []

    class Worker:  # the explanation worker process, answering late: the replica was bound meanwhile
        async def explain(self, *_: object) -> Pending:
            return Pending(1, Explanation((1, 1), 1, (), None))

    class Room:
        async def free_gpus(self, taking_new_pods: bool = True) -> dict[str, int]:
            return {}

        def holders_now(self) -> dict[str, list[object]]:
            return {}

    reporter = PlacementReporter(
        index, cast(Any, None), lambda _obj, _kind, reason, _msg: said.append(reason), cast(Any, Worker()), cast(Any, Room())
    )
    snapshot = index.replica_snapshot(("ns", "svc-rs"), 0.0)
    assert snapshot is not None and snapshot.request is not None
    reporter._remember(("ns", "svc-rs"), ReplicaMemory(next_check=10.0))  # asked while it was pending
    reporter._asks[("ns", "svc-rs")] = (Explain(snapshot.request, (1, 1), 2), snapshot.topology)
    asyncio.run(reporter._explain(("ns", "svc-rs")))
    assert said == [] and not _gauge()


def test_a_preemption_pins_the_replica_only_when_every_victim_went() -> None:
    """The writer evicts the planned victims (matched on their nodes, only in the namespaces given), then
    lets the replica go: into the victims' domain if all were evicted, as it is if one was refused."""
    from stormtopo.core.writes import PatchPod, PreemptPods, Victim
    from stormtopo.kube.errors import Forbidden
    from stormtopo.operator.writer import execute

    def victim_pod(name: str, namespace: str) -> dict[str, Any]:
        spec = {
            "nodeName": "n0",
            "schedulerName": "volcano",
            "priority": 10,
            "containers": [{"resources": {"requests": {"nvidia.com/gpu": "4"}}}],
        }
        return {"metadata": {"name": name, "namespace": namespace, "uid": f"u-{name}"}, "spec": spec, "status": {"phase": "Running"}}

    class FakeApi:
        def __init__(self, refuse: set[str]) -> None:
            self.refuse = refuse
            self.evicted: list[tuple[str, str, str]] = []
            self.patched: list[Any] = []

        def raw_list(self, path: str, **query: str) -> list[dict[str, Any]]:
            return [victim_pod("a", "batch"), victim_pod("b", "batch"), victim_pod("c", "team")]

        def evict_pod(self, namespace: str, name: str, uid: str = "") -> None:
            if name in self.refuse:
                raise Forbidden(403, "POST", "eviction", "refused")
            self.evicted.append((namespace, name, uid))

        def patch_pod(self, namespace: str, name: str, ops: list[dict[str, Any]]) -> None:
            self.patched.append(ops[0]["value"])

    write = PreemptPods(
        "ns",
        "rs",
        (Victim("n0", 4, 10), Victim("n0", 4, 10)),
        pinned=(PatchPod("ns", "p", ({"op": "test", "path": "/x", "value": "pinned"},)),),
        unpinned=(PatchPod("ns", "p", ({"op": "test", "path": "/x", "value": "unpinned"},)),),
        namespaces=("batch",),
    )
    api = FakeApi(set())
    asyncio.run(execute(cast(Any, api), [write]))
    assert api.evicted == [("batch", "a", "u-a"), ("batch", "b", "u-b")] and api.patched == ["pinned"]  # never team's c
    refused = FakeApi({"b"})
    asyncio.run(execute(cast(Any, refused), [write]))
    assert refused.evicted == [("batch", "a", "u-a")] and refused.patched == ["unpinned"]
