"""Leaving the cluster as it was (issue 32, item 3): what the uninstall plans, from one snapshot."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

from stormtopo.core.request import ClusterTiers
from stormtopo.core.topology.fabric import parse_topology
from stormtopo.core.topology.hypernodes import hypernode_manifests
from stormtopo.core.topology.node_tier import plan_node_tier
from stormtopo.core.uninstall import ClusterPages, ClusterSnapshot, plan_uninstall, plan_uninstall_in_pages
from stormtopo.core.vocabulary import DOMAIN_GATE, HEAL_ANNOTATION, HIGHEST_TIER, MODE, MOVES_ANNOTATION
from stormtopo.core.writes import CreateHyperNode, DeleteHyperNode, PatchPod, PatchPodGroup, SetHyperNodeMembers, Write
from tests import builders
from tests.builders import roleset

CLUSTER = ClusterTiers(frozenset({1, 2}))
FABRIC = parse_topology("switches:\n  spine:\n    leaf-a: [a0, a1]\n    leaf-b: [b0, b1]\n")


def held(name: str) -> dict[str, Any]:
    gates = [{"name": "other"}, {"name": DOMAIN_GATE}]
    return builders.pod(name, None, labels={}, spec={"schedulingGates": gates}, kind=None)


def snapshot(
    service: dict[str, Any], podgroup_spec: dict[str, Any], hypernodes: list[dict[str, Any]] | None = None, request: str | None = None
) -> ClusterSnapshot:
    meta: dict[str, Any] = {"name": "svc-rs-0", "namespace": "ns", "labels": {"roleset-name": "svc-rs-0"}}
    if request is not None:
        meta["annotations"] = {"stormtopo.io/request": request}
    podgroup = {"metadata": meta, "spec": podgroup_spec}
    return ClusterSnapshot(
        hypernodes=tuple(hypernodes or hypernode_manifests(FABRIC)),
        pods=(held("router-0"), {"metadata": {"name": "free", "namespace": "ns"}, "spec": {}}),
        stormservices=(service,),
        rolesets=(roleset("svc-rs-0", spec=service["spec"]["template"]["spec"], kind=None),),
        podgroups=(podgroup,),
        tiers=CLUSTER,
    )


def moving(annotations: dict[str, str]) -> dict[str, Any]:
    moves = {"svc-rs-0": {"toTier": 1, "at": "2026-12-03T00:00:00Z"}}
    return builders.service({**annotations, MOVES_ANNOTATION: json.dumps(moves)})


HELD_HARD = {"minMember": 2, "networkTopology": {"mode": "hard", "highestTierAllowed": 1}}


def test_a_gate_of_stormtopos_is_removed_and_only_it() -> None:
    writes = plan_uninstall(snapshot(builders.service(), {}))
    (release,) = [w for w in writes if isinstance(w, PatchPod)]
    assert release.name == "router-0"
    assert release.ops == [
        {"op": "test", "path": "/spec/schedulingGates/1/name", "value": DOMAIN_GATE},
        {"op": "remove", "path": "/spec/schedulingGates/1"},
    ]


def patches_of(cluster: ClusterSnapshot) -> list[PatchPodGroup]:
    return [w for w in plan_uninstall(cluster) if isinstance(w, PatchPodGroup)]


def test_a_move_hold_goes_back_to_what_the_service_asks() -> None:
    soft = moving({MODE: "soft", HIGHEST_TIER: "1", HEAL_ANNOTATION: "true"})
    (patch,) = [w for w in plan_uninstall(snapshot(soft, HELD_HARD)) if isinstance(w, PatchPodGroup)]
    topology = next(op["value"] for op in patch.ops if op["path"] == "/spec/networkTopology")
    assert topology["mode"] == "soft"
    # A service whose request is invalid now: its last valid request, as the PodGroup records it (review:
    # removing the topology while the request annotation stays is refused by the chart's policy).
    typo = moving({MODE: "hrad", HIGHEST_TIER: "1"})
    (patch,) = [
        w for w in plan_uninstall(snapshot(typo, HELD_HARD, request="soft within tier 1, scope RoleSet")) if isinstance(w, PatchPodGroup)
    ]
    assert patch.ops == [{"op": "replace", "path": "/spec/networkTopology", "value": {"mode": "soft", "highestTierAllowed": 1}}]
    # One that asks for nothing at all: the constraint withdrawn, its request annotation first.
    plain = moving({})
    patches = [
        w for w in plan_uninstall(snapshot(plain, HELD_HARD, request="hard within tier 1, scope RoleSet")) if isinstance(w, PatchPodGroup)
    ]
    assert [op["op"] + " " + op["path"] for w in patches for op in w.ops] == [
        "remove /metadata/annotations/stormtopo.io~1request",
        "remove /spec/networkTopology",
    ]
    # Not held (another topology than the move's): left alone.
    assert not [
        w
        for w in plan_uninstall(snapshot(soft, {"networkTopology": {"mode": "soft", "highestTierAllowed": 1}}))
        if isinstance(w, PatchPodGroup)
    ]
    # No move under way: nothing to let go.
    assert not [
        w for w in plan_uninstall(snapshot(builders.service({MODE: "soft", HIGHEST_TIER: "1"}), HELD_HARD)) if isinstance(w, PatchPodGroup)
    ]


def test_the_node_tier_is_taken_back_leaves_first() -> None:
    base = hypernode_manifests(FABRIC)
    on = _applied(base, plan_node_tier(base, {"a0": 2}, {n: 8 for n in FABRIC.nodes}))
    writes = plan_uninstall(snapshot(builders.service(), {}, on))
    tiered = [w for w in writes if isinstance(w, SetHyperNodeMembers | DeleteHyperNode)]
    assert tiered and isinstance(tiered[0], SetHyperNodeMembers) and isinstance(tiered[-1], DeleteHyperNode)
    assert sorted(_applied(on, writes), key=lambda h: h["metadata"]["name"]) == sorted(base, key=lambda h: h["metadata"]["name"])


def _applied(hypernodes: list[dict[str, Any]], writes: list[Write]) -> list[dict[str, Any]]:
    state = {h["metadata"]["name"]: json.loads(json.dumps(h)) for h in hypernodes}
    for write in writes:
        match write:
            case CreateHyperNode(body):
                state[body["metadata"]["name"]] = json.loads(json.dumps(body))
            case SetHyperNodeMembers(name, members, _):
                state[name]["spec"]["members"] = json.loads(json.dumps(list(members)))
            case DeleteHyperNode(name):
                state.pop(name)
    return list(state.values())


def test_in_pages_each_page_is_planned_as_it_is_read_and_the_whole_plans_as_one_snapshot() -> None:
    """Issue 43, item 5: the uninstall holds one page of pods or PodGroups at a time, not every pod of the
    cluster: the gates of a page are planned before the next page is read, and the batches add up to the
    plan over one snapshot of the same objects."""
    read: list[int] = []

    def pod_pages() -> Iterator[list[dict[str, Any]]]:
        for page in range(3):
            read.append(page)
            yield [held(f"pod-{page}-{i}") for i in range(2)] + [{"metadata": {"name": f"free-{page}", "namespace": "ns"}, "spec": {}}]

    soft = moving({MODE: "soft", HIGHEST_TIER: "1", HEAL_ANNOTATION: "true"})
    others = [builders.service(name=f"other-{i}") for i in range(3)]  # no move under way: not kept
    one = snapshot(soft, HELD_HARD)
    pages = ClusterPages(one.hypernodes, pod_pages(), [others[:2], [soft, others[2]]], [one.rolesets], [(), one.podgroups], one.tiers)
    batches = plan_uninstall_in_pages(pages)
    first = next(batches)
    assert read == [0] and [w.name for w in first if isinstance(w, PatchPod)] == ["pod-0-0", "pod-0-1"]
    rest = [w for batch in batches for w in batch]
    assert read == [0, 1, 2]
    whole = plan_uninstall(
        ClusterSnapshot(
            one.hypernodes,
            tuple(p for page in [[held(f"pod-{n}-{i}") for i in range(2)] for n in range(3)] for p in page),
            (*others, soft),
            one.rolesets,
            one.podgroups,
            one.tiers,
        )
    )
    assert [*first, *rest] == whole
    assert sum(isinstance(w, PatchPodGroup) for w in whole) == 1


def test_every_gate_of_stormtopos_comes_off_and_no_other() -> None:
    """The room gate of exact preemption as well as the domain gate; with both and another's between them, the
    last of stormtopo's is removed first so the indices stay right, and the other's gate stays."""
    from stormtopo.core.uninstall import release_gates
    from stormtopo.core.vocabulary import ROOM_GATE

    def gated(*names: str) -> dict[str, Any]:
        return {"metadata": {"name": "p", "namespace": "ns"}, "spec": {"schedulingGates": [{"name": n} for n in names]}}

    [room] = release_gates([gated("other", ROOM_GATE)])
    assert list(room.ops) == [
        {"op": "test", "path": "/spec/schedulingGates/1/name", "value": ROOM_GATE},
        {"op": "remove", "path": "/spec/schedulingGates/1"},
    ]
    [both] = release_gates([gated(DOMAIN_GATE, "other", ROOM_GATE)])
    gates = [{"name": DOMAIN_GATE}, {"name": "other"}, {"name": ROOM_GATE}]
    for op in both.ops:  # applied in order, as the API server applies a JSON patch
        index = int(op["path"].rsplit("/", 1)[-1] if op["op"] == "remove" else op["path"].split("/")[3])
        if op["op"] == "test":
            assert gates[index]["name"] == op["value"]
        else:
            del gates[index]
    assert gates == [{"name": "other"}]
    assert release_gates([gated("other")]) == []


def test_a_narrowing_goes_back_to_the_request_its_podgroup_records_with_no_service_needed() -> None:
    """core/narrowing.py: a soft replica held hard while it preempts. Judged from the PodGroup alone, in every
    page of PodGroups, whatever its service (no move under way)."""
    record = {"stormtopo.io/narrowed": json.dumps({"v": 1, "tier": 1, "at": "2026-12-05T00:00:00Z"})}
    plain = builders.service({MODE: "soft", HIGHEST_TIER: "2"})
    narrowed = snapshot(plain, HELD_HARD, request="soft within tier 2, scope RoleSet")
    narrowed.podgroups[0]["metadata"]["annotations"] |= record
    (patch,) = [w for w in plan_uninstall(narrowed) if isinstance(w, PatchPodGroup)]
    assert patch.ops == [{"op": "replace", "path": "/spec/networkTopology", "value": {"mode": "soft", "highestTierAllowed": 2}}]
    # A record on a PodGroup not held by it (let go already, or written by someone else): left alone.
    let_go = snapshot(plain, {"networkTopology": {"mode": "soft", "highestTierAllowed": 2}}, request="soft within tier 2, scope RoleSet")
    let_go.podgroups[0]["metadata"]["annotations"] |= record
    assert not [w for w in plan_uninstall(let_go) if isinstance(w, PatchPodGroup)]
    # No request recorded to go back to: left as it is, rather than given a topology guessed from nothing.
    unknown = snapshot(plain, HELD_HARD)
    unknown.podgroups[0]["metadata"]["annotations"] = dict(record)
    assert not [w for w in plan_uninstall(unknown) if isinstance(w, PatchPodGroup)]
