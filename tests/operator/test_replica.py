"""The placement path's shell: one snapshot, one plan, its writes executed; the pending-gangs gauge
counts only replicas that are unsatisfiable now."""

from __future__ import annotations

import asyncio
from typing import Any, cast

from prometheus_client import REGISTRY

from stormtopo.core.replica import ReplicaMemory
from stormtopo.operator.index import Index
from stormtopo.operator.loops import Loops
from stormtopo.operator.replica import PlacementReporter
from stormtopo.operator.room import NodeRoom


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

        def holders_now(self) -> dict[str, tuple[object, ...]]:
            return {}

        def gangs_now(self) -> dict[str, object]:
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


def test_a_preemption_evicts_only_in_the_namespaces_given_and_the_release_follows_whatever_happened() -> None:
    """The writer evicts the planned victims (matched on their nodes, only in the namespaces given), and the
    replica's release that follows is carried out whether every eviction went, one was refused, or the
    nodes' pods could not be read."""
    from stormtopo.core.writes import PatchPod, PreemptPods, Victim, Write
    from stormtopo.kube.errors import ApiUnavailable, Forbidden
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
        def __init__(self, refuse: set[str], unreadable: bool = False) -> None:
            self.refuse, self.unreadable = refuse, unreadable
            self.evicted: list[tuple[str, str, str]] = []
            self.patched: list[str] = []

        def raw_list(self, path: str, **query: str) -> list[dict[str, Any]]:
            if self.unreadable:
                raise ApiUnavailable("GET", path, "timed out")
            return [victim_pod("a", "batch"), victim_pod("b", "batch"), victim_pod("c", "team")]

        def evict_pod(self, namespace: str, name: str, uid: str = "") -> None:
            if name in self.refuse:
                raise Forbidden(403, "POST", "eviction", "refused")
            self.evicted.append((namespace, name, uid))

        def patch_pod(self, namespace: str, name: str, ops: list[dict[str, Any]]) -> None:
            self.patched.append(name)

    writes: list[Write] = [
        PreemptPods("ns", "rs", (Victim("n0", 4, 10), Victim("n0", 4, 10)), namespaces=("batch",)),
        PatchPod("ns", "rs-prefill-0", ({"op": "remove", "path": "/spec/schedulingGates/0"},)),
    ]
    api = FakeApi(set())
    asyncio.run(execute(cast(Any, api), writes))
    assert api.evicted == [("batch", "a", "u-a"), ("batch", "b", "u-b")] and api.patched == ["rs-prefill-0"]  # never team's c
    refused = FakeApi({"b"})
    asyncio.run(execute(cast(Any, refused), writes))
    assert refused.evicted == [("batch", "a", "u-a")] and refused.patched == ["rs-prefill-0"]
    unreadable = FakeApi(set(), unreadable=True)
    asyncio.run(execute(cast(Any, unreadable), writes))
    assert unreadable.evicted == [] and unreadable.patched == ["rs-prefill-0"]


def test_the_room_reading_counts_room_on_its_way_as_free_less_what_was_taken_for_a_replica_not_placed_yet() -> None:
    """Exact preemption's reading: a pod being deleted is no victim and its GPUs are free; the room the
    leader took for a held replica is kept from the next one until that replica is placed; victims only in
    the namespaces given."""
    from stormtopo.core.preempting import RoomClaim
    from stormtopo.core.writes import Victim
    from stormtopo.kube.client import Api
    from stormtopo.operator.loops import Loops
    from stormtopo.operator.room import NodeRoom
    from tests import builders

    def pod(name: str, namespace: str, node: str, deleting: bool = False) -> dict[str, Any]:
        """A running batch pod of 4 GPUs on `node`, `deleting` or not."""
        spec = {"schedulerName": "volcano", "priority": 10, "containers": [{"resources": {"requests": {"nvidia.com/gpu": "4"}}}]}
        obj = builders.pod(name, None, node, namespace=namespace, labels={}, spec=spec, status={"phase": "Running"}, kind=None)
        if deleting:
            obj["metadata"]["deletionTimestamp"] = "2026-12-05T00:00:00Z"
        return obj

    room = NodeRoom(Api.__new__(Api), Loops())
    for p in (pod("a", "batch", "n0"), pod("b", "batch", "n0", deleting=True), pod("c", "team", "n1"), pod("d", "batch", "n1")):
        room._on_pod("ADDED", p)
    assert room.releasing_now() == {"n0": 4}
    index = Index(cast(Any, None))
    reporter = PlacementReporter(index, cast(Any, None), lambda *_: None, cast(Any, None), room, victim_namespaces=frozenset({"batch"}))
    mine, other = ("ns", "svc-rs"), ("ns", "next-rs")
    reading = reporter._room_reading(other, {"n0": 0, "n1": 0})
    assert reading.free == {"n0": 4, "n1": 0}  # b's room is on its way
    assert [h.preemptable for h in reading.holders["n0"]] == [True, False]  # b is leaving: never a victim again
    assert reading.namespaces == frozenset({"batch"})  # team's c is not the given namespaces' (the planner's filter)
    # Room taken for a replica that is not placed yet is not the next one's ...
    service = {"kind": "StormService", "metadata": {"name": "svc", "namespace": "ns", "annotations": {}}, "spec": {"replicas": 1}}
    roleset = {"kind": "RoleSet", "metadata": {"name": "svc-rs", "namespace": "ns", "labels": {"storm-service-name": "svc"}}}
    roleset["spec"] = {
        "roles": [
            {"name": "r", "replicas": 1, "template": {"spec": {"containers": [{"resources": {"requests": {"nvidia.com/gpu": "4"}}}]}}}
        ]
    }
    index.observe("StormService", "ADDED", service)
    index.observe("RoleSet", "ADDED", roleset)
    held = builders.pod("svc-rs-r-0", "r", held=True)
    index.observe("Pod", "ADDED", held)  # its pod, held: not placed yet
    reporter._claims[mine] = RoomClaim({"n0": 4, "n1": 4}, float("inf"), (Victim("n0", 4, 10), Victim("n1", 4, 10)), counting=True)
    theirs = reporter._room_reading(other, {"n0": 0, "n1": 0})
    assert theirs.free == {"n0": 0, "n1": 0} and theirs.claimed_elsewhere == {"n0", "n1"}
    # On n0 the victim claimed is b, alike and leaving (evicted for it): a stays a victim. On n1 one of two alike goes.
    assert [h.preemptable for h in theirs.holders["n0"]] == [True, False] and len(theirs.holders["n1"]) == 1
    own = reporter._room_reading(mine, {"n0": 0, "n1": 0})  # ... but the replica that claimed it plans with its own room
    assert own.free == {"n0": 4, "n1": 0} and len(own.holders["n1"]) == 2 and not own.claimed_elsewhere
    # ... until its pods are gone (scaled away: the RoleSet still there) ...
    index.observe("Pod", "DELETED", held)
    assert reporter._room_reading(other, {"n0": 0, "n1": 0}).free == {"n0": 4, "n1": 0} and not reporter._claims
    reporter._claims[mine] = RoomClaim({"n0": 4}, float("inf"))
    index.observe("Pod", "ADDED", held)
    assert reporter._room_reading(other, {"n0": 0, "n1": 0}).free == {"n0": 0, "n1": 0}
    # ... or it is gone (or placed, or past its hold): then the claim is dropped.
    index.observe("RoleSet", "DELETED", roleset)
    assert reporter._room_reading(other, {"n0": 0, "n1": 0}).free == {"n0": 4, "n1": 0} and not reporter._claims


def test_the_tree_is_built_over_the_free_room_readings_labels_and_again_only_when_those_it_reads_change() -> None:
    """One owner of the nodes' labels (issue 44): read_nodes hands the free-room reading's mapping to the index,
    not a copy; the tree is rebuilt when the labels it reads changed (by the reading's version of them) or the
    HyperNodes did, not for another label; a HyperNode that selects by other labels needs no new read."""
    index = Index(cast(Any, None))
    hypernode = {"metadata": {"name": "r0"}, "spec": {"tier": 1, "members": [{"type": "Node", "selector": {"exactMatch": {"name": "n0"}}}]}}
    index.observe("HyperNode", "ADDED", hypernode)
    room = NodeRoom(cast(Any, None), Loops())
    room._listed["Node"] = asyncio.Event()
    room._listed["Node"].set()
    room._streams = cast(Any, object())  # (followed already: no watch is started)
    node = {"metadata": {"name": "n0", "labels": {"rack": "r1", "zone": "z1", "kubernetes.io/hostname": "n0"}}, "status": {}}
    room._on_node(None, node)
    reporter = PlacementReporter(index, cast(Any, None), lambda *_: None, cast(Any, None), room)
    asyncio.run(reporter.read_nodes(0.0))
    tree, reads = index.topology(), index.node_reads
    assert index.nodes is asyncio.run(room.node_labels()) and index.known_nodes(fresh=True).hostnames == {"n0": "n0"}
    room._on_node(None, {**node, "metadata": {**node["metadata"], "labels": {**node["metadata"]["labels"], "nfd": "x"}}})
    asyncio.run(reporter.read_nodes(0.0))  # a label the tree does not read: nothing to rebuild
    assert index.node_reads == reads and index.topology() is tree and index.nodes["n0"]["nfd"] == "x"
    room._on_node(None, {**node, "metadata": {**node["metadata"], "labels": {**node["metadata"]["labels"], "zone": "z2"}}})
    asyncio.run(reporter.read_nodes(3600.0))  # read moments ago: not read again (a label it does not read yet changed)
    assert index.nodes["n0"]["zone"] == "z1"
    by_label = {"type": "Node", "selector": {"labelMatch": {"matchLabels": {"zone": "z2"}}}}
    index.observe("HyperNode", "ADDED", {"metadata": {"name": "r1"}, "spec": {"tier": 1, "members": [by_label]}})
    asyncio.run(reporter.read_nodes(3600.0))  # the HyperNodes changed: read at the next look, however recent
    assert index.topology() is not tree and "n0" in index.topology().nodes_under("r1")
    reads = index.node_reads
    room._on_node(None, {**node, "metadata": {**node["metadata"], "labels": {**node["metadata"]["labels"], "zone": "z3"}}})
    asyncio.run(reporter.read_nodes(0.0))
    assert index.node_reads == reads + 1 and "n0" not in index.topology().nodes_under("r1")
