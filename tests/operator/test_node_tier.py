"""The node tier's loop (--node-tier): one pass reads the GPU readings and the index's HyperNodes and
executes the plan; a second pass over what it wrote writes nothing; a stale index (a HyperNode created or
deleted already) is no failure; only the leader writes. The API server is a dict of HyperNodes here; the
real one is in tests/integration/test_node_tier.py."""

from __future__ import annotations

import asyncio
import copy
from typing import Any, cast

from stormtopo.core.topology.fabric import parse_topology
from stormtopo.core.topology.hypernodes import hypernode_manifests
from stormtopo.core.vocabulary import GPU, HIGHEST_TIER, MODE
from stormtopo.kube.client import Api, ApiError
from stormtopo.operator import metrics
from stormtopo.operator.index import Index
from stormtopo.operator.node_tier import NodeTier
from stormtopo.operator.room import NodeRoom
from stormtopo.operator.writer import HyperNodeWritesRefused

FABRIC = parse_topology("switches:\n  spine:\n    leaf-a: [a0, a1]\n    leaf-b: [b0, b1]\n")
PREFIX = "/apis/topology.volcano.sh/v1alpha1/hypernodes"


class HyperNodesApi(Api):
    """HyperNodes as the API server keeps them: POST (409 if there), merge PATCH of members, DELETE (404 if gone)."""

    def __init__(self, hypernodes: list[dict[str, Any]]) -> None:
        self.stored = {h["metadata"]["name"]: copy.deepcopy(h) for h in hypernodes}
        self.calls: list[str] = []

    def request(self, method: str, path: str, body: Any = None, content_type: str = "", **_: str) -> Any:
        name = path.removeprefix(PREFIX).strip("/")
        self.calls.append(f"{method} {name or body['metadata']['name']}")
        if method == "POST":
            if body["metadata"]["name"] in self.stored:
                raise ApiError.of(409, method, path, "already exists")
            self.stored[body["metadata"]["name"]] = copy.deepcopy(body)
        elif name not in self.stored:
            raise ApiError.of(404, method, path, "not found")
        elif method == "PATCH":
            self.stored[name]["spec"]["members"] = body["spec"]["members"]
        elif method == "DELETE":
            del self.stored[name]
        elif method == "GET":
            return copy.deepcopy(self.stored[name])
        return {}


class Readings(NodeRoom):
    """The free-room reading as the watch would feed it: every node of FABRIC with 8 GPUs, and one pod
    per node holding what `used` says."""

    def __init__(self, used: dict[str, int]) -> None:
        super().__init__(cast(Any, None), cast(Any, None))
        for node in FABRIC.nodes:
            self._on_node(None, {"metadata": {"name": node}, "status": {"allocatable": {GPU: "8"}}})
        for node, gpus in used.items():
            self.hold(node, gpus)

    def hold(self, node: str, gpus: int) -> None:
        pod = {"metadata": {"namespace": "t", "name": f"on-{node}"}, "spec": {"nodeName": node, "containers": []}}
        pod["spec"]["containers"] = [{"resources": {"requests": {GPU: str(gpus)}}}]
        self._on_pod("MODIFIED", pod)

    async def _ready(self) -> None:
        return None


def written(verb: str) -> float:
    return metrics.NODE_TIER_WRITES.labels(verb)._value.get()


def test_a_pass_renders_the_list_and_the_next_writes_nothing() -> None:
    api = HyperNodesApi(hypernode_manifests(FABRIC))
    index = Index(api)
    for h in api.stored.values():
        index.observe("HyperNode", None, h)
    readings = Readings({"a0": 3})
    created = written("create")
    asyncio.run(NodeTier(index, api, readings).check())
    assert api.calls == ["POST a0.node", "POST a1.node", "PATCH leaf-a"]  # a0 partly used; a1 the next empty node
    assert written("create") == created + 2
    # The index as the watch delivers it: the next pass writes nothing.
    for h in api.stored.values():
        index.observe("HyperNode", None, h)
    api.calls.clear()
    asyncio.run(NodeTier(index, api, readings).check())
    assert api.calls == []

    # a0 full, b0 partly used: the list moves to b0 and a1. The index has not seen what an earlier pass
    # did (b0.node created, a0.node deleted): the 409 and the 404 are no failure.
    readings.hold("a0", 8)
    readings.hold("b0", 2)
    api.stored["b0.node"] = copy.deepcopy(api.stored["a0.node"])
    api.stored["b0.node"]["metadata"]["name"] = "b0.node"
    api.stored["b0.node"]["spec"]["members"][0]["selector"]["exactMatch"]["name"] = "b0"
    del api.stored["a0.node"]
    deleted = written("delete")
    asyncio.run(NodeTier(index, api, readings).check())
    # The 409 is checked: b0.node is the node tier's (an earlier pass's), so leaf-b may name it.
    assert api.calls == ["POST b0.node", "GET b0.node", "PATCH leaf-a", "PATCH leaf-b", "DELETE a0.node"]
    assert written("delete") == deleted  # nothing was deleted by this pass


def test_a_pass_is_planned_off_the_event_loop_over_its_own_copy_of_the_hypernodes(monkeypatch: Any) -> None:
    """At 16,384 nodes a pass where anything moved is about 130 ms of CPU: planned on a thread, the event loop
    (admissions, /healthz) goes on meanwhile; the thread gets the HyperNodes as they were, not the index's dict
    view, which the watch goes on changing."""
    import threading

    from stormtopo.operator import node_tier

    api = HyperNodesApi(hypernode_manifests(FABRIC))
    index = Index(api)
    for h in api.stored.values():
        index.observe("HyperNode", None, h)
    seen: list[tuple[bool, type]] = []
    plan = node_tier.plan_pass

    def planned(reading: Any, memory: Any) -> Any:
        seen.append((threading.current_thread() is threading.main_thread(), type(reading.hypernodes)))
        return plan(reading, memory)

    monkeypatch.setattr(node_tier, "plan_pass", planned)
    asyncio.run(NodeTier(index, api, Readings({"a0": 3})).check())
    assert seen == [(False, tuple)] and api.calls  # (and it wrote what it planned)


def test_only_the_leader_writes() -> None:
    api = HyperNodesApi(hypernode_manifests(FABRIC))
    index = Index(api)
    for h in api.stored.values():
        index.observe("HyperNode", None, h)
    asyncio.run(NodeTier(index, api, Readings({}), leading=lambda: False).check())
    assert api.calls == []
    answers = iter([True, False])  # leading when the pass began, deposed while the room was read
    asyncio.run(NodeTier(index, api, Readings({}), leading=lambda: next(answers)).check())
    assert api.calls == []


def test_a_change_of_the_reading_is_planned_at_once_and_nothing_new_plans_nothing() -> None:
    api = HyperNodesApi(hypernode_manifests(FABRIC))
    index = Index(api)
    for h in api.stored.values():
        index.observe("HyperNode", None, h)
    readings = Readings({})
    tier = NodeTier(index, api, readings)
    asyncio.run(tier.check())
    for h in api.stored.values():
        index.observe("HyperNode", None, h)
    asyncio.run(tier.check())  # over what it wrote: writes nothing
    api.calls.clear()
    asyncio.run(tier.check())
    assert api.calls == []  # nothing changed: nothing planned, nothing read from the API server
    readings.hold("b1", 4)  # a pod bound on b1 (the watch's event)
    asyncio.run(tier.check())
    assert "POST b1.node" in api.calls  # the list follows it at the next pass
    for _ in range(5):  # the passes that follow finish what the change began
        index.hypernodes.clear()
        for h in api.stored.values():
            index.observe("HyperNode", None, h)
        api.calls.clear()
        asyncio.run(tier.check())
        if not api.calls:
            break
    assert api.calls == []
    readings.hold("b1", 4)  # the same pod again (a status update) changes nothing
    asyncio.run(tier.check())
    assert api.calls == []


def test_a_stormservice_of_whole_node_pods_keeps_the_runs_of_empty_nodes() -> None:
    # Nothing bound or gone: the StormService alone moves the list. Its replicas need two empty nodes
    # in one leaf, so the empty nodes of leaf-a's run (a0, a1) are no longer listed.
    api = HyperNodesApi(hypernode_manifests(FABRIC))
    index = Index(api)
    for h in api.stored.values():
        index.observe("HyperNode", None, h)
    tier = NodeTier(index, api, Readings({"b0": 4, "b1": 2}), keep_runs=True)
    asyncio.run(tier.check())
    # a0: the next empty, a1 beside it (SPARE_EMPTY)
    assert sorted(api.stored) == ["a0.node", "a1.node", "b0.node", "b1.node", "leaf-a", "leaf-b", "spine"]
    for h in api.stored.values():
        index.observe("HyperNode", None, h)

    def role(name: str, gpus: int) -> dict[str, Any]:
        resources = {"requests": {"nvidia.com/gpu": str(gpus)}}
        return {"name": name, "replicas": 1, "template": {"spec": {"containers": [{"name": "c", "resources": resources}]}}}

    spec = {"replicas": 1, "template": {"spec": {"roles": [role("prefill", 8), role("decode", 8)]}}}
    # Without a topology its gangs take empty nodes anywhere: nothing changes.
    index.observe("StormService", "ADDED", {"kind": "StormService", "metadata": {"name": "plain", "namespace": "ns"}, "spec": spec})
    asyncio.run(tier.check())
    assert sorted(api.stored) == ["a0.node", "a1.node", "b0.node", "b1.node", "leaf-a", "leaf-b", "spine"]
    meta = {"name": "big", "namespace": "ns", "annotations": {MODE: "hard", HIGHEST_TIER: "1"}}
    index.observe("StormService", "ADDED", {"kind": "StormService", "metadata": meta, "spec": spec})
    asyncio.run(tier.check())
    assert sorted(api.stored) == ["b0.node", "b1.node", "leaf-a", "leaf-b", "spine"]
    assert api.stored["leaf-a"]["spec"]["members"][0]["type"] == "Node"  # a0 named by its leaf again


def test_by_default_no_run_is_kept_for_whole_node_replicas() -> None:
    # Without --node-tier-keep-runs every replica that one node holds gets one: the next empty node stays listed.
    api = HyperNodesApi(hypernode_manifests(FABRIC))
    index = Index(api)
    for h in api.stored.values():
        index.observe("HyperNode", None, h)
    containers = [{"name": "c", "resources": {"requests": {"nvidia.com/gpu": "8"}}}]
    roles = [{"name": r, "replicas": 1, "template": {"spec": {"containers": containers}}} for r in ("prefill", "decode")]
    meta = {"name": "big", "namespace": "ns", "annotations": {MODE: "hard", HIGHEST_TIER: "1"}}
    index.observe("StormService", "ADDED", {"kind": "StormService", "metadata": meta, "spec": {"template": {"spec": {"roles": roles}}}})
    asyncio.run(NodeTier(index, api, Readings({"b0": 4, "b1": 2})).check())
    assert sorted(api.stored) == ["a0.node", "a1.node", "b0.node", "b1.node", "leaf-a", "leaf-b", "spine"]


def test_a_template_without_a_gpu_count_does_not_stop_the_list() -> None:
    api = HyperNodesApi(hypernode_manifests(FABRIC))
    index = Index(api)
    for h in api.stored.values():
        index.observe("HyperNode", None, h)
    containers = [{"resources": {"requests": {"nvidia.com/gpu": "eight"}}}]
    spec = {"template": {"spec": {"roles": [{"name": "r", "template": {"spec": {"containers": containers}}}]}}}
    meta = {"name": "odd", "namespace": "ns", "annotations": {MODE: "hard"}}
    index.observe("StormService", "ADDED", {"kind": "StormService", "metadata": meta, "spec": spec})
    asyncio.run(NodeTier(index, api, Readings({"a0": 3}), keep_runs=True).check())
    assert api.calls == ["POST a0.node", "POST a1.node", "PATCH leaf-a"]  # planned as without it


def test_a_template_without_a_gpu_count_is_said_once_per_generation(caplog: Any) -> None:
    api = HyperNodesApi(hypernode_manifests(FABRIC))
    index = Index(api)
    for h in api.stored.values():
        index.observe("HyperNode", None, h)
    tier = NodeTier(index, api, Readings({"b0": 4}), keep_runs=True)
    role = {
        "name": "decode",
        "replicas": 1,
        "template": {"spec": {"containers": [{"name": "c", "resources": {"requests": {"nvidia.com/gpu": "x"}}}]}},
    }
    meta = {"name": "odd", "namespace": "ns", "generation": 1, "annotations": {MODE: "hard", HIGHEST_TIER: "1"}}
    service = {"kind": "StormService", "metadata": meta, "spec": {"replicas": 1, "template": {"spec": {"roles": [role]}}}}
    index.observe("StormService", "ADDED", service)
    for _ in range(3):
        asyncio.run(tier.check())
    said = [r for r in caplog.records if "no GPU count" in r.getMessage()]
    assert len(said) == 1 and "ns/odd" in said[0].getMessage()
    index.observe("StormService", "MODIFIED", {**service, "metadata": {**meta, "generation": 2}})
    asyncio.run(tier.check())
    assert len([r for r in caplog.records if "no GPU count" in r.getMessage()]) == 2  # a new template: said again


def test_the_operator_keeps_pairs() -> None:
    # leaf-a's a0 and a1 (4 free each) are a pair; leaf-b's b0 (6 free) costs none: only b0 is listed.
    api = HyperNodesApi(hypernode_manifests(FABRIC))
    index = Index(api)
    for h in api.stored.values():
        index.observe("HyperNode", None, h)
    asyncio.run(NodeTier(index, api, Readings({"a0": 4, "a1": 4, "b0": 2, "b1": 8})).check())
    assert sorted(api.stored) == ["b0.node", "leaf-a", "leaf-b", "spine"]  # without pairs: a0 and a1 too


class _HyperNodeApi:
    """The HyperNode calls of the API client; a create of `refuse` fails (503), of `taken` finds a foreign one."""

    def __init__(self, refuse: str = "", taken: str = "") -> None:
        self.refuse, self.taken = refuse, taken
        self.calls: list[tuple[str, str]] = []

    def create_hypernode(self, body: dict) -> bool:  # type: ignore[type-arg]
        name = body["metadata"]["name"]
        self.calls.append(("create", name))
        if name == self.refuse:
            from stormtopo.kube.client import ApiError

            raise ApiError.of(503, "POST", "/hypernodes", "webhook unavailable")
        return name != self.taken

    def get(self, *args: object) -> dict:  # type: ignore[type-arg]
        return {"metadata": {"name": args[-1], "labels": {"team": "x"}}}

    def set_hypernode_members(self, name: str, members: list, resource_version: str | None = None) -> None:  # type: ignore[type-arg]
        self.calls.append(("update", name))

    def delete_hypernode(self, name: str, resource_version: str | None = None) -> bool:
        self.calls.append(("delete", name))
        return True


def test_a_leaf_is_not_pointed_at_a_tier0_hypernode_whose_create_failed() -> None:
    """Review: a refused create (Volcano's webhook down) and then the leaf's update left the leaf naming a
    HyperNode that does not exist; and a create that found someone else's HyperNode of that name."""
    import asyncio

    import pytest

    from stormtopo.core.writes import CreateHyperNode, SetHyperNodeMembers
    from stormtopo.operator.writer import HyperNodeWritesRefused, execute_hypernode_writes

    def plan(name: str) -> list:  # type: ignore[type-arg]
        body = {"metadata": {"name": name, "labels": {"stormtopo.io/node-tier": "true"}}, "spec": {"tier": 0, "members": []}}
        leaf = [{"type": "HyperNode", "selector": {"exactMatch": {"name": name}}}]
        other = [{"type": "Node", "selector": {"exactMatch": {"name": "n9"}}}]
        return [CreateHyperNode(body), SetHyperNodeMembers("s0", leaf, "1"), SetHyperNodeMembers("s1", other, "1")]

    for api in (_HyperNodeApi(refuse="n0.node"), _HyperNodeApi(taken="n0.node")):
        with pytest.raises(HyperNodeWritesRefused):
            asyncio.run(execute_hypernode_writes(api, plan("n0.node")))  # type: ignore[arg-type]
        assert ("update", "s0") not in api.calls and ("update", "s1") in api.calls  # the other leaf goes on


def test_a_refused_write_is_a_warning_on_its_hypernode_once_per_kind_of_refusal() -> None:
    """Issue 33, item 6: refused writes are visible (an Event where an object fits), not fatal."""

    class Refusing(HyperNodesApi):
        def request(self, method: str, path: str, body: Any = None, content_type: str = "", **_: str) -> Any:
            if method == "POST":
                raise ApiError.of(403, method, path, 'denied by ValidatingAdmissionPolicy "team-hypernodes"')
            return super().request(method, path, body, content_type)

    api = Refusing(hypernode_manifests(FABRIC))
    index = Index(api)
    for h in api.stored.values():
        index.observe("HyperNode", None, h)
    said: list[tuple[str, str, str, str]] = []
    tier = NodeTier(
        index,
        api,
        Readings({"a0": 3}),
        report=lambda obj, kind, reason, message: said.append((obj["metadata"]["name"], kind, reason, message)),
    )
    for _ in range(3):  # the loop runs it again and again while the policy refuses
        try:
            asyncio.run(tier.check())
        except HyperNodeWritesRefused:
            pass
        else:
            raise AssertionError("the refusal must reach the loop (its metric and log)")
    assert [(name, kind, reason) for name, kind, reason, _ in said] == [
        ("a0.node", "Warning", "NodeTierWriteRefused"),
        ("a1.node", "Warning", "NodeTierWriteRefused"),
    ]
    assert "team-hypernodes" in said[0][3] and "create (403)" in said[0][3]


def test_a_named_leaf_it_cannot_use_is_said_once_per_change(caplog: Any) -> None:
    api = HyperNodesApi(hypernode_manifests(FABRIC))
    index = Index(api)
    for h in api.stored.values():
        index.observe("HyperNode", None, copy.deepcopy(h))  # what the index read, not what the passes write
    tier = NodeTier(index, api, Readings({}), named_leaves=frozenset({"leaf-a", "laef-b"}))
    with caplog.at_level("WARNING", logger="stormtopo.node_tier"):
        asyncio.run(tier.check())
        asyncio.run(tier.check())
    said = [r.getMessage() for r in caplog.records if "--node-tier-leaf" in r.getMessage()]
    assert said == ["node tier: --node-tier-leaf=laef-b is not used: no HyperNode has this name"]
