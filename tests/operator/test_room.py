"""The free-room reading (operator/room.py): one list of bound pods and of nodes, selected on the server,
then only the watch (issue 33, item 5: no list of every pod at rest); GPUs held and freed follow the
events. Against a small HTTP server that speaks the API's list and watch protocol."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any, cast

from aiohttp import web

from stormtopo.core.preemption import Holder
from stormtopo.core.victims import GangSize
from stormtopo.core.vocabulary import GPU
from stormtopo.kube.client import Api
from stormtopo.operator.loops import Loops
from stormtopo.operator.room import BOUND, NodeRoom, pod_gpus
from tests import builders
from tests.kube.kubeconfig import kubeconfig_for


def _pod(name: str, node: str, gpus: int, phase: str = "Running") -> dict[str, Any]:
    """Another tenant's pod on `node` asking for `gpus` GPUs (and a CPU)."""
    spec = {"nodeName": node, "containers": [{"resources": {"requests": {GPU: str(gpus), "cpu": "1"}}}]}
    return builders.pod(name, None, namespace="t", labels={}, spec=spec, status={"phase": phase}, version="1", kind=None)


def _node(name: str, gpus: int, ready: str = "True") -> dict[str, Any]:
    return {
        "metadata": {"name": name, "resourceVersion": "1"},
        "spec": {"taints": [{"key": "gpu", "value": "yes", "effect": "NoSchedule"}]},
        "status": {"allocatable": {GPU: str(gpus), "cpu": "4"}, "conditions": [{"type": "Ready", "status": ready}]},
    }


def test_a_pod_holds_gpus_only_while_bound_and_unfinished() -> None:
    assert pod_gpus(_pod("a", "n0", 2)) == ("n0", 2)
    assert pod_gpus(_pod("a", "n0", 0)) is None  # another tenant's CPU pod costs no memory
    assert pod_gpus(_pod("a", "n0", 2, "Succeeded")) is None
    assert pod_gpus({**_pod("a", "", 2)}) is None


def test_node_labels_are_one_mapping_until_a_label_changes() -> None:
    """The reading is the one owner of the nodes' labels (issue 44): the index builds the switch tree over the
    mapping it hands out, by identity, so it must stay the same object while no label changes (a heartbeat, a
    node's GPUs) and be another once one does, a node comes or a node goes."""
    room = NodeRoom(cast(Any, None), Loops())
    room._on_node(None, _node("n0", 8))
    first = room.labels_now()
    assert first == {"n0": {}} and room.labels_now() is first
    room._on_node(None, _node("n0", 4, ready="False"))  # its GPUs and readiness: the labels stay
    assert room.labels_now() is first
    labelled = {**_node("n0", 4, ready="False"), "metadata": {"name": "n0", "labels": {"rack": "r1"}}}
    room._on_node(None, labelled)
    second = room.labels_now()
    assert second is not first and second == {"n0": {"rack": "r1"}} and first == {"n0": {}}  # (a reader's copy kept)
    room._on_node(None, _node("n1", 8))
    assert (third := room.labels_now()) is not second and set(third) == {"n0", "n1"}
    room._on_node("DELETED", _node("n1", 8))
    assert room.labels_now() is not third and set(room.labels_now()) == {"n0"}


def test_the_version_of_some_labels_changes_with_them_and_with_the_nodes_only() -> None:
    room = NodeRoom(cast(Any, None), Loops())
    room._on_node(None, _node("n0", 8))
    rack, nfd = frozenset({"rack"}), frozenset({"nfd/cpu"})
    first, nfd_first = room.label_version(rack), room.label_version(nfd)
    room._on_node(None, {**_node("n0", 8), "metadata": {"name": "n0", "labels": {"nfd/cpu": "x"}}})
    assert room.label_version(rack) == first and room.label_version(nfd) != nfd_first  # another label
    room._on_node(None, {**_node("n0", 8), "metadata": {"name": "n0", "labels": {"nfd/cpu": "x", "rack": "r1"}}})
    assert (second := room.label_version(rack)) != first
    room._on_node(None, _node("n1", 8))
    assert (third := room.label_version(rack)) != second  # a node come
    room._on_node("DELETED", _node("n1", 8))
    assert (fourth := room.label_version(rack)) != third  # and gone
    room._on_node(None, {**_node("n0", 8), "metadata": {"name": "n0", "labels": {"nfd/cpu": "x"}}})
    assert room.label_version(rack) != fourth  # a label it reads taken off
    # Only the keys asked about are counted: a node labelled with ever new keys keeps nothing per key.
    for i in range(50):
        room._on_node(None, {**_node("n0", 8), "metadata": {"name": "n0", "labels": {f"evil.example/k{i}": "x"}}})
    assert set(room._key_changes) == {"rack", "nfd/cpu"}


def test_lists_once_then_follows_the_watch(tmp_path: Path) -> None:
    async def scenario() -> None:
        lists: dict[str, list[dict[str, str]]] = {"pods": [], "nodes": []}
        events: dict[str, asyncio.Queue[dict[str, Any] | None]] = {"pods": asyncio.Queue(), "nodes": asyncio.Queue()}

        def serve(kind: str, items: list[dict[str, Any]]) -> Any:
            async def handler(request: web.Request) -> web.StreamResponse:
                if request.query.get("watch") != "true":
                    lists[kind].append(dict(request.query))
                    return web.json_response({"metadata": {"resourceVersion": "5"}, "items": items})
                response = web.StreamResponse()
                await response.prepare(request)
                while (event := await events[kind].get()) is not None:
                    await response.write(json.dumps(event).encode() + b"\n")
                return response

            return handler

        app = web.Application()
        app.router.add_get("/api/v1/pods", serve("pods", [_pod("a", "n0", 2), _pod("cpu", "n1", 0)]))
        app.router.add_get("/api/v1/nodes", serve("nodes", [_node("n0", 8), _node("n1", 8), _node("down", 8, ready="False")]))
        runner = web.AppRunner(app)
        await runner.setup()
        await web.TCPSite(runner, "127.0.0.1", 0).start()
        port = runner.addresses[0][1]
        kubeconfig = kubeconfig_for(tmp_path, f"http://127.0.0.1:{port}")
        loops = Loops()
        room = NodeRoom(Api(str(kubeconfig)), loops)

        async def until(condition: Any) -> None:
            for _ in range(1000):  # up to 20 s on a loaded machine
                if condition():
                    return
                await asyncio.sleep(0.02)
            raise AssertionError("condition not met within 20 s")

        try:
            assert await room.free_gpus() == {"n0": 6, "n1": 8}  # the node that is not Ready takes no new pods
            assert await room.free_gpus(taking_new_pods=False) == {"n0": 6, "n1": 8, "down": 8}
            assert await room.allocatable_gpus() == {"n0": 8, "n1": 8, "down": 8}
            facts = await room.node_facts()  # every pod's requests count, GPUs or not
            assert facts["n1"].left["cpu"] == 3000 and facts["n0"].left["cpu"] == 3000 and facts["down"].left["cpu"] == 4000
            assert facts["n0"].taints == ({"key": "gpu", "value": "yes", "effect": "NoSchedule"},)
            assert lists["pods"][0]["fieldSelector"] == BOUND and "labelSelector" not in lists["pods"][0]
            await events["pods"].put({"type": "ADDED", "object": _pod("b", "n1", 4)})
            await until(lambda: room._used.get("n1") == 4)
            assert await room.free_gpus() == {"n0": 2 + 4, "n1": 4}
            await events["pods"].put({"type": "MODIFIED", "object": _pod("b", "n1", 4)})  # a status update: no change
            changes = room.changes
            await events["pods"].put({"type": "DELETED", "object": _pod("a", "n0", 2)})
            await until(lambda: "n0" not in room._used)
            assert room.changes == changes + 1
            assert (await room.node_facts())["n0"].left["cpu"] == 4000
            await events["nodes"].put({"type": "DELETED", "object": _node("n1", 8)})
            await until(lambda: "n1" not in room._nodes)
            assert await room.free_gpus() == {"n0": 8}
            assert len(lists["pods"]) == 1 and len(lists["nodes"]) == 1  # at rest: the watch, no second list
        finally:
            for queue in events.values():
                await queue.put(None)
            await loops.stop()
            await room.close()
            await runner.cleanup()

    asyncio.run(scenario())


def test_the_reading_keeps_how_preemption_ranks_each_gpu_pod_and_forgets_it_with_the_pod() -> None:
    room = NodeRoom(Api.__new__(Api), Loops())
    batch = _pod("batch", "n0", 4) | {"spec": {**_pod("batch", "n0", 4)["spec"], "schedulerName": "volcano", "priority": 100}}
    kept = {**batch, "metadata": {**batch["metadata"], "name": "kept", "annotations": {"volcano.sh/preemptable": "false"}}}
    other = {**_pod("other", "n0", 2), "spec": {**_pod("other", "n0", 2)["spec"], "priority": 5}}  # the default scheduler's
    cpu_only = _pod("cpu", "n0", 0)
    for pod in (batch, kept, other, cpu_only):
        room._on_pod("ADDED", pod)
    held = sorted(room.holders_now()["n0"], key=lambda h: (h.gpus, h.preemptable))
    assert held == [Holder(2, 5, False), Holder(4, 100, False), Holder(4, 100, True)]
    room._on_pod("DELETED", batch)
    room._pod_gone(("t", "kept"))
    assert room.holders_now() == {"n0": (Holder(2, 5, False),)} and len(room._pods) == 1


def test_the_reading_knows_each_gpu_pods_gang_and_each_gangs_running_pods() -> None:
    """Exact preemption counts a victim of a gang as the whole gang lost: the gang from the pod's PodGroup
    annotation, its size from the pods the reading holds (no other team's PodGroup is read)."""
    room = NodeRoom(Api.__new__(Api), Loops())

    def member(name: str, node: str, group: str | None) -> dict[str, Any]:
        pod = _pod(name, node, 4)
        pod["spec"] |= {"schedulerName": "volcano", "priority": 100}
        if group:
            pod["metadata"] = {**pod["metadata"], "annotations": {"scheduling.k8s.io/group-name": group}}
        return pod

    for pod in (member("a-0", "n0", "a"), member("a-1", "n1", "a"), member("alone", "n0", None)):
        room._on_pod("ADDED", pod)
    ns = member("a-0", "n0", "a")["metadata"]["namespace"]
    assert sorted(h.gang or "" for h in room.holders_now()["n0"]) == ["", f"{ns}/a"]
    assert room.gangs_now() == {f"{ns}/a": GangSize(2, 2, 8)}
    room._on_pod("DELETED", member("a-1", "n1", "a"))
    assert room.gangs_now() == {f"{ns}/a": GangSize(1, 1, 4)}
    room._on_pod("DELETED", member("a-0", "n0", "a"))
    assert room.gangs_now() == {}  # the gang's last pod: nothing of it is kept


def test_what_the_reading_keeps_as_each_event_comes_is_what_one_list_of_the_last_states_gives() -> None:
    """Who holds each node's GPUs, each gang's pods and each node's facts are kept as each event changes them, not
    rebuilt: after 3,000 random events (pods bound, moved, resized, re-ranked, regrouped, deleting, finished,
    deleted; a node changed), the reading equals one filled from each pod's and node's last state alone."""
    import random

    rng = random.Random(41)
    nodes, names = [f"n{i}" for i in range(6)], [f"p{i}" for i in range(40)]
    last: dict[str, dict[str, Any] | None] = {}
    room = NodeRoom(Api.__new__(Api), Loops())
    for node in nodes:
        room._on_node("ADDED", _node(node, 8))
    node_last = {node: _node(node, 8) for node in nodes}
    for _ in range(3000):
        if rng.random() < 0.02:
            node = rng.choice(nodes)
            node_last[node] = _node(node, rng.choice((4, 8)), ready=rng.choice(("True", "False")))
            room._on_node("MODIFIED", node_last[node])
            continue
        name = rng.choice(names)
        if rng.random() < 0.1:
            room._on_pod("DELETED", last.get(name) or _pod(name, "n0", 1))
            last[name] = None
            continue
        pod = _pod(name, rng.choice(nodes), rng.choice((0, 1, 2, 4)), phase=rng.choice(("Running", "Running", "Succeeded")))
        pod["spec"] |= {"schedulerName": rng.choice(("volcano", "default-scheduler")), "priority": rng.choice((10, 100))}
        marks = {"scheduling.k8s.io/group-name": rng.choice(("a", "b", "c"))} if rng.random() < 0.7 else {}
        pod["metadata"] |= {"annotations": marks} | ({"deletionTimestamp": "2026-12-06T00:00:00Z"} if rng.random() < 0.2 else {})
        room._on_pod("MODIFIED", pod)
        last[name] = pod
    fresh = NodeRoom(Api.__new__(Api), Loops())
    for node in node_last.values():
        fresh._on_node("ADDED", node)
    for pod in last.values():
        if pod is not None:
            fresh._on_pod("ADDED", pod)

    def holders(r: NodeRoom) -> dict[str, list[Holder]]:
        return {n: sorted(hs, key=repr) for n, hs in r.holders_now().items()}

    assert holders(room) == holders(fresh) and room.holders_now()
    assert room.gangs_now() == fresh.gangs_now() and room.gangs_now()
    assert room.facts_now() == fresh.facts_now()
    assert room.free_now(False) == fresh.free_now(False) and room.releasing_now() == fresh.releasing_now()
    # Nothing kept that the last states do not need: requests alike shared while a pod asks for them, nodes'
    # requests while a pod requests anything there.
    assert room._shared == fresh._shared and room._requested == fresh._requested
    for pod in last.values():
        if pod is not None:
            room._on_pod("DELETED", pod)
    assert room._shared == {} and room._requested == {} and room._holds == {} and room._pods == {}


def test_what_the_first_lists_bring_is_frozen_out_of_the_collectors_passes_once(monkeypatch: Any) -> None:
    """At 16,384 nodes the first full pass over the reading held the event loop about 45 ms: once pods and nodes are
    both listed the first time, it is frozen (operator/collector.py); never again at a re-list (a freeze keeps any
    cycle among what it froze from the collector for good), nor with the nodes alone listed."""
    from stormtopo.operator import collector

    frozen: list[bool] = []
    monkeypatch.setattr(collector.gc, "freeze", lambda: frozen.append(True))
    room = NodeRoom(Api.__new__(Api), Loops())
    room._on_listed("Node")
    assert frozen == []  # the nodes alone (their labels for the tree): the pods not followed yet
    room._on_listed("Pod")
    assert frozen == [True]
    room._on_listed("Pod")  # a re-list
    room._on_listed("Node")
    assert frozen == [True]
