"""Spreading a StormService's replicas over the domains of one tier (core/spread.py): the request, the
gate at admission, and the leader's release of one replica at a time, with its siblings' domains kept
out while another domain holds it. Snapshots are built by the operator's index, as the shell builds them,
on the feature request's tree: leaves s0..s3 of two 8-GPU nodes each, spines s4 (s0, s1) and s5 (s2, s3)."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import pytest

from stormtopo.commands.explain import render
from stormtopo.core.admission import admit_pod
from stormtopo.core.capabilities import cluster_tiers
from stormtopo.core.replica import ReplicaMemory, ReplicaPlan, ReplicaSnapshot, plan_replica
from stormtopo.core.request import ClusterTiers, RequestError, TierLimit, parse_request
from stormtopo.core.spread import SETTLE_SECONDS, SPREAD_GIVE_UP, replicas_per_domain
from stormtopo.core.topology.fabric import parse_topology
from stormtopo.core.topology.hypernodes import hypernode_manifests
from stormtopo.core.vocabulary import (
    DOMAIN_GATE,
    HIGHEST_TIER,
    HIGHEST_TIER_NAME,
    MODE,
    REPLICA_SPREAD_TIER,
    REPLICA_SPREAD_TIER_NAME,
    SCOPE,
    SPREAD_KEPT_OUT_LABEL,
)
from stormtopo.core.writes import DeleteUnboundPod, PatchPod, PostEvent
from stormtopo.devenv.workloads import Role
from stormtopo.operator.index import Index
from tests.builders import pod, podgroup, roleset, service
from tests.conftest import TOPOLOGY_FILE
from tests.core.spread_cases import ALL_FREE, LEAF_SPREAD, index_of, replica

CLUSTER = ClusterTiers(frozenset({1, 2, 3}), frozenset({"leaf", "spine", "core"}), tier_of_name=(("core", 3), ("leaf", 1), ("spine", 2)))
NOW = 1000.0
ROUTED = (Role("prefill"), Role("decode"), Role("router", requests=False))


# -- the request -------------------------------------------------------------------------------------


def test_a_spread_tier_by_number_or_name_is_part_of_the_request() -> None:
    request = parse_request(LEAF_SPREAD, CLUSTER)
    assert request is not None and request.spread == TierLimit(tier=1)
    assert request.describe() == "hard within tier 1, scope RoleSet, replicas spread over tier 1"
    named = parse_request({MODE: "hard", HIGHEST_TIER: "1", REPLICA_SPREAD_TIER_NAME: "spine"}, CLUSTER)
    assert named is not None and named.spread == TierLimit(tier_name="spine")
    soft = parse_request({MODE: "soft", REPLICA_SPREAD_TIER: "3"}, CLUSTER)
    assert soft is not None and soft.spread == TierLimit(tier=3)
    assert parse_request({MODE: "hard", HIGHEST_TIER: "1"}, CLUSTER).spread is None  # type: ignore[union-attr]


@pytest.mark.parametrize(
    ("annotations", "names"),
    [
        (
            {MODE: "hard", HIGHEST_TIER: "2", REPLICA_SPREAD_TIER: "1"},
            [REPLICA_SPREAD_TIER, "'1'", "below the replica's own tier 2", "2 to 3"],
        ),
        ({MODE: "hard", HIGHEST_TIER_NAME: "spine", REPLICA_SPREAD_TIER_NAME: "leaf"}, [REPLICA_SPREAD_TIER_NAME, "'leaf'", "own tier 2"]),
        ({MODE: "hard", HIGHEST_TIER: "1", REPLICA_SPREAD_TIER: "4"}, [REPLICA_SPREAD_TIER, "deeper than any HyperNode", "1 to 3"]),
        ({MODE: "hard", HIGHEST_TIER: "1", REPLICA_SPREAD_TIER: "x"}, [REPLICA_SPREAD_TIER, "'x'", "1 to 3"]),
        ({MODE: "hard", HIGHEST_TIER: "1", REPLICA_SPREAD_TIER_NAME: "rack"}, [REPLICA_SPREAD_TIER_NAME, "'rack'", "core, leaf, spine"]),
        (
            {MODE: "hard", HIGHEST_TIER: "1", REPLICA_SPREAD_TIER: "1", REPLICA_SPREAD_TIER_NAME: "leaf"},
            [REPLICA_SPREAD_TIER, "one of them"],
        ),
        ({MODE: "hard", HIGHEST_TIER: "2", SCOPE: "StormService", REPLICA_SPREAD_TIER: "2"}, [REPLICA_SPREAD_TIER, "RoleSet"]),
    ],
)
def test_a_bad_spread_tier_names_the_annotation_the_value_and_what_is_accepted(annotations: dict[str, str], names: list[str]) -> None:
    with pytest.raises(RequestError) as caught:
        parse_request(annotations, CLUSTER)
    for expected in names:
        assert expected in str(caught.value)


def test_the_clusters_tier_names_come_with_their_tiers() -> None:
    tiers = cluster_tiers(hypernode_manifests(parse_topology(TOPOLOGY_FILE.read_text())), None)
    assert dict(tiers.tier_of_name) == {"leaf": 1, "spine": 2, "core": 3}


# -- admission ---------------------------------------------------------------------------------------


def test_every_pod_of_a_spread_replica_is_held_at_the_gate_and_without_a_spread_only_routers() -> None:
    def gated(annotations: dict[str, str], role: str) -> bool:
        decision = admit_pod(
            pod("p", role, replica="svc-a"), roleset("svc-a", ROUTED, revision="r1"), service(annotations, ROUTED), CLUSTER
        )
        return any(op["path"] == "/spec/schedulingGates" and op["value"] == [{"name": DOMAIN_GATE}] for op in decision.patch)

    assert gated(LEAF_SPREAD, "prefill") and gated(LEAF_SPREAD, "router")
    assert gated({MODE: "soft", REPLICA_SPREAD_TIER: "1"}, "decode")
    assert not gated({MODE: "hard", HIGHEST_TIER: "1"}, "prefill") and gated({MODE: "hard", HIGHEST_TIER: "1"}, "router")


def test_a_pod_bound_at_creation_is_never_held_at_the_gate() -> None:
    """A role pinned by nodeName: the API server refuses a pod with both nodeName and a scheduling gate
    ("cannot be set until all schedulingGates have been cleared"), and there is nothing to hold."""
    for asked, role in ((LEAF_SPREAD, "prefill"), ({MODE: "hard", HIGHEST_TIER: "1"}, "router")):
        decision = admit_pod(
            pod("p", role, node="node3", replica="svc-a"), roleset("svc-a", ROUTED, revision="r1"), service(asked, ROUTED), CLUSTER
        )
        assert decision.allowed and decision.patch
        assert not any(op["path"].startswith("/spec/schedulingGates") for op in decision.patch), decision.patch


# -- letting replicas go -------------------------------------------------------------------------------


def plan_for(
    index: Index,
    name: str = "svc-a",
    free: dict[str, int] | None = ALL_FREE,
    settling: dict[str, float] | None = None,
    now: float = NOW,
    memory: ReplicaMemory | None = None,
) -> ReplicaPlan:
    found = index.replica_snapshot(("ns", name), now)
    assert found is not None
    snapshot: ReplicaSnapshot = found
    return plan_replica(replace(snapshot, free_gpus=free, settling=settling or {}), memory or ReplicaMemory())


def let_go(plan: ReplicaPlan) -> dict[str, list[dict[str, Any]]]:
    """Pod -> its patch's ops, for every pod the plan lets go."""
    return {w.name: list(w.ops) for w in plan.writes if isinstance(w, PatchPod)}


def kept_out(ops: list[dict[str, Any]]) -> list[str]:
    """The hostnames a release keeps the pod off ([] when it goes unconstrained)."""
    affinity = [op for op in ops if op["path"] == "/spec/affinity"]
    if not affinity:
        return []
    (term,) = affinity[0]["value"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]["nodeSelectorTerms"]
    (requirement,) = term["matchExpressions"]
    assert requirement["operator"] == "NotIn" and requirement["key"] == "kubernetes.io/hostname"
    return list(requirement["values"])


def test_the_first_replica_goes_unconstrained_and_is_remembered_as_settling() -> None:
    index = index_of(*replica("svc-a", held=True), *replica("svc-b", held=True))
    plan = plan_for(index, free=None)  # no sibling holds a domain: no free GPUs are needed
    released = let_go(plan)
    assert set(released) == {"svc-a-p", "svc-a-d"} and all(kept_out(ops) == [] for ops in released.values())
    assert released["svc-a-p"][:2] == [
        {"op": "test", "path": "/spec/schedulingGates/0/name", "value": DOMAIN_GATE},
        {"op": "remove", "path": "/spec/schedulingGates/0"},
    ]
    assert plan.settling == {"svc-a": NOW}


def test_a_sibling_let_go_and_not_bound_holds_the_next_replica_back_until_it_settles() -> None:
    index = index_of(*replica("svc-a", held=True), *replica("svc-b"))  # svc-b: past the gate, not bound
    plan = plan_for(index)
    assert let_go(plan) == {} and plan.settling == {"svc-b": NOW} and plan.recheck_in == SETTLE_SECONDS
    # As remembered by the leader, even while its index still shows the sibling held.
    stale = index_of(*replica("svc-a", held=True), *replica("svc-b", held=True))
    assert let_go(plan_for(stale, settling={"svc-b": NOW - 5})) == {}
    assert plan_for(stale, settling={"svc-b": NOW - 5}).recheck_in == SETTLE_SECONDS - 5
    # One that stays unbound for SETTLE_SECONDS cannot be placed now: the others go.
    assert set(let_go(plan_for(index, settling={"svc-b": NOW - SETTLE_SECONDS}))) == {"svc-a-p", "svc-a-d"}


def test_a_replica_just_let_go_is_not_let_go_twice() -> None:
    index = index_of(*replica("svc-a", held=True))  # the index has not seen the release yet
    assert let_go(plan_for(index, settling={"svc-a": NOW - 1})) == {}


def test_the_next_replica_keeps_out_every_leaf_that_holds_a_sibling() -> None:
    index = index_of(*replica("svc-a", held=True), *replica("svc-b", ("node4", "node5")), *replica("svc-c", ("node0", "node0")))
    assert plan_for(index, free=None).needs_room  # siblings hold domains: is there room outside them?
    plan = plan_for(index)
    released = let_go(plan)
    assert set(released) == {"svc-a-p", "svc-a-d"}
    assert kept_out(released["svc-a-p"]) == ["node0", "node1", "node4", "node5"]  # leaves s0 and s2
    assert {"op": "add", "path": "/metadata/labels/stormtopo.io~1spread-kept-out", "value": "true"} in released["svc-a-p"]
    assert plan.settling == {"svc-a": NOW}  # (the placed siblings no longer count)


def test_at_tier_two_the_whole_spine_is_kept_out() -> None:
    spine = {MODE: "hard", HIGHEST_TIER: "1", REPLICA_SPREAD_TIER: "2"}
    index = index_of(*replica("svc-a", held=True), *replica("svc-b", ("node2", "node3")), annotations=spine)
    assert kept_out(let_go(plan_for(index))["svc-a-d"]) == ["node0", "node1", "node2", "node3"]  # s4
    by_name = {MODE: "hard", HIGHEST_TIER: "1", REPLICA_SPREAD_TIER_NAME: "spine"}
    index = index_of(*replica("svc-a", held=True), *replica("svc-b", ("node6", "node7")), annotations=by_name)
    assert kept_out(let_go(plan_for(index))["svc-a-d"]) == ["node4", "node5", "node6", "node7"]  # s5


def test_a_leaf_left_with_room_is_kept_free_only_while_it_holds_the_whole_replica() -> None:
    index = index_of(*replica("svc-a", held=True), *replica("svc-b", ("node0", "node1")), *replica("svc-c", ("node2", "node3")))
    # s2 and s3 have one free GPU per node: a hard tier-1 replica of 1 + 1 GPUs fits in either.
    thin = {**ALL_FREE, **{f"node{i}": 1 for i in range(4, 8)}}
    assert kept_out(let_go(plan_for(index, free=thin))["svc-a-p"]) == ["node0", "node1", "node2", "node3"]
    # No GPU free outside s0 and s1: the replica goes unconstrained, and Volcano packs it where it fits.
    full = {**ALL_FREE, **{f"node{i}": 0 for i in range(4, 8)}}
    assert all(kept_out(ops) == [] for ops in let_go(plan_for(index, free=full)).values())


def test_a_fifth_replica_with_every_leaf_taken_goes_and_once_placed_the_shared_leaf_is_named() -> None:
    siblings = [*replica("svc-b", ("node0", "node1")), *replica("svc-c", ("node2", "node3"))]
    siblings += [*replica("svc-d", ("node4", "node5")), *replica("svc-e", ("node6", "node7"))]
    index = index_of(*replica("svc-a", held=True), *siblings)
    released = let_go(plan_for(index))
    assert set(released) == {"svc-a-p", "svc-a-d"} and all(kept_out(ops) == [] for ops in released.values())
    for bound in replica("svc-a", ("node2", "node2"))[1:]:  # Volcano binds it in s1, with svc-c
        index.observe("Pod", "MODIFIED", bound)
    plan = plan_for(index)
    (shared,) = [say for say in plan.says if say.reason == "ReplicasShareDomain"]
    assert shared.type == "Warning"
    assert shared.message.startswith("replica svc-a placed in s1, which also holds replica svc-c: the replicas are to spread over tier 1")
    assert plan_for(index, memory=plan.memory).says == ()  # said once


def test_replicas_balance_over_the_tier_the_least_held_domains_with_room_first() -> None:
    spine = {MODE: "hard", HIGHEST_TIER: "1", REPLICA_SPREAD_TIER: "2"}
    # One replica under each spine: the third may go to either, the fourth only to the spine left with one.
    index = index_of(
        *replica("svc-a", held=True), *replica("svc-b", ("node0", "node1")), *replica("svc-c", ("node4", "node5")), annotations=spine
    )
    assert all(kept_out(ops) == [] for ops in let_go(plan_for(index)).values())
    for obj in replica("svc-d", ("node2", "node3")):
        index.observe(str(obj["kind"]), "ADDED", obj)
    assert kept_out(let_go(plan_for(index))["svc-a-p"]) == ["node0", "node1", "node2", "node3"]  # s4 holds two
    # Leaves: s0 holds two, the others one: only s0 is kept out; with no room left in s1..s3, nothing is.
    leaves = [*replica("svc-b", ("node0", "node1")), *replica("svc-c", ("node0", "node0")), *replica("svc-d", ("node2", "node3"))]
    index = index_of(*replica("svc-a", held=True), *leaves, *replica("svc-e", ("node4", "node5")), *replica("svc-f", ("node6", "node7")))
    assert kept_out(let_go(plan_for(index))["svc-a-p"]) == ["node0", "node1"]
    full = {**ALL_FREE, **{f"node{i}": 0 for i in range(2, 8)}}
    assert all(kept_out(ops) == [] for ops in let_go(plan_for(index, free=full)).values())


def test_a_replica_waits_until_every_pod_of_its_gang_exists() -> None:
    index = index_of(roleset("svc-a", revision="r1"), pod("svc-a-p", "prefill", held=True, replica="svc-a"))
    assert let_go(plan_for(index)) == {}
    index.observe("Pod", "ADDED", pod("svc-a-d", "decode", held=True, replica="svc-a"))
    assert set(let_go(plan_for(index))) == {"svc-a-p", "svc-a-d"}


def test_a_replacement_pod_of_a_placed_replica_goes_at_once_unconstrained() -> None:
    index = index_of(
        roleset("svc-a", revision="r1"), pod("svc-a-p", "prefill", "node4", replica="svc-a"),
        pod("svc-a-d2", "decode", held=True, replica="svc-a"), *replica("svc-b"),  # a sibling on its way does not hold a replacement back
    )  # fmt: skip
    released = let_go(plan_for(index, free=None))
    assert set(released) == {"svc-a-d2"} and kept_out(released["svc-a-d2"]) == []


def test_held_pods_go_unconstrained_once_the_spread_is_withdrawn() -> None:
    index = index_of(*replica("svc-a", held=True), *replica("svc-b", ("node4", "node5")), annotations={MODE: "hard", HIGHEST_TIER: "1"})
    released = let_go(plan_for(index, free=None))
    assert set(released) == {"svc-a-p", "svc-a-d"} and all(kept_out(ops) == [] for ops in released.values())


def test_a_hard_replicas_router_stays_held_until_the_gang_is_bound_then_follows_it() -> None:
    objects = [
        roleset("svc-a", ROUTED, revision="r1"),
        *(pod(f"svc-a-{r}", r, held=True, replica="svc-a") for r in ("prefill", "decode", "router")),
    ]
    index = index_of(*objects, *replica("svc-b", ("node0", "node1")), roles=ROUTED)
    released = let_go(plan_for(index))
    assert set(released) == {"svc-a-prefill", "svc-a-decode"}  # the router follows its gang, as without a spread
    for role, node in (("prefill", "node4"), ("decode", "node5")):
        index.observe("Pod", "MODIFIED", pod(f"svc-a-{role}", role, node, replica="svc-a"))
    plan = plan_for(index)
    (router,) = let_go(plan).values()
    within = router[2]["value"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]["nodeSelectorTerms"]
    assert within == [{"matchExpressions": [{"key": "kubernetes.io/hostname", "operator": "In", "values": ["node4", "node5"]}]}]


def test_with_an_invalid_request_a_held_gang_goes_and_its_router_still_follows_it() -> None:
    objects = [
        roleset("svc-a", ROUTED, revision="r1"),
        *(pod(f"svc-a-{r}", r, held=True, replica="svc-a") for r in ("prefill", "decode", "router")),
    ]
    index = index_of(*objects, annotations={MODE: "hard", HIGHEST_TIER: "9", REPLICA_SPREAD_TIER: "1"}, roles=ROUTED)
    released = let_go(plan_for(index, free=None))
    assert set(released) == {"svc-a-prefill", "svc-a-decode"} and all(kept_out(ops) == [] for ops in released.values())


def test_a_soft_replicas_router_is_part_of_its_gang_and_goes_with_it() -> None:
    objects = [
        roleset("svc-a", ROUTED, revision="r1"),
        *(pod(f"svc-a-{r}", r, held=True, replica="svc-a") for r in ("prefill", "decode", "router")),
    ]
    index = index_of(*objects, *replica("svc-b", ("node0", "node1")), annotations={MODE: "soft", REPLICA_SPREAD_TIER: "1"}, roles=ROUTED)
    released = let_go(plan_for(index))
    assert set(released) == {"svc-a-prefill", "svc-a-decode", "svc-a-router"}
    assert all(kept_out(ops) == ["node0", "node1"] for ops in released.values())


def test_a_pods_own_required_terms_are_each_narrowed() -> None:
    terms = [
        {"matchExpressions": [{"key": "gpu", "operator": "Exists"}]},
        {"matchFields": [{"key": "metadata.name", "operator": "In", "values": ["node4"]}]},
    ]
    own = {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": terms}}}
    index = index_of(
        roleset("svc-a", revision="r1"), pod("svc-a-p", "prefill", held=True, replica="svc-a", spec={"affinity": own}),
        pod("svc-a-d", "decode", held=True, replica="svc-a", spec={"affinity": own}), *replica("svc-b", ("node0", "node1")),
    )  # fmt: skip
    ops = [op for op in let_go(plan_for(index))["svc-a-p"][2:] if op["path"].startswith("/spec/")]
    base = "/spec/affinity/nodeAffinity/requiredDuringSchedulingIgnoredDuringExecution/nodeSelectorTerms"
    excluded = {"key": "kubernetes.io/hostname", "operator": "NotIn", "values": ["node0", "node1"]}
    assert ops == [
        {"op": "add", "path": f"{base}/0/matchExpressions/-", "value": excluded},
        {"op": "add", "path": f"{base}/1/matchExpressions", "value": [excluded]},
    ]


def test_without_unique_hostnames_each_node_is_kept_out_by_name() -> None:
    index = index_of(*replica("svc-a", held=True), *replica("svc-b", ("node0", "node1")))
    index.set_nodes(
        {**{f"node{i}": {"kubernetes.io/hostname": f"node{i}"} for i in range(8)}, "node7": {"kubernetes.io/hostname": "node0"}}, 0
    )
    ops = let_go(plan_for(index))["svc-a-p"]
    (term,) = ops[2]["value"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]["nodeSelectorTerms"]
    assert term == {"matchFields": [{"key": "metadata.name", "operator": "NotIn", "values": [n]} for n in ("node0", "node1")]}


def test_a_placed_replica_wakes_the_siblings_held_for_the_spread_and_a_held_one_is_not_explained() -> None:
    index = index_of(*replica("svc-a", ("node4", "node5")), *replica("svc-b", held=True), *replica("svc-c", ("node0", "node1")))
    index.observe("RoleSet", "ADDED", roleset("svc-d", revision="r1"))  # no pods yet: nothing to wake
    assert plan_for(index).wake == ("svc-b",)
    for obj in replica("svc-d")[1:]:  # let go, not bound
        index.observe("Pod", "ADDED", obj)
    unschedulable = {"phase": "Pending", "conditions": [{"type": "Unschedulable", "status": "True"}]}
    index.observe("PodGroup", "ADDED", {"kind": "PodGroup", "metadata": {"name": "svc-b", "namespace": "ns"}, "status": unschedulable})
    held = plan_for(index, "svc-b")
    assert held.explain is None and held.wake == () and let_go(held) == {} and held.recheck_in == SETTLE_SECONDS


def test_explain_lists_the_replicas_in_every_domain_of_the_spread_tier() -> None:
    topology = parse_topology(TOPOLOGY_FILE.read_text())
    domains = replicas_per_domain(topology, 1, {"svc-a": ["node0", "node1"], "svc-b": ["node4"], "svc-c": []})
    assert domains == {"s0": ["svc-a"], "s1": [], "s2": ["svc-b"], "s3": []}
    report = {"namespace": "ns", "stormservice": "svc", "request": "hard", "replicas": [], "spread": {"tier": 1, "domains": domains}}
    assert render(report)[-5:] == [
        "  replicas per tier-1 domain (spread over tier 1):",
        "    s0: svc-a",
        "    s1: none",
        "    s2: svc-b",
        "    s3: none",
    ]


def let_go_kept_out_of(name: str, nodes: list[str]) -> list[dict[str, Any]]:
    """A replica let go with `nodes` kept out, its pods not bound (as Volcano leaves a gang it cannot place)."""
    affinity = {
        "nodeAffinity": {
            "requiredDuringSchedulingIgnoredDuringExecution": {
                "nodeSelectorTerms": [{"matchExpressions": [{"key": "kubernetes.io/hostname", "operator": "NotIn", "values": nodes}]}]
            }
        }
    }
    objects = replica(name)
    for obj in objects[1:]:
        obj["spec"]["affinity"] = affinity
        obj["metadata"]["resourceVersion"] = "41"
        obj["metadata"]["labels"][SPREAD_KEPT_OUT_LABEL] = "true"  # as the release labels it
    return objects


def unschedulable(name: str) -> dict[str, Any]:
    return podgroup(name, unschedulable="NotEnoughResources", kind=True)


def test_a_replica_let_go_with_domains_kept_out_and_not_placed_is_held_again_once() -> None:
    """Let go keeping out s0 (svc-b there), then unschedulable: past SPREAD_GIVE_UP its unbound pods are
    deleted at the version read (AIBrix makes them again, the webhook holds them) with one Warning; held
    again, it goes without keeping any domain out; once placed the leader forgets it."""
    index = index_of(*let_go_kept_out_of("svc-a", ["node0", "node1"]), *replica("svc-b", ("node0", "node1")), unschedulable("svc-a"))
    early = plan_for(index, settling={"svc-a": NOW - 10})
    assert not [w for w in early.writes if isinstance(w, DeleteUnboundPod)] and early.recheck_in == SPREAD_GIVE_UP - 10
    late = plan_for(index, settling={"svc-a": NOW - SPREAD_GIVE_UP})
    assert {w for w in late.writes if isinstance(w, DeleteUnboundPod)} == {
        DeleteUnboundPod("ns", "svc-a-p", "41"),
        DeleteUnboundPod("ns", "svc-a-d", "41"),
    }
    # Said after the deletes (a failed delete is planned again, and said then).
    (at, say) = next((i, w.say) for i, w in enumerate(late.writes) if isinstance(w, PostEvent) and w.say.reason == "ReplicaSpreadUnplaced")
    assert say.type == "Warning" and "tier 1" in say.message
    assert all(isinstance(w, DeleteUnboundPod) for w in late.writes[at - 2 : at])
    assert late.unspread == frozenset({"svc-a"}) and "svc-a" not in (late.settling or {})
    # Volcano still trying (not said unschedulable): nothing deleted yet.
    trying = index_of(*let_go_kept_out_of("svc-a", ["node0", "node1"]), *replica("svc-b", ("node0", "node1")))
    assert not [w for w in plan_for(trying, settling={"svc-a": NOW - 90}).writes if isinstance(w, DeleteUnboundPod)]
    # Held again: let go with no domain kept out, though svc-b holds s0.
    again = index_of(*replica("svc-a", held=True), *replica("svc-b", ("node0", "node1")))
    snapshot = again.replica_snapshot(("ns", "svc-a"), NOW)
    assert snapshot is not None
    plan = plan_replica(replace(snapshot, free_gpus=ALL_FREE, unspread=frozenset({"svc-a"})), ReplicaMemory())
    assert all(kept_out(ops) == [] for ops in let_go(plan).values()) and set(let_go(plan)) == {"svc-a-p", "svc-a-d"}
    # Not held a second time while the leader remembers it, whatever Volcano says.
    stuck = index_of(*let_go_kept_out_of("svc-a", ["node0", "node1"]), *replica("svc-b", ("node0", "node1")), unschedulable("svc-a"))
    snapshot = stuck.replica_snapshot(("ns", "svc-a"), NOW)
    assert snapshot is not None
    kept = plan_replica(replace(snapshot, settling={"svc-a": NOW - 300}, unspread=frozenset({"svc-a"})), ReplicaMemory())
    assert not [w for w in kept.writes if isinstance(w, DeleteUnboundPod)] and kept.unspread == frozenset({"svc-a"})
    # A NotIn of the user's own (no label of the release), or a gang partly bound: never deleted.
    own = let_go_kept_out_of("svc-a", ["node7"])
    for obj in own[1:]:
        del obj["metadata"]["labels"][SPREAD_KEPT_OUT_LABEL]
    users = index_of(*own, *replica("svc-b", ("node0", "node1")), unschedulable("svc-a"))
    assert not [w for w in plan_for(users, settling={"svc-a": NOW - 300}).writes if isinstance(w, DeleteUnboundPod)]
    partly = let_go_kept_out_of("svc-a", ["node0", "node1"])
    partly[1]["spec"]["nodeName"] = "node2"
    binding = index_of(*partly, *replica("svc-b", ("node0", "node1")), unschedulable("svc-a"))
    assert not [w for w in plan_for(binding, settling={"svc-a": NOW - 300}).writes if isinstance(w, DeleteUnboundPod)]
    # Placed: forgotten.
    placed = index_of(*replica("svc-a", ("node2", "node3")), *replica("svc-b", ("node0", "node1")))
    snapshot = placed.replica_snapshot(("ns", "svc-a"), NOW)
    assert snapshot is not None
    assert plan_replica(replace(snapshot, unspread=frozenset({"svc-a"})), ReplicaMemory()).unspread == frozenset()


@pytest.mark.parametrize(
    "annotations",
    [
        {MODE: "hard", HIGHEST_TIER: "1"},  # the spread removed
        {},  # opted out
        {MODE: "hard", HIGHEST_TIER: "9"},  # the request turned invalid
    ],
)
def test_a_replica_let_go_with_domains_kept_out_leaves_nothing_behind_once_no_spread_applies(annotations: dict[str, str]) -> None:
    """Issue 43, item 5: its unbound pods keep an affinity nothing would take back; they are deleted at the
    version read (AIBrix makes them again, without it), at once, not past a give-up. None while a pod of
    its gang is bound."""
    index = index_of(*let_go_kept_out_of("svc-a", ["node0", "node1"]), annotations=annotations)
    deletes = {w for w in plan_for(index).writes if isinstance(w, DeleteUnboundPod)}
    assert deletes == {DeleteUnboundPod("ns", "svc-a-p", "41"), DeleteUnboundPod("ns", "svc-a-d", "41")}
    # Still spread: the give-up decides (nothing deleted 10 s after it was let go).
    spreading = index_of(*let_go_kept_out_of("svc-a", ["node0", "node1"]))
    assert not [w for w in plan_for(spreading, settling={"svc-a": NOW - 10}).writes if isinstance(w, DeleteUnboundPod)]
    # A pod of its gang bound: the rest may be binding now, nothing is deleted.
    objects = let_go_kept_out_of("svc-a", ["node0", "node1"])
    objects[1]["spec"]["nodeName"] = "node4"
    assert not [w for w in plan_for(index_of(*objects, annotations=annotations)).writes if isinstance(w, DeleteUnboundPod)]


def test_when_the_shell_keeps_the_spread_memory_is_the_plans_to_say() -> None:
    """Before the writes (two workers never let two siblings go together), but for a replica held again only
    after them (its pods deleted: a delete that failed is planned again); what a plan does not say is kept."""
    from stormtopo.core.replica import ReplicaPlan
    from stormtopo.core.spread import SpreadMemory

    kept = SpreadMemory({"svc-b": NOW - 1}, frozenset({"svc-c"}))
    assert ReplicaPlan().spread_memory(kept) is None and ReplicaPlan().spread_kept_first
    letting_go = ReplicaPlan(settling={"svc-b": NOW - 1, "svc-a": NOW}, spread_over=kept)
    assert letting_go.spread_memory(kept) == SpreadMemory({"svc-b": NOW - 1, "svc-a": NOW}, frozenset({"svc-c"}))
    assert letting_go.spread_kept_first
    over = SpreadMemory({"svc-a": NOW - 5})
    held_again = ReplicaPlan((DeleteUnboundPod("ns", "svc-a-p", "1"),), settling={}, unspread=frozenset({"svc-a"}), spread_over=over)
    assert not held_again.spread_kept_first
    assert held_again.spread_memory(over) == SpreadMemory({}, frozenset({"svc-a"}))
    # Kept after its writes' awaits: a sibling another worker let go meanwhile stays let go.
    meanwhile = SpreadMemory({"svc-a": NOW - 5, "svc-d": NOW}, frozenset())
    assert held_again.spread_memory(meanwhile) == SpreadMemory({"svc-d": NOW}, frozenset({"svc-a"}))
    assert kept.without("svc-c") == SpreadMemory({"svc-b": NOW - 1}) and not kept.without("svc-b").without("svc-c").settling
    assert kept.without("svc-b").without("svc-c").empty and kept.concerns("svc-b") and not kept.concerns("svc-a")
