"""Healing on the real control plane (issue 23): a replica that landed wider than its request moves into
one leaf once a leaf has room, whole, through the Eviction API, one replica at a time, within the
service's budget and its PodDisruptionBudgets; and nothing moves without the opt-in. The operator runs
as the chart runs it (issue 34): its ServiceAccount, RBAC and admission policies, the Deployment's
arguments.

The feature request's tree: leaves s0..s3 of two 8-GPU nodes each. A replica of an 8-GPU prefill and an
8-GPU decode needs a whole leaf; fillers on one node of every leaf leave none, so Volcano places it
across the spine (soft) or holds it (hard). Then a leaf is freed.
"""

from __future__ import annotations

import datetime
import json
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest
from kubernetes import client

from stormtopo.core.cooldown import COOLDOWN
from stormtopo.core.topology.tree import Topology
from stormtopo.core.vocabulary import LEND_ROOM_ANNOTATION
from stormtopo.devenv.client import DevCluster, node_names
from stormtopo.devenv.workloads import Role, filler_pod, stormservice
from tests.conftest import stormtopo
from tests.integration.healing_cluster import (  # noqa: F401 (as_installed: the fixture every test here uses)
    BIG,
    HARD_LEAF,
    HEAL,
    MOVE_WITHIN,
    SOFT_LEAF,
    as_installed,
    events,
    fill,
    free,
    healing_passes,
    in_one_leaf,
    making_room,
    parse_time,
    ready_replicas,
    replicas,
    watching_ready_replicas,
    wide_placement,
)

pytestmark = pytest.mark.usefixtures("as_installed")


@contextmanager
def tenant(cluster: DevCluster) -> Iterator[tuple[str, Any]]:
    """Another tenant: its own namespace, where it may create and annotate StormServices (as a namespace
    admin may), and kubectl as that tenant (impersonated). Yields (namespace, kubectl)."""
    import subprocess
    import uuid

    import yaml

    namespace, user = f"tenant-{uuid.uuid4().hex[:6]}", "tenant-b"
    cluster.create_namespace(namespace)
    rules = [
        {"apiGroups": ["orchestration.aibrix.ai"], "resources": ["stormservices"], "verbs": ["get", "list", "create", "patch", "update"]}
    ]
    rbac = [
        {
            "apiVersion": "rbac.authorization.k8s.io/v1",
            "kind": "Role",
            "metadata": {"name": "tenant", "namespace": namespace},
            "rules": rules,
        },
        {
            "apiVersion": "rbac.authorization.k8s.io/v1",
            "kind": "RoleBinding",
            "metadata": {"name": "tenant", "namespace": namespace},
            "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": "tenant"},
            "subjects": [{"apiGroup": "rbac.authorization.k8s.io", "kind": "User", "name": user}],
        },
    ]
    kubectl = [str(cluster.state_dir / "bin" / "kubectl"), f"--kubeconfig={cluster.state_dir / 'kubeconfig'}"]

    def as_tenant(*args: str, stdin: str | None = None) -> subprocess.CompletedProcess[str]:
        return subprocess.run([*kubectl, f"--as={user}", "-n", namespace, *args], input=stdin, capture_output=True, text=True)

    applied = subprocess.run([*kubectl, "apply", "-f", "-"], input=yaml.safe_dump_all(rbac), capture_output=True, text=True)
    assert applied.returncode == 0, applied.stderr
    try:
        yield namespace, as_tenant
    finally:
        cluster.delete_namespace(namespace, wait=120)


@contextmanager
def forge_moves(cluster: DevCluster, victim: tuple[str, str]) -> Iterator[None]:
    """What a clever tenant writes on its own StormServices (issue 43): on one that never opted in, two
    unsettled moves dated now (the cluster's cap is two) and an unsettled move to make room for the
    victim's replica; on one that asks for healing, the same. Neither may hold back another tenant's
    healing: records count only on a service that asks for healing, one move per service."""
    import yaml

    now = datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
    moving = {"at": now, "toTier": 1, "to": "s0", "reason": "soft-above-tier"}
    room = {"at": now, "toTier": 1, "to": "s1", "reason": "make-room", "for": f"StormService {victim[0]}/{victim[1]} replica x"}
    records = json.dumps({"forged-a": moving, "forged-b": moving, "forged-c": room})
    with tenant(cluster) as (namespace, as_tenant):
        for name, annotations in (("plain", {}), ("healing", {**SOFT_LEAF, **HEAL})):
            svc = stormservice(f"forger-{name}", namespace, replicas=0, annotations={**annotations, "stormtopo.io/moves": records})
            created = as_tenant("create", "-f", "-", stdin=yaml.safe_dump(svc))
            assert created.returncode == 0, created.stderr
        yield


def test_a_soft_replica_across_the_spine_moves_into_a_leaf_once_one_frees_up_whatever_a_tenant_forged(
    cluster: DevCluster, topology: Topology, namespace: str
) -> None:
    name = f"heal-{namespace}"  # AIBrix v0.7.0 counts same-named RoleSets across namespaces
    fill(cluster, namespace, ["node0", "node2", "node4", "node5", "node6", "node7"])  # free: node1 (s0), node3 (s1)
    cluster.create(stormservice(name, namespace, roles=BIG, annotations={**SOFT_LEAF, **HEAL}))
    before = wide_placement(cluster, topology, namespace, name)
    with forge_moves(cluster, (namespace, name)):
        free(cluster, namespace, "node0")  # s0: node0 free, node1 the replica's own
        pods = cluster.wait(lambda: moved(cluster, topology, namespace, name, before), MOVE_WITHIN, "the replica bound within one leaf")
    assert sorted(node_names(pods)) == ["node0", "node1"]
    (moving,) = events(cluster, namespace, name, "ReplicaMoving")
    assert "to s0 (tier 1)" in moving and "landed above tier 1" in moving, moving
    moves = json.loads(cluster.stormservice(namespace, name)["metadata"]["annotations"]["stormtopo.io/moves"])
    assert next(iter(moves.values()))["to"] == "s0"


def moved(cluster: DevCluster, topology: Topology, namespace: str, name: str, before: dict[str, list[str]]) -> list[dict[str, Any]]:
    """The replica re-created (pods it did not have before) and bound within one leaf."""
    for pods in replicas(cluster, namespace, name).values():  # one; not unpacked: a duplicate RoleSet of a moment is no error
        fresh = [p for p in pods if p["metadata"]["uid"] not in next(iter(before.values()))]
        if len(fresh) == 2 and in_one_leaf(topology, fresh):
            return fresh
    return []

    pods = cluster.wait(moved, MOVE_WITHIN, "the replica re-created and bound within one leaf")
    assert sorted(node_names(pods)) == ["node0", "node1"]
    (moving,) = events(cluster, namespace, name, "ReplicaMoving")
    assert "to s0 (tier 1)" in moving and "landed above tier 1" in moving, moving
    moves = json.loads(cluster.stormservice(namespace, name)["metadata"]["annotations"]["stormtopo.io/moves"])
    assert next(iter(moves.values()))["to"] == "s0"


def test_without_the_opt_in_nothing_moves(cluster: DevCluster, cluster_dir: Path, topology: Topology, namespace: str) -> None:
    name = f"stay-{namespace}"
    fill(cluster, namespace, ["node0", "node2", "node4", "node5", "node6", "node7"])
    cluster.create(stormservice(name, namespace, roles=BIG, annotations=SOFT_LEAF))
    before = wide_placement(cluster, topology, namespace, name)
    free(cluster, namespace, "node0")
    dry = stormtopo("heal", f"{namespace}/{name}", "--dry-run", "--kubeconfig", str(cluster_dir / "kubeconfig"))
    assert "not opted in" in dry.stdout and "would move to s0" in dry.stdout, dry.stdout  # there is room: healing would
    passes = healing_passes(cluster_dir)
    cluster.wait(lambda: healing_passes(cluster_dir) >= passes + 3, 90, "three healing passes since the leaf freed up")
    after = {r: sorted(p["metadata"]["uid"] for p in pods) for r, pods in replicas(cluster, namespace, name).items()}
    assert after == before
    assert not events(cluster, namespace, name, "ReplicaMoving")


@pytest.mark.parametrize(("budget", "allowed"), [("keep-all", 0), ("allow-two", 2)])  # minAvailable 2 and 0
def test_a_disruption_budget_that_forbids_the_eviction_moves_nothing_and_says_why(
    cluster: DevCluster, topology: Topology, namespace: str, budget: str, allowed: int
) -> None:
    """kube-controller-manager's disruption controller keeps the budget's status, as in any cluster:
    one that allows no disruption stops the move before its first eviction; one that allows both pods'
    lets it happen. minAvailable, not maxUnavailable: for pods whose controller (a RoleSet) has no
    scale subresource, the disruption controller cannot count maxUnavailable and allows nothing."""
    name = f"pdb{allowed}-{namespace}"
    fill(cluster, namespace, ["node0", "node2", "node4", "node5", "node6", "node7"])
    cluster.create(stormservice(name, namespace, roles=BIG, annotations={**SOFT_LEAF, **HEAL}))
    pdb = {
        "apiVersion": "policy/v1",
        "kind": "PodDisruptionBudget",
        "metadata": {"name": budget, "namespace": namespace},
        "spec": {"minAvailable": 2 - allowed, "selector": {"matchLabels": {"app": name}}},
    }
    cluster.create(pdb)
    before = wide_placement(cluster, topology, namespace, name)
    policy = client.PolicyV1Api(cluster.api_client)

    def counted() -> bool:
        status = policy.read_namespaced_pod_disruption_budget(budget, namespace).status
        return status is not None and status.current_healthy == 2 and status.disruptions_allowed == allowed

    cluster.wait(counted, 60, f"the disruption controller counting 2 healthy pods, {allowed} disruptions allowed")
    free(cluster, namespace, "node0")
    if allowed:
        cluster.wait(lambda: events(cluster, namespace, name, "ReplicaMoving"), MOVE_WITHIN, "the move the budget allows")
        return

    def refused() -> str:
        found = events(cluster, namespace, name, "ReplicaNotMoved")
        return found[0] if found else ""

    message = cluster.wait(refused, MOVE_WITHIN, "a ReplicaNotMoved Event")
    assert f"PodDisruptionBudget {budget} allows 0 disruptions" in message, message
    after = {r: sorted(p["metadata"]["uid"] for p in pods) for r, pods in replicas(cluster, namespace, name).items()}
    assert after == before
    assert not events(cluster, namespace, name, "ReplicaMoving")


def test_two_wide_replicas_move_one_at_a_time_within_the_services_budget(cluster: DevCluster, topology: Topology, namespace: str) -> None:
    name = f"pair-{namespace}"
    fill(cluster, namespace, ["node0", "node2", "node4", "node6"])  # free: one node of every leaf
    cluster.create(stormservice(name, namespace, roles=BIG, replicas=2, annotations={**SOFT_LEAF, **HEAL}))
    before = wide_placement(cluster, topology, namespace, name, count=2)
    cluster.wait(lambda: len(ready_replicas(cluster, namespace, name)) == 2, 60, "both replicas ready")
    with watching_ready_replicas(cluster, namespace, name) as ready:
        free(cluster, namespace, "node0")
        free(cluster, namespace, "node4")  # room for both at once: s0 and s2

        def both_moved() -> bool:
            now = replicas(cluster, namespace, name)
            return len(now) == 2 and all(
                in_one_leaf(topology, pods) and not {p["metadata"]["uid"] for p in pods} & set(before[r]) for r, pods in now.items()
            )

        cluster.wait(both_moved, 2 * MOVE_WITHIN + 30, "both replicas moved into a leaf each")

        def settled() -> dict[str, Any]:
            raw = cluster.stormservice(namespace, name)["metadata"]["annotations"].get("stormtopo.io/moves")
            table = json.loads(raw) if raw else {}
            return table if len(table) == 2 and all(m.get("done") for m in table.values()) else {}

        moves = cluster.wait(settled, 60, "both moves settled in the move table")
    # maxUnavailable unset: AIBrix resolves it to 1, so at least one of the two replicas was always ready.
    assert min(ready) >= 1, ready
    assert all(m["landed"] for m in moves.values()), moves
    # One at a time: the second move began after the first replica was ready again on its new pods.
    first, second = sorted(moves.values(), key=lambda m: m["at"])
    assert first["unavailableSeconds"] is not None
    assert parse_time(second["at"]) >= parse_time(first["at"]) + first["unavailableSeconds"] - 1.0, moves


def test_a_hard_replica_in_violation_is_moved_back_within_its_tier(cluster: DevCluster, topology: Topology, namespace: str) -> None:
    name = f"back-{namespace}"
    fill(cluster, namespace, ["node0", "node2", "node4", "node5", "node6", "node7"])  # no leaf holds it: Volcano holds the gang
    cluster.create(stormservice(name, namespace, roles=BIG, annotations={**HARD_LEAF, **HEAL}))

    def created() -> list[dict[str, Any]]:
        pods = cluster.pods(namespace, f"storm-service-name={name}")
        return pods if len(pods) == 2 and not any(p["spec"].get("nodeName") for p in pods) else []

    pods = cluster.wait(created, 60, "both pods created and held by Volcano")
    # Bound by hand, across the spine (as another scheduler or an operator's kubectl would): a violation.
    for pod, node in zip(sorted(pods, key=lambda p: p["metadata"]["name"]), ["node1", "node3"], strict=True):
        binding = {
            "apiVersion": "v1",
            "kind": "Binding",
            "metadata": {"name": pod["metadata"]["name"]},
            "target": {"apiVersion": "v1", "kind": "Node", "name": node},
        }
        cluster.core.create_namespaced_binding(namespace, binding, _preload_content=False)
    cluster.wait(lambda: events(cluster, namespace, name, "TopologyViolated"), 60, "the TopologyViolated Warning")
    uids = {p["metadata"]["uid"] for p in pods}
    free(cluster, namespace, "node0")

    def moved() -> list[dict[str, Any]]:
        now = [p for pods in replicas(cluster, namespace, name).values() for p in pods if p["metadata"]["uid"] not in uids]
        return now if len(now) == 2 and in_one_leaf(topology, now) else []

    assert sorted(node_names(cluster.wait(moved, MOVE_WITHIN, "the replica placed again within one leaf"))) == ["node0", "node1"]
    (moving,) = events(cluster, namespace, name, "ReplicaMoving")
    assert "violates its hard request" in moving, moving


def test_a_smaller_replica_of_another_service_moves_out_of_the_way_and_the_wide_one_then_fits(
    cluster: DevCluster, cluster_dir: Path, topology: Topology, namespace: str
) -> None:
    """No leaf has room for the wide replica, but one would without a smaller replica of another opted-in
    service, which fits in a fuller leaf (fuller than its own, whether its old pods still terminate or
    are gone): the smaller one moves, within one leaf; where Volcano places it in the fuller leaf, the wide
    one then moves into the leaf it left; where Volcano holds it in its leaf (a re-created pod placed
    before the last old one was evicted), its move is recorded as not landed and its cool-down doubled."""
    big, small = f"wide-{namespace}", f"small-{namespace}"
    with making_room(cluster_dir):
        lend_room(cluster, topology, namespace, big, small)


def test_the_dry_run_names_the_replica_that_would_make_room(
    cluster: DevCluster, cluster_dir: Path, topology: Topology, namespace: str
) -> None:
    """The operator as shipped (no --heal-make-room): the wide replica stays, and the dry run says which
    replica of another opted-in service making room would move, and where."""
    big, small = f"dwide-{namespace}", f"dsmall-{namespace}"
    small_before = wide_beside_small(cluster, topology, namespace, big, small)[1]
    dry = stormtopo("heal", f"{namespace}/{big}", "--dry-run", "--kubeconfig", str(cluster_dir / "kubeconfig"))
    wanted = f"of StormService {namespace}/{small} would first move to s2, making room in s0"
    assert f"with --heal-make-room: replica {small}-" in dry.stdout and wanted in dry.stdout, dry.stdout
    after = {p["metadata"]["uid"] for pods in replicas(cluster, namespace, small).values() for p in pods}
    assert after == small_before  # nothing moved


def wide_beside_small(
    cluster: DevCluster, topology: Topology, namespace: str, big: str, small: str
) -> tuple[dict[str, list[str]], set[str]]:
    """A smaller replica of a service that lends room (two replicas: one may move, issue 34) alone on
    node0 (s0), its other replica on node7; s2 with room for it twice over; the wide 8 + 8 replica across
    s0 and s1, s0 holding it only without the smaller one. The wide replica's pods by replica, and the
    smaller one's pod uids."""
    fill(cluster, namespace, ["node1", "node2", "node3", "node4", "node5", "node6"])  # node0 free, node7 with 2
    cluster.create(filler_pod("most-node7", namespace, "node7", 6))
    cluster.bound_pods(namespace, "stormtopo.io/filler=true", 7)  # Volcano knows node7's room before the service
    one_each = (Role("prefill", gpus=1), Role("decode", gpus=1))
    cluster.create(
        stormservice(small, namespace, roles=one_each, replicas=2, annotations={**SOFT_LEAF, **HEAL, LEND_ROOM_ANNOTATION: "true"})
    )
    placed = cluster.bound_pods(namespace, f"storm-service-name={small}", 4)
    assert node_names(placed) == ["node0", "node0", "node7", "node7"]
    small_before = {p["metadata"]["uid"] for p in placed}
    for node in ("node1", "node3", "node4"):
        free(cluster, namespace, node)
    # s2: 4 GPUs free: room for the smaller replica twice over, as Volcano asks while its old pods terminate.
    cluster.create(filler_pod("most-node4", namespace, "node4", 4))
    cluster.bound_pods(namespace, "stormtopo.io/filler=true", 5)
    # node1 and node3 are the only nodes with 8 free: the 8 + 8 replica lands across s0 and s1.
    cluster.create(stormservice(big, namespace, roles=BIG, annotations={**SOFT_LEAF, **HEAL}))
    return wide_placement(cluster, topology, namespace, big), small_before


def lend_room(cluster: DevCluster, topology: Topology, namespace: str, big: str, small: str) -> None:
    before, small_before = wide_beside_small(cluster, topology, namespace, big, small)

    def moved(name: str, old: set[str]) -> list[dict[str, Any]]:
        pods = [p for pods in replicas(cluster, namespace, name).values() for p in pods if p["metadata"]["uid"] not in old]
        return pods if len(node_names(p for p in pods if p["spec"].get("nodeName"))) == 2 and in_one_leaf(topology, pods) else []

    small_pods = cluster.wait(lambda: moved(small, small_before), 120, "the smaller replica placed again within one leaf")
    (making_room,) = events(cluster, namespace, small, "ReplicaMoving")
    assert f"makes room in s0 for StormService {namespace}/{big} replica" in making_room, making_room

    def settled() -> dict[str, Any]:
        raw = (cluster.stormservice(namespace, small)["metadata"].get("annotations") or {}).get("stormtopo.io/moves") or "{}"
        return next((m for m in json.loads(raw).values() if m.get("done")), {})

    record = cluster.wait(settled, 120, "the move to make room settled")
    if not record["landed"]:
        # Volcano may place the first re-created pod while the last old one still runs: the gang's allocated
        # HyperNode then holds it in s0 (README, "Making room"). Then nothing more moves for it now.
        assert node_names(small_pods) == ["node0", "node0"] and record["cooldown"] == 2 * COOLDOWN, record
        return
    assert node_names(small_pods) == ["node4", "node4"]
    big_old = set(next(iter(before.values())))
    big_pods = cluster.wait(lambda: moved(big, big_old), 120, "the wide replica placed again within s0")
    assert sorted(node_names(big_pods)) == ["node0", "node1"]
    (moving,) = events(cluster, namespace, big, "ReplicaMoving")
    assert "to s0 (tier 1)" in moving, moving
