"""Healing among tenants on the real control plane (issue 34): every hold ends, and lending room is the
lender's choice.

The feature request's tree, as in test_healing.py: leaves s0..s3 of two 8-GPU nodes each (s0: node0,
node1; s1: node2, node3; s2: node4, node5; s3: node6, node7). A replica of an 8-GPU prefill and an
8-GPU decode needs a whole leaf; fillers leave none, so Volcano places it across the spine (soft).
"""

from __future__ import annotations

import json
import threading
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from stormtopo.core.cooldown import COOLDOWN
from stormtopo.core.topology.tree import Topology
from stormtopo.core.vocabulary import HEAL_ANNOTATION, LEND_ROOM_ANNOTATION
from stormtopo.devenv.client import DevCluster, node_names
from stormtopo.devenv.nodes import node_manifests
from stormtopo.devenv.workloads import Role, filler_pod, stormservice
from tests.integration.healing_cluster import (  # noqa: F401 (as_installed: the fixture every test here uses)
    BIG,
    HARD_LEAF,
    HEAL,
    INSTALLED,
    MOVE_WITHIN,
    SOFT_LEAF,
    as_installed,
    events,
    fill,
    free,
    healing_passes,
    in_one_leaf,
    making_room,
    move_records,
    replicas,
    watching_ready_replicas,
    wide_placement,
)

pytestmark = pytest.mark.usefixtures("as_installed")
AS_ASKED = {"mode": "soft", "highestTierAllowed": 1}  # what SOFT_LEAF asks of every PodGroup
HELD = {"mode": "hard", "highestTierAllowed": 1}  # a move's hold into a leaf
LEND = {LEND_ROOM_ANNOTATION: "true"}
ONE_EACH = (Role("prefill", gpus=1), Role("decode", gpus=1))  # a small replica: 2 GPUs on one node


def podgroup_topologies(cluster: DevCluster, namespace: str, name: str) -> dict[str, Any]:
    """The networkTopology of every PodGroup of the service's replicas (AIBrix names each after its RoleSet)."""
    rolesets = {r["metadata"]["name"] for r in cluster.rolesets(namespace, name)}
    return {
        pg["metadata"]["name"]: pg["spec"].get("networkTopology")
        for pg in cluster.podgroups(namespace)
        if pg["metadata"]["name"] in rolesets
    }


def test_removing_heal_right_after_replica_moving_ends_the_hold(
    cluster: DevCluster, cluster_dir: Path, topology: Topology, namespace: str
) -> None:
    """A soft replica across the spine starts moving into the leaf that freed up, its PodGroup held hard
    within the leaf; heal is removed right after ReplicaMoving, before the move can settle. Within the
    move's deadline (well within it: the reconciler acts on the StormService's change), every PodGroup of
    the service asks for what the service asks for again, soft, and stays so over the healing passes
    that follow, though the healer never settles the move (it no longer looks at the service)."""
    name = f"unheal-{namespace}"  # AIBrix v0.7.0 counts same-named RoleSets across namespaces
    fill(cluster, namespace, ["node0", "node2", "node4", "node5", "node6", "node7"])  # free: node1 (s0), node3 (s1)
    cluster.create(stormservice(name, namespace, roles=BIG, annotations={**SOFT_LEAF, **HEAL}))
    wide_placement(cluster, topology, namespace, name)
    free(cluster, namespace, "node0")  # s0: node0 free, node1 the replica's own

    cluster.wait(lambda: events(cluster, namespace, name, "ReplicaMoving"), MOVE_WITHIN, "the ReplicaMoving Event")
    # The hold is written right after the Event and before the evictions.
    cluster.wait(lambda: HELD in podgroup_topologies(cluster, namespace, name).values(), 15, "the moving replica's PodGroup held hard")
    cluster.patch_stormservice(namespace, name, {"metadata": {"annotations": {HEAL_ANNOTATION: None}}})

    def as_asked() -> dict[str, Any]:
        found = podgroup_topologies(cluster, namespace, name)
        return found if found and all(t == AS_ASKED for t in found.values()) else {}

    cluster.wait(as_asked, 60, "every PodGroup of the service soft within tier 1 again (the move's deadline is 600 s)")
    passes = healing_passes(cluster_dir)
    cluster.wait(lambda: healing_passes(cluster_dir) >= passes + 3, 90, "three healing passes since heal was removed")
    assert as_asked(), podgroup_topologies(cluster, namespace, name)
    # The hold ended by itself: the healer, which no longer looks at the service, did not settle the move.
    moves = json.loads(cluster.stormservice(namespace, name)["metadata"]["annotations"]["stormtopo.io/moves"])
    (record,) = moves.values()
    assert record["toTier"] == 1 and not record.get("done"), moves


@pytest.fixture
def other_namespace(cluster: DevCluster) -> Iterator[str]:
    """A second tenant's namespace, made and removed as the `namespace` fixture makes and removes its own."""
    name = f"t-{uuid.uuid4().hex[:8]}"
    cluster.create_namespace(name)
    yield name
    cluster.delete_namespace(name, wait=120)


def placed_on(cluster: DevCluster, namespace: str, name: str, count: int) -> dict[str, list[str]]:
    """Wait until the service has exactly `count` replicas, each with its pods bound and Running; replica ->
    its nodes. AIBrix sometimes makes a replica's RoleSet twice and deletes the first: a RoleSet whose pods
    are not bound (yet, or at all) is waited out rather than read as a replica placed nowhere."""
    cluster.bound_pods(namespace, f"storm-service-name={name}", 2 * count)

    def placed() -> dict[str, list[str]]:
        found = replicas(cluster, namespace, name)
        running = {
            r: node_names(p for p in pods if p["spec"].get("nodeName"))
            for r, pods in found.items()
            if len(pods) == 2 and all(p["spec"].get("nodeName") and p["status"].get("phase") == "Running" for p in pods)
        }
        return running if len(running) == len(found) == count else {}

    return cluster.wait(placed, 120, f"{count} replica(s) of {name} placed, and no other")


def running_fillers(cluster: DevCluster, namespace: str) -> set[str]:
    return {p["metadata"]["name"] for p in cluster.pods(namespace, "stormtopo.io/filler=true") if p["status"].get("phase") == "Running"}


def add_filler(cluster: DevCluster, namespace: str, name: str, node: str, gpus: int) -> None:
    """A filler of `gpus` GPUs on `node`, beside what runs there (fill's take whole nodes)."""
    cluster.create(filler_pod(name, namespace, node, gpus))
    cluster.wait(lambda: name in running_fillers(cluster, namespace), 30, f"the filler {name} running on {node}")


def remove_filler(cluster: DevCluster, namespace: str, name: str) -> None:
    cluster.core.delete_namespaced_pod(name, namespace, grace_period_seconds=0)
    gone = lambda: name not in {p["metadata"]["name"] for p in cluster.pods(namespace, "stormtopo.io/filler=true")}  # noqa: E731
    cluster.wait(gone, 30, f"the filler {name} gone")


def test_only_a_lender_makes_room_for_another_namespaces_wide_replica(
    cluster: DevCluster, cluster_dir: Path, topology: Topology, namespace: str, other_namespace: str
) -> None:
    """Two services of another tenant (`other_namespace`), alike but for the lender's opt-in, each with a
    2-GPU replica beside one of the wide replica's pods: `keep` on node0 (s0), `lend` on node2 (s1),
    their second replicas in s3; s2 has 4 GPUs free. Moving either would make room (keep's first in
    line before issue 34: same size, first by name); only `lend`, which opted in to lending, moves, into
    s2, while its other replica stays ready; `keep` is never touched. Where Volcano places the lender's
    replica in s2, the wide replica (in `namespace`) then moves into s1, the leaf it left; where Volcano
    holds it in s1 (a re-created pod placed before the last old one was evicted), its move is recorded
    as not landed and its cool-down doubled, and nothing more moves for it now."""
    big, keep, lend = f"wide-{namespace}", f"keep-{other_namespace}", f"lend-{other_namespace}"
    with making_room(cluster_dir):
        # Each service's first replica on its own leaf, its second in s3, steered by fillers (in `namespace`).
        fill(cluster, namespace, ["node1", "node2", "node3", "node4", "node5", "node6", "node7"])  # only node0 free
        cluster.create(stormservice(keep, other_namespace, roles=ONE_EACH, annotations={**SOFT_LEAF, **HEAL}))
        assert list(placed_on(cluster, other_namespace, keep, 1).values()) == [["node0", "node0"]]
        add_filler(cluster, namespace, "rest-node0", "node0", 6)
        free(cluster, namespace, "node2")  # only node2 free
        cluster.create(stormservice(lend, other_namespace, roles=ONE_EACH, annotations={**SOFT_LEAF, **HEAL, **LEND}))
        assert list(placed_on(cluster, other_namespace, lend, 1).values()) == [["node2", "node2"]]
        add_filler(cluster, namespace, "rest-node2", "node2", 6)
        free(cluster, namespace, "node6")  # only node6 free: both second replicas go there
        for name in (keep, lend):
            cluster.patch_stormservice(other_namespace, name, {"spec": {"replicas": 2}})
            assert sorted(placed_on(cluster, other_namespace, name, 2).values())[-1] == ["node6", "node6"]
        add_filler(cluster, namespace, "rest-node6", "node6", 4)  # s3 full
        keep_before = {p["metadata"]["uid"] for pods in replicas(cluster, other_namespace, keep).values() for p in pods}
        lend_before = {r: {p["metadata"]["uid"] for p in pods} for r, pods in replicas(cluster, other_namespace, lend).items()}
        (lender,) = [r for r, pods in replicas(cluster, other_namespace, lend).items() if node_names(pods) == ["node2", "node2"]]

        # node0 and node2 with 6 free beside the small replicas, node1 and node3 with 8, s2 with 4 (node4).
        remove_filler(cluster, namespace, "rest-node0")
        remove_filler(cluster, namespace, "rest-node2")
        for node in ("node1", "node3", "node4"):
            free(cluster, namespace, node)
        add_filler(cluster, namespace, "most-node4", "node4", 4)
        # Only node1 and node3 have 8 free: the 8 + 8 replica lands across s0 and s1.
        with watching_ready_replicas(cluster, other_namespace, lend) as lend_ready:
            cluster.create(stormservice(big, namespace, roles=BIG, annotations={**SOFT_LEAF, **HEAL}))
            before = wide_placement(cluster, topology, namespace, big)

            def lender_moved() -> list[dict[str, Any]]:
                pods = [
                    p for p in replicas(cluster, other_namespace, lend).get(lender, []) if p["metadata"]["uid"] not in lend_before[lender]
                ]
                return pods if len(node_names(p for p in pods if p["spec"].get("nodeName"))) == 2 and in_one_leaf(topology, pods) else []

            lend_pods = cluster.wait(lender_moved, 120, "the lender's replica placed again within one leaf")
            (making_room_event,) = events(cluster, other_namespace, lend, "ReplicaMoving")
            assert f"makes room in s1 for StormService {namespace}/{big} replica" in making_room_event, making_room_event

            def settled() -> dict[str, Any]:
                raw = (cluster.stormservice(other_namespace, lend)["metadata"].get("annotations") or {}).get("stormtopo.io/moves") or "{}"
                return next((m for m in json.loads(raw).values() if m.get("done")), {})

            record = cluster.wait(settled, 120, "the move to make room settled")
        # The lender kept max(1, replicas - 1) = 1 replica ready throughout, and only the one replica moved.
        assert min(lend_ready) >= 1, lend_ready
        others = {r: {p["metadata"]["uid"] for p in pods} for r, pods in replicas(cluster, other_namespace, lend).items() if r != lender}
        assert others == {r: uids for r, uids in lend_before.items() if r != lender}
        # The service that did not opt in to lending was never moved, though first in line.
        assert {p["metadata"]["uid"] for pods in replicas(cluster, other_namespace, keep).values() for p in pods} == keep_before
        assert not events(cluster, other_namespace, keep, "ReplicaMoving")
        if not record["landed"]:
            assert node_names(lend_pods) == ["node2", "node2"] and record["cooldown"] == 2 * COOLDOWN, record
            return
        assert node_names(lend_pods) == ["node4", "node4"]
        big_old = set(next(iter(before.values())))

        def big_moved() -> list[dict[str, Any]]:
            pods = [p for pods in replicas(cluster, namespace, big).values() for p in pods if p["metadata"]["uid"] not in big_old]
            return pods if len(node_names(p for p in pods if p["spec"].get("nodeName"))) == 2 and in_one_leaf(topology, pods) else []

        assert sorted(node_names(cluster.wait(big_moved, 120, "the wide replica placed again within s1"))) == ["node2", "node3"]
        (moving,) = events(cluster, namespace, big, "ReplicaMoving")
        assert "to s1 (tier 1)" in moving, moving


def test_a_cluster_cap_of_one_moves_four_services_one_after_the_other(
    cluster: DevCluster, cluster_dir: Path, grown: Topology, namespace: str
) -> None:
    """Issue 34, item 5: at most K replicas moving at once in the whole cluster (chart healing.maxMoving,
    --heal-max-moving). Ten leaves: eight with one node free, two full. Four services of one wide replica
    each take the eight free nodes; then the two full leaves are freed at once, so two could move
    together; with K=1, never two unsettled move records at any look, and two land, one after the other."""
    names = [f"cap{i}-{namespace}" for i in range(4)]
    installed = INSTALLED[cluster_dir]
    installed.start("healing.maxMoving=1")
    try:
        full = ["x8", "x9", "x10", "x11"]  # leaves t4 and t5
        fill(cluster, namespace, ["node0", "node2", "node4", "node6", "x0", "x2", "x4", "x6", *full])
        for name in names:
            cluster.create(stormservice(name, namespace, roles=BIG, annotations={**SOFT_LEAF, **HEAL}))
            wide_placement(cluster, grown, namespace, name)
        unsettled: list[int] = []
        stop = threading.Event()

        def moves(name: str) -> dict[str, Any]:
            return move_records(cluster.stormservice(namespace, name))

        def look() -> None:  # one list a look: every service at one moment (one read each could see a
            # settle of one and the start of the next, from one pass, as two moves at once)
            while not stop.is_set():
                unsettled.append(sum(1 for s in cluster.stormservices(namespace) for m in move_records(s).values() if not m.get("done")))
                stop.wait(0.2)

        watcher = threading.Thread(target=look, daemon=True)
        watcher.start()
        try:
            for node in full:
                free(cluster, namespace, node)

            def landed() -> list[str]:
                done = [n for n in names if any(m.get("done") and m.get("landed") for m in moves(n).values())]
                return done if len(done) >= 2 else []

            moved = cluster.wait(landed, 4 * MOVE_WITHIN + 60, "two services moved into the freed leaves, one after the other")
        finally:
            stop.set()
            watcher.join()
        assert max(unsettled) == 1, f"{max(unsettled)} moving at once with a cap of 1"
        assert all(in_one_leaf(grown, pods) for name in moved for pods in replicas(cluster, namespace, name).values())
        said = [m for name in names for m in events(cluster, namespace, name, "ReplicaNotMoved")]
        assert any("at most 1 move at once in the cluster" in m for m in said), said  # one that waited says why
    finally:
        installed.start()  # the chart's defaults again for the tests that follow (the namespace, and its
        # pods on the added nodes, go before the grown tree: fixtures end in reverse order)


def test_a_stranded_hard_replica_is_said_then_moved_whole_once_it_asks_for_healing(
    cluster: DevCluster, cluster_dir: Path, topology: Topology, namespace: str
) -> None:
    """Issue 35, item 2: a node under a running hard replica is lost while its leaf is full and another
    leaf is empty. Volcano keeps the re-created pod in the replica's leaf (its other pod runs there), where
    it waits. Without stormtopo.io/heal, a ReplicaStranded Warning says which leaf would hold it; with it,
    the replica is moved whole and runs again in the empty leaf."""
    name = f"strand-{namespace}"
    installed = INSTALLED[cluster_dir]
    installed.start("healing.strandedAfterSeconds=20")
    lost: dict[str, Any] | None = None
    try:
        fill(cluster, namespace, ["node4", "node5", "node6", "node7"])  # s2 and s3 full: s0 and s1 left
        cluster.create(stormservice(name, namespace, roles=BIG, annotations=HARD_LEAF))
        pods = cluster.bound_pods(namespace, f"storm-service-name={name}", 2, timeout=120)
        nodes = node_names(pods)
        leaf = topology.lowest_common_switch(nodes)
        assert leaf is not None and leaf.tier == 1, nodes
        other = next(s for s in ("s0", "s1") if s != leaf.name)
        gone = next(p for p in pods if p["metadata"]["labels"]["role-name"] == "decode")["spec"]["nodeName"]
        # The node is lost: its Node object deleted and its pods with it (as the pod garbage collector does).
        lost = next(n for n in node_manifests(topology) if n["metadata"]["name"] == gone)
        cluster.core.delete_node(gone)
        for pod in pods:
            if pod["spec"]["nodeName"] == gone:
                cluster.core.delete_namespaced_pod(pod["metadata"]["name"], namespace, grace_period_seconds=0)
        cluster.wait(
            lambda: events(cluster, namespace, name, "ReplicaStranded"), 180, "a ReplicaStranded Warning on the replica stuck in its leaf"
        )
        (stranded,) = events(cluster, namespace, name, "ReplicaStranded")
        assert f"{other} (tier 1) holds the whole replica now" in stranded, stranded
        assert all(
            p["spec"].get("nodeName") != n
            for p in cluster.pods(namespace, f"storm-service-name={name}")
            for n in topology.nodes_under(other)
        )
        # It asks for healing: moved whole into the empty leaf.
        cluster.patch_stormservice(namespace, name, {"metadata": {"annotations": HEAL}})

        def whole_in_other() -> list[dict[str, Any]]:
            now = [p for p in cluster.pods(namespace, f"storm-service-name={name}") if not p["metadata"].get("deletionTimestamp")]
            placed = [p for p in now if p["spec"].get("nodeName") in topology.nodes_under(other) and p["status"].get("phase") == "Running"]
            return placed if len(placed) == 2 == len(now) else []

        cluster.wait(whole_in_other, 180, f"the replica running again, whole, in {other}")
        (moving,) = events(cluster, namespace, name, "ReplicaMoving")
        assert f"to {other} (tier 1)" in moving and "keeps a gang with a running pod in its domain" in moving, moving
    finally:
        if lost is not None:
            lost["metadata"].pop("resourceVersion", None)
            cluster.core.create_node(lost)  # the shared cluster's tree whole again for the tests that follow
        installed.start()
