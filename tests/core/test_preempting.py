"""Exact preemption (issue 41, item 3, on the cluster): a replica held at the room gate is let go at once where
it fits, after its fewest victims are evicted where it must preempt, and never held past its limit. On the
feature request's tree: leaves s0..s3 of two 8-GPU nodes each, spines s4 (s0, s1) and s5 (s2, s3)."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path
from typing import Any

from stormtopo.core.admission import admit_pod
from stormtopo.core.narrowing import narrowing_record
from stormtopo.core.node_fit import NodeFacts
from stormtopo.core.preempting import (
    DEFAULT_QUEUE,
    UNREADABLE,
    HeldReplica,
    RoomHold,
    RoomReading,
    VictimGroup,
    group_of,
    pick_victims,
    plan_room,
    queue_of,
)
from stormtopo.core.preemption import Holder
from stormtopo.core.priority import DEFAULT_CLASS
from stormtopo.core.replica import preemptor_priority
from stormtopo.core.request import ClusterTiers, Mode, TierLimit, TopologyRequest
from stormtopo.core.topology.fabric import parse_topology
from stormtopo.core.victims import Fewest, GangSize
from stormtopo.core.vocabulary import (
    DOMAIN_GATE,
    HIGHEST_TIER,
    MODE,
    NARROWED_ANNOTATION,
    REPLICA_SPREAD_TIER,
    ROOM_GATE,
    VOLCANO_SCHEDULER,
)
from stormtopo.core.writes import EvictPod, PatchPod, PatchPodGroup, PreemptPods, Victim
from tests import builders
from tests.builders import aibrix_roleset, service

TREE = parse_topology((Path(__file__).resolve().parents[2] / "examples" / "topology" / "aibrix-1730.yaml").read_text())
NODES = [f"node{i}" for i in range(8)]
FULL = dict.fromkeys(NODES, 0)
HARD1 = TopologyRequest(Mode.HARD, TierLimit(tier=1))
HIGH = 1000


HELD = [
    builders.pod(name, None, labels={}, spec={"schedulingGates": [{"name": ROOM_GATE}]}, kind=None)
    for name in ("rs-prefill-0", "rs-decode-0")
]


def batch(priority: int = 100) -> list[Holder]:
    return [Holder(4, priority, True), Holder(4, priority, True)]


ALL = {n: batch() for n in NODES}


def plan(**kw: Any) -> Any:
    """plan_room for replica rs (2 pods of 8 GPUs, both created and held, in the default queue) in the full
    cluster; `kw` overrides. Every holder is of a gang (Volcano's pg-controller gives each pod a PodGroup):
    a lone one is named for its node and place there; every gang's PodGroup is read, in the default queue and
    at its pods' class, unless `groups` says otherwise."""
    replica = HeldReplica(
        "ns",
        "rs",
        kw.pop("held", HELD),
        [8, 8],
        kw.pop("created", 2),
        kw.pop("bound", 0),
        kw.pop("specs", [{}]),
        kw.pop("held_for", 0.0),
        kw.pop("queue", DEFAULT_QUEUE),
        kw.pop("podgroup", None),
    )
    holders = {
        n: [h if h.gang else replace(h, gang=f"batch/{n}-{i}") for i, h in enumerate(hs)] for n, hs in kw.pop("holders", ALL).items()
    }
    groups = kw.pop("groups", None)
    if groups is None:  # each job at its pods' class (Volcano's pg-controller copies it), in the default queue
        groups = {h.gang: VictimGroup(DEFAULT_QUEUE, f"class-{h.priority}") for hs in holders.values() for h in hs if h.gang}
        kw["values"] = {f"class-{h.priority}": h.priority for hs in holders.values() for h in hs} | kw.get("values", {})
    reading = RoomReading(
        kw.pop("free", FULL),
        holders,
        kw.pop("gangs", {}),
        kw.pop("nodes", None),
        groups=groups,
        namespaces=kw.pop("namespaces", None),
        groups_read=kw.pop("groups_read", False),
        gangpreempt=kw.pop("gangpreempt", True),
        claimed_elsewhere=kw.pop("claimed_elsewhere", frozenset()),
    )
    args: dict[str, Any] = {
        "request": HARD1,
        "allowed_tier": 1,
        "topology": TREE,
        "hostnames": {},
        "priority": HIGH,
        "reading": reading,
        "hold": None,
    }
    return plan_room(replica, **(args | kw))


def taken(preempt: PreemptPods) -> tuple[tuple[str, int, int], ...]:
    """(node, GPUs, priority) of each victim."""
    return tuple((v.node, v.gpus, v.priority) for v in preempt.victims)


def preempts(room: Any) -> PreemptPods:
    [preempt] = [w for w in room.writes if isinstance(w, PreemptPods)]
    return preempt


def releases(writes: Any) -> list[PatchPod]:
    return [w for w in writes if isinstance(w, PatchPod)]


def test_a_full_cluster_preempts_exactly_one_leafs_four_pods_and_lets_the_replica_go_after() -> None:
    room = plan()
    preempt = preempts(room)
    assert room.writes[0] is preempt  # evicted before the replica goes
    assert taken(preempt) == tuple((n, 4, 100) for n in ("node0", "node0", "node1", "node1"))
    patches = releases(room.writes)
    assert [p.name for p in patches] == ["rs-prefill-0", "rs-decode-0"]
    # Not pinned to s0: Volcano places it onto the victims' room as they leave, and a replica whose room
    # another job took is never kept from all others.
    gate_only = [
        {"op": "test", "path": "/spec/schedulingGates/0/name", "value": ROOM_GATE},
        {"op": "remove", "path": "/spec/schedulingGates/0"},
    ]
    assert all(list(p.ops) == gate_only for p in patches)
    [say] = room.says
    assert say.reason == "ReplicaPreempting" and "preempts 4 pod(s) holding 16 GPUs (4 of priority 100) in tier-1 s0" in say.message
    assert room.hold == RoomHold(preempted=True)


def test_victims_are_only_of_the_replicas_own_queue_the_others_are_volcanos_to_reclaim() -> None:
    """s1 (one 8-GPU pod a node: 2 victims) is the cheapest leaf, but of another team's queue: the replica, in
    the default queue, takes s0's four of its own queue instead. In queue team-b it takes s1. A pod Volcano
    gave no PodGroup is of no queue and never a victim."""
    holders = ALL | {"node2": [Holder(8, 10, True, "b/one")], "node3": [Holder(8, 10, True, "b/two")]}
    groups = {f"batch/{n}-{i}": VictimGroup(DEFAULT_QUEUE) for n in NODES for i in (0, 1)}
    groups |= {"b/one": VictimGroup("team-b"), "b/two": VictimGroup("team-b")}
    assert {v.node for v in preempts(plan(holders=holders, groups=groups)).victims} == {"node0", "node1"}
    assert taken(preempts(plan(holders=holders, groups=groups, queue="team-b"))) == (("node2", 8, 10), ("node3", 8, 10))
    assert queue_of({"spec": {"queue": "team-b"}}) == "team-b" and queue_of({"spec": {}}) == DEFAULT_QUEUE and queue_of(None) is None
    unknown = plan(queue=None)  # its PodGroup not read yet: held, nothing evicted
    assert not unknown.writes and unknown.hold == RoomHold()


def test_victims_are_only_in_the_namespaces_given() -> None:
    """s0's four are another team's (namespace team): with victims only in batch (the chart's victimNamespaces), the
    replica takes s1's four instead; with none given, s0's, the first of the leaves alike."""
    holders = ALL | {n: [Holder(4, 100, True, f"team/{n}-{i}") for i in (0, 1)] for n in ("node0", "node1")}
    assert {v.node for v in preempts(plan(holders=holders)).victims} == {"node0", "node1"}
    assert {v.node for v in preempts(plan(holders=holders, namespaces=frozenset({"batch"}))).victims} == {"node2", "node3"}
    assert preempts(plan(holders=holders, namespaces=frozenset({"batch"}))).namespaces == ("batch",)
    assert not any(isinstance(w, PreemptPods) for w in plan(holders=holders, namespaces=frozenset({"other"})).writes)


def test_a_victim_is_ranked_by_its_jobs_class_not_its_pods_own_priority() -> None:
    """s1's pods run at priority 10, but their PodGroups name class inference-high (1,000,000), which Volcano ranks
    their jobs by: never victims of a replica at 1,000; nor while that class is not read yet, if the PodGroup was
    made a moment ago (a class that does not exist ranks at the cluster's default, as Volcano ranks it). A
    PodGroup naming no class ranks at the cluster's default (its globalDefault class): at 2,000, every one is
    spared; without a default, at 0, taken. Ties and the Event go by the job's priority too; a PodGroup marked
    volcano.sh/preemptable: "false" is never taken."""
    holders = ALL | {"node2": [Holder(8, 10, True, "b/one")], "node3": [Holder(8, 10, True, "b/two")]}
    high = {"b/one": VictimGroup(DEFAULT_QUEUE, "inference-high"), "b/two": VictimGroup(DEFAULT_QUEUE, "inference-high")}
    groups = {f"batch/{n}-{i}": VictimGroup(DEFAULT_QUEUE) for n in NODES for i in (0, 1)} | high
    values = {"inference-high": 1_000_000}
    assert {v.node for v in preempts(plan(holders=holders, groups=groups, values=values)).victims} == {"node0", "node1"}
    young = groups | {g: replace(v, young=True) for g, v in high.items()}
    unread = plan(holders=holders, groups=young, values={DEFAULT_CLASS: 0})  # made a moment ago, its class not read yet
    assert {v.node for v in preempts(unread).victims} == {"node0", "node1"}
    ghost = plan(holders=holders, groups=groups, values={DEFAULT_CLASS: 0})  # a class that does not exist: the default
    assert {v.node for v in preempts(ghost).victims} == {"node2", "node3"}
    classless = {g: VictimGroup(DEFAULT_QUEUE) for g in groups}  # naming none: the cluster's default, 0 here
    taken_then = preempts(plan(holders=holders, groups=classless, values={}))
    assert {v.node for v in taken_then.victims} == {"node2", "node3"}
    spared = plan(holders=holders, groups=groups, values=values | {DEFAULT_CLASS: 2000})  # every classless job above 1,000
    assert not [w for w in spared.writes if isinstance(w, PreemptPods)]
    shielded = {g: replace(v, preemptable=False) for g, v in high.items()}
    assert {v.node for v in preempts(plan(holders=holders, groups=groups | shielded, values={})).victims} == {"node0", "node1"}
    marked = {"metadata": {"annotations": {"volcano.sh/preemptable": "false"}}, "spec": {"queue": "q", "priorityClassName": "c"}}
    assert group_of({"spec": {"queue": "q", "priorityClassName": "c"}}) == VictimGroup("q", "c") and group_of(None) == UNREADABLE
    assert group_of(marked) == VictimGroup("q", "c", preemptable=False)
    old = {"metadata": {"creationTimestamp": "2027-01-15T08:00:00Z"}, "spec": {}}
    assert group_of(old, now=1_800_000_000.0 + 3600).young is False and group_of(old, now=1_800_000_030.0).young is True


def test_ties_and_the_event_go_by_the_jobs_priority() -> None:
    """Two leaves cost the same pods and GPUs: s0's jobs rank at 400 (their PodGroups' class) though their pods
    run at 0, s1's at 100. Volcano would take the lower-ranked job: so does the plan, and its Event says 100."""
    holders = (
        ALL
        | {n: [Holder(8, 0, True, f"a/{n}")] for n in ("node0", "node1")}
        | {n: [Holder(8, 100, True, f"b/{n}")] for n in ("node2", "node3")}
    )
    groups = {f"batch/{n}-{i}": VictimGroup(DEFAULT_QUEUE, "class-100") for n in NODES for i in (0, 1)}
    groups |= {f"a/{n}": VictimGroup(DEFAULT_QUEUE, "mid") for n in ("node0", "node1")}
    groups |= {f"b/{n}": VictimGroup(DEFAULT_QUEUE, "low") for n in ("node2", "node3")}
    room = plan(holders=holders, groups=groups, values={"mid": 400, "low": 100, "class-100": 100})
    assert {v.node for v in preempts(room).victims} == {"node2", "node3"}
    assert "(2 of priority 100)" in room.says[0].message


def test_the_podgroups_of_the_gangs_it_would_take_are_asked_for_then_it_plans_again() -> None:
    """PodGroups not read yet: the plan names the gangs it would take and evicts nothing; once they are read as
    another queue's, it asks for the next leaf's; once reads are over, a gang still unknown is left alone."""
    holders = ALL | {"node2": [Holder(8, 10, True, "b/one")], "node3": [Holder(8, 10, True, "b/two")]}
    first = plan(holders=holders, groups={})
    assert first.needs_groups == {"b/one", "b/two"} and not first.writes and first.hold == RoomHold()
    team_b = {"b/one": VictimGroup("team-b"), "b/two": VictimGroup("team-b")}
    second = plan(holders=holders, groups=team_b)
    assert second.needs_groups == {"batch/node0-0", "batch/node0-1", "batch/node1-0", "batch/node1-1"} and not second.writes
    over = plan(holders=holders, groups=team_b, groups_read=True)
    assert not [w for w in over.writes if isinstance(w, PreemptPods)] and not over.needs_groups  # none of its queue: let go
    assert len(releases(over.writes)) == 2 and over.hold is None
    gone = plan(holders=holders, groups={"b/one": UNREADABLE, "b/two": UNREADABLE}, groups_read=True)  # gone or refused
    assert not [w for w in gone.writes if isinstance(w, PreemptPods)]


def test_asked_for_the_fewest_gpus_it_takes_the_least_work_not_the_fewest_pods() -> None:
    """s2 holds one 8-GPU pod a node (2 pods, 16 GPUs); s0 two 4-GPU pods a node (4 pods, 16 GPUs); s1 is
    half free, its other halves held by 2-GPU pods (4 pods, 8 GPUs). The fewest pods: s2's two. The fewest
    GPUs: s1's four, and the Event says which it minimised."""
    holders = ALL | {"node2": [Holder(2, 100, True)] * 2, "node3": [Holder(2, 100, True)] * 2}
    holders |= {"node4": [Holder(8, 100, True)], "node5": [Holder(8, 100, True)]}
    free = FULL | {"node2": 4, "node3": 4}
    pods_first = plan(holders=holders, free=free)
    assert {v.node for v in preempts(pods_first).victims} == {"node4", "node5"}
    assert "the fewest pods that make room" in pods_first.says[0].message
    gpus_first = plan(holders=holders, free=free, fewest=Fewest.GPUS)
    assert taken(preempts(gpus_first)) == (("node2", 2, 100),) * 2 + (("node3", 2, 100),) * 2
    assert (
        "preempts 4 pod(s) holding 8 GPUs" in gpus_first.says[0].message and "the fewest GPUs that make room" in gpus_first.says[0].message
    )


def test_the_cheapest_leaf_is_taken_not_the_first() -> None:
    holders = {n: batch() for n in NODES} | {"node4": [Holder(8, 10, True)], "node5": [Holder(8, 10, True)]}
    assert taken(preempts(plan(holders=holders))) == (("node4", 8, 10), ("node5", 8, 10))


def test_a_replica_that_fits_now_goes_at_once_as_it_is() -> None:
    room = plan(free=FULL | {"node2": 8, "node3": 8})
    assert not [w for w in room.writes if isinstance(w, PreemptPods)]
    patches = releases(room.writes)
    assert len(patches) == 2 and all(len(p.ops) == 2 for p in patches)  # the gate only: no affinity
    assert room.hold is None and not room.says


def test_it_waits_for_every_pod_and_for_the_room_reading_and_never_past_its_limit() -> None:
    waiting = plan(created=1, held_for=10.0, hold=RoomHold())
    assert not waiting.writes and waiting.hold == RoomHold() and waiting.recheck_in == 20.0
    unknown_class = plan(priority=None)
    assert not unknown_class.writes and unknown_class.recheck_in == 30.0
    asks = plan(reading=None)
    assert asks.needs_room and not asks.writes
    late = plan(created=1, held_for=31.0)  # from its oldest pod's creation: a leader away counts too
    assert len(releases(late.writes)) == 2 and late.hold is None
    assert [s.reason for s in late.says] == ["ReplicaLetGo"]
    off = plan(enabled=False)  # turned off with pods still held: let go, nothing evicted
    assert len(releases(off.writes)) == 2 and all(len(p.ops) == 2 for p in releases(off.writes))


def test_room_being_released_counts_as_free_so_no_second_plan_takes_more() -> None:
    """node2 and node3 free up as their pods end (evicted by an earlier plan, or a leader before): counted
    free, the replica goes at once, nothing more is preempted."""
    room = plan(free=FULL | {"node2": 8, "node3": 8}, holders={n: batch() for n in NODES if n not in ("node2", "node3")})
    assert not [w for w in room.writes if isinstance(w, PreemptPods)] and len(releases(room.writes)) == 2


def test_only_nodes_every_pod_could_run_on_are_room() -> None:
    """The replica's pods select gpu=h100; only s3's nodes have it: victims there, though s0 is first. A node
    that takes no new pods (cordoned: not in the free reading) is never room, whatever the pods tolerate."""
    nodes = {n: NodeFacts({"gpu": "h100" if n in ("node6", "node7") else "a100"}) for n in NODES}
    room = plan(nodes=nodes, specs=[{"nodeSelector": {"gpu": "h100"}, "containers": [{"resources": {"requests": {"cpu": "64"}}}]}])
    assert {v.node for v in preempts(room).victims} == {"node6", "node7"}
    cordoned = plan(free={n: 0 for n in NODES if n not in ("node0", "node1")}, specs=[{"tolerations": [{"operator": "Exists"}]}])
    assert {v.node for v in preempts(cordoned).victims} == {"node2", "node3"}
    nowhere = plan(nodes=nodes, specs=[{"nodeSelector": {"gpu": "b200"}}])
    assert not [w for w in nowhere.writes if isinstance(w, PreemptPods)] and len(releases(nowhere.writes)) == 2


def test_a_replica_preempts_at_no_more_than_its_pods_were_admitted_at() -> None:
    """The strategy names a class of 2,000,000,000; its pods run at 100: victims must rank below 100."""
    spec = {"schedulingStrategy": {"volcanoSchedulingStrategy": {"priorityClassName": "system"}}}
    values = {"system": 2_000_000_000}
    pods = [{"spec": {"priority": 100}}, {"spec": {"priority": 5000}}]
    assert preemptor_priority(spec, values, pods) == 100
    assert preemptor_priority(spec, {}, pods) is None  # the class's value not read yet
    assert preemptor_priority({}, {}, [{"spec": {}}]) == 0


def test_it_evicts_once_per_hold_and_lets_go_when_nothing_qualifies() -> None:
    again = plan(hold=RoomHold(preempted=True))
    assert not [w for w in again.writes if isinstance(w, PreemptPods)] and len(releases(again.writes)) == 2
    equal = plan(holders={n: batch(priority=HIGH) for n in NODES})  # victims must rank strictly lower
    assert not [w for w in equal.writes if isinstance(w, PreemptPods)] and len(releases(equal.writes)) == 2
    opted_out = plan(request=None)
    assert len(releases(opted_out.writes)) == 2
    moving = plan(moving=True)  # healing moves it (voluntary): it goes where room was, never at others' cost
    assert not [w for w in moving.writes if isinstance(w, PreemptPods)] and len(releases(moving.writes)) == 2
    partly_bound = plan(bound=1)  # a pod of a running replica made again: not a fresh gang to preempt for
    assert not [w for w in partly_bound.writes if isinstance(w, PreemptPods)]
    assert plan(held=[]).writes == ()


def test_soft_takes_the_fewest_anywhere() -> None:
    soft = TopologyRequest(Mode.SOFT, TierLimit(tier=1))
    holders = {n: batch() for n in NODES} | {"node0": [Holder(8, 10, True)], "node7": [Holder(8, 10, True)]}
    preempt = preempts(plan(request=soft, holders=holders))
    assert taken(preempt) == (("node0", 8, 10), ("node7", 8, 10))  # two leaves apart: 2 pods, not 4


def bound(name: str, node: str, priority: int, gpus: int = 4, **spec: Any) -> dict[str, Any]:
    """A running batch pod of Volcano's on `node`, of `priority`, asking for `gpus` GPUs; `spec` overrides."""
    body = {"schedulerName": VOLCANO_SCHEDULER, "priority": priority}
    body |= {"containers": [{"resources": {"requests": {"nvidia.com/gpu": str(gpus)}}}]} | spec
    return builders.pod(name, None, node, namespace="batch", labels={}, spec=body, status={"phase": "Running"}, uid=f"u-{name}", kind=None)


def test_victims_are_matched_to_pods_on_their_nodes_by_gpus_and_priority_each_once() -> None:
    pods = {
        "node0": [
            bound("a", "node0", 100),
            bound("b", "node0", 100),
            bound("c", "node0", 50),
            bound("d", "node0", 100, gpus=2),
            {**bound("e", "node0", 100), "metadata": {"name": "e", "namespace": "batch", "deletionTimestamp": "x"}},
            bound("f", "node0", 100, schedulerName="default-scheduler"),  # not Volcano's to preempt
        ]
    }
    picked = pick_victims([Victim("node0", 4, 100), Victim("node0", 4, 100), Victim("node0", 4, 100)], pods)
    assert picked == [EvictPod("batch", "a", "u-a"), EvictPod("batch", "b", "u-b")]  # the third has no pod left
    assert pick_victims([Victim("node1", 4, 100)], pods) == []


def test_the_webhook_holds_a_pod_that_may_preempt_only_with_exact_preemption() -> None:
    annotations = {MODE: "hard", HIGHEST_TIER: "1"}
    svc = service(annotations)
    tiers = ClusterTiers(frozenset({1, 2}))

    def gates(priority: object, on: bool = True, **spec: Any) -> list[str]:
        pod = {"metadata": {"name": "p", "namespace": "ns", "labels": {}}, "spec": {"priority": priority, **spec}}
        decision = admit_pod(pod, aibrix_roleset(), svc, tiers, exact_preemption=on)
        return [op["value"] for op in decision.patch if op["path"].startswith("/spec/schedulingGates")]

    assert gates(1000) == [[{"name": ROOM_GATE}]]
    assert gates(1000, on=False) == [] and gates(0) == [] and gates(None) == []
    assert gates(1000, preemptionPolicy="Never") == []
    assert gates(1000, nodeName="node0") == []  # bound at creation: a gate would make it invalid
    assert gates(1000, schedulingGates=[{"name": "theirs"}]) == [{"name": ROOM_GATE}]  # added to the pod's own
    spread = service(annotations | {REPLICA_SPREAD_TIER: "2"})
    pod = {"metadata": {"name": "p", "namespace": "ns", "labels": {}}, "spec": {"priority": 1000}}
    decision = admit_pod(pod, aibrix_roleset(), spread, tiers, exact_preemption=True)
    assert [op["value"] for op in decision.patch if op["path"].startswith("/spec/schedulingGates")] == [[{"name": DOMAIN_GATE}]]


def test_a_victim_of_a_gang_costs_the_whole_gang_and_is_matched_within_it() -> None:
    """s0's node0 and node1 each hold a pod of gang g (4 GPUs) and a lone pod; s1's nodes two lone pods each:
    s0 costs the gang's 2 pods and 2 lone ones, as s1 costs 4 lone pods: of equal counts, the lowest priorities
    (g runs at 10). The victims name their gang, and only a pod of that gang matches."""
    g = [Holder(4, 10, True, "batch/g"), Holder(4, 100, True)]
    preempt = preempts(plan(holders={n: batch() for n in NODES} | {"node0": g, "node1": g}, gangs={"batch/g": GangSize(2, 2, 8)}))
    assert {v.gang for v in preempt.victims} == {"batch/g", "batch/node0-1", "batch/node1-1"}
    assert {v.node for v in preempt.victims} == {"node0", "node1"}
    member = bound("m", "node0", 10)
    member["metadata"]["annotations"] = {"scheduling.k8s.io/group-name": "g"}
    stranger = bound("s", "node0", 10)
    assert pick_victims([Victim("node0", 4, 10, "batch/g")], {"node0": [stranger, member]}) == [EvictPod("batch", "m", "u-m")]
    assert pick_victims([Victim("node0", 4, 10)], {"node0": [member]}) == []


def test_the_room_a_preempting_replica_claims_is_kept_until_it_is_placed_gone_or_past_its_hold() -> None:
    from stormtopo.core.preempting import RoomClaim, claimed_room, room_claim
    from stormtopo.core.writes import PreemptPods, Victim

    victims = tuple(Victim(node, 4, 0) for node in ("n0", "n0", "n1"))
    claim = room_claim([PreemptPods("ns", "svc-a", victims)], 100.0, 30.0)
    assert claim == RoomClaim({"n0": 8, "n1": 4}, 130.0, victims) and room_claim([], 100.0, 30.0) is None
    other = RoomClaim({"n1": 2}, 200.0)
    assert claimed_room({"a": claim, "b": other}, 120.0, set()) == ({"n0": 8, "n1": 6}, {"a": claim, "b": other})
    assert claimed_room({"a": claim, "b": other}, 131.0, set()) == ({"n1": 2}, {"b": other})  # a's hold is over
    assert claimed_room({"a": claim, "b": other}, 120.0, {"b"}) == ({"n0": 8, "n1": 4}, {"a": claim})  # b placed


def test_the_room_a_held_replica_plans_with_is_the_free_and_leaving_less_what_the_others_claim() -> None:
    """What the leader's shell once computed itself (operator/replica.py): the room is free GPUs plus those of pods
    being deleted, less the other held replicas' claims (never below 0); its own claim is its own room."""
    from stormtopo.core.preempting import RoomClaim, room_left

    mine, theirs, done = RoomClaim({"n0": 8}, 200.0), RoomClaim({"n0": 4, "n1": 8}, 200.0), RoomClaim({"n1": 8}, 200.0)
    claims = {"a": mine, "b": theirs, "c": done}
    room, kept, others = room_left("a", claims, {"c"}, {"n0": 2, "n1": 4, "n2": 8}, {"n0": 8}, 120.0)
    assert room == {"n0": 6, "n1": 0, "n2": 8}  # n0: 2 free + 8 leaving - 4 claimed by b; n1: 4 - 8, not below 0
    assert kept == {"a": mine, "b": theirs} and others == (theirs,)  # c is placed: its claim goes
    assert room_left("a", claims, set(), {"n0": 0}, {}, 300.0) == ({"n0": 0}, {}, ())  # every hold over


# Narrowing (core/narrowing.py): exact preemption off, a soft tier-1 replica whose PodGroup asks what its request asks.
SOFT1 = TopologyRequest(Mode.SOFT, TierLimit(tier=1))
NOW = 1_800_000_000.0
HELD1 = {"mode": "hard", "highestTierAllowed": 1}


def soft_group(topology: dict[str, Any] | None = None, at: float | None = None, tier: int = 1) -> dict[str, Any]:
    annotations = {NARROWED_ANNOTATION: narrowing_record(tier, at)} if at is not None else None
    spec = {"queue": "default", "networkTopology": topology or {"mode": "soft", "highestTierAllowed": 1}}
    return builders.podgroup("rs", spec=spec, annotations=annotations)


def narrowed(**kw: Any) -> Any:
    return plan(**{"enabled": False, "narrowing": True, "request": SOFT1, "podgroup": soft_group(), "wall": NOW} | kw)


def test_a_soft_replica_that_must_preempt_is_narrowed_to_one_leaf_before_its_pods_go() -> None:
    first = narrowed()
    [write] = first.writes  # its PodGroup first, its pods not yet: Volcano must never see it soft and starving
    assert isinstance(write, PatchPodGroup) and write.name == "rs"
    ops = {op["path"]: op["value"] for op in write.ops}
    assert ops["/spec/networkTopology"] == HELD1
    assert json.loads(ops["/metadata/annotations"][NARROWED_ANNOTATION]) == {"v": 1, "tier": 1, "at": "2027-01-15T08:00:00Z"}
    assert first.hold.narrowed_at == NOW and first.recheck_in == 30.0 and not first.says
    # It counts on the four batch pods of s0 (kept from the next held replica's reading: narrowing_claim).
    assert set(first.hold.counts_on) == {Victim(n, 4, 100, f"batch/{n}-{i}") for n in ("node0", "node1") for i in range(2)}
    # Planned again before its PodGroup shows it (another pod's event): the same record, dated as first written.
    again = narrowed(hold=first.hold, wall=NOW + 5)
    assert again.writes == first.writes
    # A record left from an earlier hold (past half its time), or dated far ahead: no narrowing for this one.
    for stale in (NOW - 61, NOW + 3600):
        anew = narrowed(podgroup=soft_group(HELD1, at=stale))
        assert not releases(anew.writes) and anew.hold.narrowed_at == NOW, stale
        [write] = anew.writes
        [record] = [op["value"] for op in write.ops if op["path"].endswith("narrowed")]  # (replacing the stale one)
        assert json.loads(record)["at"] == "2027-01-15T08:00:00Z"
    # A hold first narrowed long ago (a hold longer than the narrowing's half): dated anew, not expired at birth.
    assert narrowed(hold=RoomHold(narrowed_at=NOW - 100)).hold.narrowed_at == NOW
    # Its PodGroup narrowed: the pods go, and the Event says where gangpreempt will look and for how long.
    shown = narrowed(podgroup=soft_group(HELD1, at=NOW), hold=first.hold)
    assert len(releases(shown.writes)) == 2 and not [w for w in shown.writes if isinstance(w, PreemptPods)]
    [say] = shown.says
    assert say.reason == "ReplicaNarrowed" and shown.hold == replace(first.hold, let_go=True)
    # Planned again before its pods' events show them let go: let go again, said once.
    again = narrowed(podgroup=soft_group(HELD1, at=NOW), hold=shown.hold)
    assert len(releases(again.writes)) == 2 and not again.says
    assert "held hard within tier 1 for at most 120 s" in say.message
    assert "the fewest are in tier-1 s0: 4 pod(s) holding 16 GPUs, 4 of priority 100" in say.message


def test_a_narrowed_replica_claims_its_victims_so_that_the_next_is_not_narrowed_onto_them() -> None:
    """Two soft replicas that must preempt, planned one after the other: the second must not count on the victims
    the first's narrowing counts on (it would be narrowed too, and wait hard for room the first takes, up to the
    narrowing's end); nor go soft, for gangpreempt to take them anywhere, while the first's room is being made.
    Found on the local control plane (test_priority.py)."""
    from stormtopo.core.narrowing import NARROWED_FOR
    from stormtopo.core.preempting import RoomClaim, kept_claim, narrowing_claim, unclaimed

    first = narrowed()
    claim = narrowing_claim(first.hold, 100.0)
    assert claim == RoomClaim({"node0": 8, "node1": 8}, 100.0 + NARROWED_FOR, first.hold.counts_on, counting=True)
    assert narrowing_claim(RoomHold(), 100.0) is None and narrowing_claim(None, 100.0) is None
    named = {n: [Holder(4, 100, True, f"batch/{n}-{i}") for i in range(2)] for n in NODES}
    left = unclaimed(named, [claim])
    assert {n: len(hs) for n, hs in left.items()} == {n: 0 if n in ("node0", "node1") else 2 for n in NODES}
    assert len(named["node0"]) == 2 and unclaimed(named, []) is named  # the reading itself never changed
    # Another gang's pod is not the one claimed; one alike already leaving is (evicted for it): the running one stays.
    other = {"node0": [Holder(4, 100, True, "batch/x")]}
    assert unclaimed(other, [claim]) == {"node0": tuple(other["node0"]), "node1": ()}
    leaving = {"node0": [Holder(4, 100, True, "batch/node0-0"), Holder(4, 100, False, "batch/node0-0", leaving=True)]}
    assert unclaimed(leaving, [claim])["node0"] == tuple(leaving["node0"])
    # A pod marked not preemptable is no look-alike on its way out: the claimed victim beside it is taken.
    kept = {"node0": [Holder(4, 100, True, "batch/node0-0"), Holder(4, 100, False, "batch/node0-0")]}
    assert unclaimed(kept, [claim])["node0"] == (Holder(4, 100, False, "batch/node0-0"),)
    # The next replica: narrowed into another leaf where one qualifies ...
    second = narrowed(holders=left, claimed_elsewhere=frozenset(claim.gpus))
    assert {v.node for v in second.hold.counts_on} == {"node2", "node3"}
    # ... and where none does (every other leaf holds a node at its priority): not let go soft while the first's room
    # is being made (gangpreempt could take its victims anywhere), but looked at again shortly; then let go.
    others = {n: batch(priority=HIGH) for n in ("node2", "node4", "node6")}
    waits = narrowed(holders={**left, **others}, claimed_elsewhere=frozenset(claim.gpus))
    assert not waits.writes and waits.recheck_in == 2.0 and waits.hold is not None and waits.hold.waited
    [wait] = waits.says  # said once per hold (issue 41, item 4): what it waits for, and until when
    assert wait.reason == "ReplicaWaitingForRoom" and "on 2 node(s) where its pods could run" in wait.message
    assert "no domain qualifies for preemption" in wait.message and "at the latest until its hold ends" in wait.message
    again = narrowed(holders={**left, **others}, claimed_elsewhere=frozenset(claim.gpus), hold=waits.hold)
    assert not again.writes and not again.says and again.recheck_in == 2.0
    # (Not for room claimed on nodes where its pods could not run anyway: let go.)
    away = narrowed(holders={**left, **others}, claimed_elsewhere=frozenset({"elsewhere"}))
    assert len(releases(away.writes)) == 2 and [s.reason for s in away.says] == ["ReplicaNotNarrowed"]
    alone = narrowed(holders={**left, **others})
    assert len(releases(alone.writes)) == 2 and [s.reason for s in alone.says] == ["ReplicaNotNarrowed"]
    assert not [w for w in alone.writes if isinstance(w, PatchPodGroup)] and not alone.hold.counts_on
    # What the shell keeps after each plan: the claim as first made while it counts on the same victims ...
    assert kept_claim(claim, None, first.hold, 150.0) is claim
    moved = replace(first.hold, counts_on=second.hold.counts_on)  # ... one made anew when they change ...
    assert kept_claim(claim, None, moved, 150.0) == narrowing_claim(moved, 150.0)
    assert kept_claim(claim, None, alone.hold, 150.0) is None  # ... none once it counts on nothing ...
    assert kept_claim(claim, None, None, 150.0) is claim  # ... and, with no hold any more, until it is placed or gone
    exact = RoomClaim({"node0": 4}, 130.0)
    assert kept_claim(claim, exact, first.hold, 100.0) is exact and kept_claim(exact, None, RoomHold(), 100.0) is exact


def test_narrowing_never_costs_a_soft_replica_room_it_has_or_preemption_it_had() -> None:
    spread = narrowed(free=FULL | {"node0": 8, "node2": 8})  # room on two leaves: Volcano places it across, no victim
    assert len(releases(spread.writes)) == 2 and not spread.says and spread.hold is None
    equal = narrowed(holders={n: batch(priority=HIGH) for n in NODES})  # no domain qualifies: as it is, to Volcano
    assert len(releases(equal.writes)) == 2 and not [w for w in equal.writes if isinstance(w, PatchPodGroup)]
    [why] = equal.says  # and the Event says why (issue 41, item 4)
    assert why.reason == "ReplicaNotNarrowed" and "no domain qualifies for preemption: in the best, tier-1 s0, 16 GPUs" in why.message
    hard = plan(enabled=False, narrowing=True, podgroup=soft_group())  # hard: gangpreempt keeps it in one leaf already
    assert len(releases(hard.writes)) == 2 and not hard.says
    off = plan(enabled=False, request=SOFT1, podgroup=soft_group())  # turned off with pods held: let go
    assert len(releases(off.writes)) == 2
    late = narrowed(held_for=31.0)
    assert [s.reason for s in late.says] == ["ReplicaLetGo"] and len(releases(late.writes)) == 2
    no_gangpreempt = plan(enabled=False, narrowing=True, request=SOFT1, podgroup=soft_group(), wall=NOW, gangpreempt=False)
    assert len(releases(no_gangpreempt.writes)) == 2  # nothing would preempt for it anyway
    assert [s.reason for s in no_gangpreempt.says] == ["ReplicaNotNarrowed"] and "runs no gangpreempt" in no_gangpreempt.says[0].message
    unknown = narrowed(groups={}, values={"class-100": 100})  # the victims' jobs not read yet: asked for, nothing written
    assert unknown.needs_groups and not unknown.writes
    assert len(releases(narrowed(podgroup=None).writes)) == 2  # (the shell waits for its PodGroup: queue_of(None))


def test_exact_preemption_on_takes_the_victims_itself_narrowing_or_not() -> None:
    exact = plan(narrowing=True, request=SOFT1, podgroup=soft_group())
    assert [w for w in exact.writes if isinstance(w, PreemptPods)] and not [w for w in exact.writes if isinstance(w, PatchPodGroup)]


def test_the_webhook_holds_a_soft_replicas_pod_that_may_preempt_for_narrowing() -> None:
    tiers = ClusterTiers(frozenset({1, 2}))

    def gates(annotations: dict[str, str], priority: int = 1000, narrowing: bool = True) -> list[str]:
        pod = {"metadata": {"name": "p", "namespace": "ns", "labels": {}}, "spec": {"priority": priority}}
        decision = admit_pod(pod, aibrix_roleset(), service(annotations), tiers, narrowing=narrowing)
        return [op["value"] for op in decision.patch if op["path"].startswith("/spec/schedulingGates")]

    soft = {MODE: "soft", HIGHEST_TIER: "1"}
    assert gates(soft) == [[{"name": ROOM_GATE}]]
    assert gates(soft, narrowing=False) == [] and gates(soft, priority=0) == []
    assert gates({MODE: "soft"}) == []  # no tier asked: nothing to narrow within, no reason to wait
    assert gates({MODE: "hard", HIGHEST_TIER: "1"}) == []  # hard: no gate unless exact preemption is on


def test_a_narrowing_left_on_the_podgroup_comes_off_before_a_replica_goes_as_it_is() -> None:
    """A pod of a replica narrowed a minute ago dies; its new pods are held. Room on two leaves now, or no leaf
    that qualifies: the replica goes as its request asks (soft, across leaves), so the narrowing is marked over
    first (taken off, AIBrix's next rewrite would bring the record back from the stored PodGroup)."""
    left = soft_group(HELD1, at=NOW - 60)
    for room in (
        narrowed(podgroup=left, free=FULL | {"node0": 8, "node2": 8}),
        narrowed(podgroup=left, holders={n: batch(priority=HIGH) for n in NODES}),
    ):
        [write] = room.writes
        assert isinstance(write, PatchPodGroup) and not releases(room.writes) and room.hold is not None
        ops = {op["path"]: op["value"] for op in write.ops}
        assert ops["/spec/networkTopology"] == {"mode": "soft", "highestTierAllowed": 1}
        assert json.loads(ops["/metadata/annotations/stormtopo.io~1narrowed"])["over"] is True
    over = soft_group(at=NOW - 60)  # the PodGroup as it then is: soft, its record over
    over["metadata"]["annotations"][NARROWED_ANNOTATION] = narrowing_record(1, NOW - 60, over=True)
    gone = narrowed(podgroup=over, free=FULL | {"node0": 8, "node2": 8})
    assert len(releases(gone.writes)) == 2


def test_who_holds_the_room_is_read_only_for_a_replica_that_fits_nowhere() -> None:
    """Building it walks every bound GPU pod of the cluster (0.1 s at 16,384 nodes): a replica that fits now is let
    go without it; one that fits nowhere asks for it (needs_room), and is planned with it."""
    unread = RoomReading(FULL | {"node2": 8, "node3": 8}, None, {})
    fits = plan(reading=unread)
    assert len(releases(fits.writes)) == 2 and not fits.needs_room
    asks = plan(reading=RoomReading(FULL, None, {}), hold=RoomHold())
    assert asks.needs_room and not asks.writes and asks.hold == RoomHold()
    narrowing = plan(reading=RoomReading(FULL, None, {}), enabled=False, narrowing=True, request=SOFT1, podgroup=soft_group(), wall=NOW)
    assert narrowing.needs_room and not narrowing.writes
