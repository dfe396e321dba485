"""Faults, bad input and load on the real control plane (issue 6). Each test says what it proves."""

from __future__ import annotations

import statistics
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from stormtopo.core.request import ClusterTiers, RequestError, parse_request
from stormtopo.core.vocabulary import HIGHEST_TIER, HIGHEST_TIER_NAME, MODE, SCOPE
from stormtopo.devenv import cluster as dev
from stormtopo.devenv.client import DevCluster
from stormtopo.devenv.workloads import stormservice

HARD_LEAF = {MODE: "hard", HIGHEST_TIER: "1"}
TIERS = ClusterTiers(frozenset({1, 2, 3}), frozenset({"leaf", "spine", "core"}))


@pytest.mark.timeout(600)
def test_webhook_load_2000_admissions_at_concurrency_50(cluster: DevCluster, namespace: str) -> None:
    """Proves: the webhook answers 2,000 pod admissions from 50 concurrent clients with no failure and a
    p99 far below the pod webhook's 3 s timeout. Server-side dry run: full admission, no storage."""
    cluster.create(stormservice("load", namespace, annotations=HARD_LEAF, scheduler_name="nobody"))
    roleset = cluster.wait(lambda: cluster.rolesets(namespace, "load"), 90, "the RoleSet")[0]["metadata"]["name"]

    def admit(i: int) -> float:
        pod = {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {
                "name": f"l-{i}",
                "namespace": namespace,
                "labels": {"storm-service-name": "load", "roleset-name": roleset, "role-name": "decode"},
            },
            "spec": {"containers": [{"name": "c", "image": "x"}]},
        }
        start = time.perf_counter()
        created = cluster.core.create_namespaced_pod(namespace, pod, dry_run="All")
        assert created.metadata.annotations["volcano.sh/task-spec"] == "decode"  # the webhook really mutated it
        return time.perf_counter() - start

    with ThreadPoolExecutor(max_workers=50) as pool:
        latencies = sorted(pool.map(admit, range(2000)))
    p99 = latencies[int(0.99 * len(latencies))]
    print(f"\n  2000 admissions, concurrency 50: p50 {statistics.median(latencies) * 1000:.0f} ms, p99 {p99 * 1000:.0f} ms")
    assert len(latencies) == 2000
    assert p99 < 2.5  # under the pod webhook's 3 s timeout, on a loaded 2-core machine


bad_values = st.one_of(
    st.text(min_size=1, max_size=8), st.integers(-3, 9).map(str), st.sampled_from(["Hard", "SOFT", "0", "4", "x", "rack"])
)
bad_sets = st.fixed_dictionaries(
    {MODE: st.sampled_from(["hard", "soft", "strict", "HARD", ""])},
    optional={HIGHEST_TIER: bad_values, HIGHEST_TIER_NAME: bad_values, SCOPE: st.sampled_from(["RoleSet", "Zone", "stormservice", ""])},
)


@pytest.mark.timeout(600)
def test_fifty_generated_bad_requests_each_get_a_warning_and_change_nothing(cluster: DevCluster, namespace: str) -> None:
    """Proves: for ≥ 50 distinct invalid annotation sets (hypothesis), each StormService gets a Warning
    Event naming the problem, its PodGroup stays exactly as AIBrix wrote it, and the operator keeps working."""
    cases: list[dict[str, str]] = []

    @settings(max_examples=400, deadline=None, suppress_health_check=list(HealthCheck))
    @given(bad_sets)
    def collect(case: dict[str, str]) -> None:
        try:
            parse_request(case, TIERS)
        except RequestError:
            if case not in cases and len(cases) < 50:
                cases.append(case)

    collect()
    assert len(cases) == 50
    for i, case in enumerate(cases):
        cluster.create(stormservice(f"bad-{i}", namespace, annotations=case, scheduler_name="nobody"))

    def warned() -> bool:
        events = cluster.core.list_namespaced_event(namespace, field_selector="reason=InvalidTopologyRequest").items
        return len({e.involved_object.name for e in events}) == 50

    cluster.wait(warned, 120, "a Warning Event on each of the 50 StormServices", interval=1.0)
    for event in cluster.core.list_namespaced_event(namespace, field_selector="reason=InvalidTopologyRequest").items:
        assert (event.type == "Warning" and "accepted" in event.message) or "missing" in event.message or "needs" in event.message
    groups = cluster.podgroups(namespace)
    assert groups and all("networkTopology" not in g["spec"] for g in groups)  # nothing changed for any of them
    cluster.create(stormservice("still-good", namespace, annotations=HARD_LEAF))
    cluster.bound_pods(namespace, "storm-service-name=still-good", 2, timeout=60)


@pytest.mark.timeout(300)
@pytest.mark.parametrize("component", ["kube-apiserver", "etcd"])
def test_operator_watches_resume_after_a_control_plane_restart(
    cluster: DevCluster, cluster_dir: Path, namespace: str, component: str
) -> None:
    """Proves: after kube-apiserver or etcd restarts, the operator's watches resume without missing the
    changes made right after; the recovery time is printed."""
    started = time.monotonic()
    dev.restart_component(cluster_dir, component, kill=True, down_for=2.0)
    cluster.wait(lambda: cluster.api_ready(), 120, f"the API after the {component} restart", interval=0.5)
    api_back = time.monotonic() - started
    name = f"after-{component}"  # AIBrix v0.7.0 counts same-named RoleSets across namespaces
    cluster.create(stormservice(name, namespace, annotations=HARD_LEAF, volcano_strategy=False))
    cluster.bound_pods(namespace, f"storm-service-name={name}", 2, timeout=120)
    group = cluster.only(lambda: cluster.podgroups(namespace), "PodGroup")
    assert group["metadata"]["labels"]["app.kubernetes.io/managed-by"] == "stormtopo"  # the operator saw the new RoleSet
    print(f"\n  {component} restart: API back in {api_back:.1f}s, a new replica placed {time.monotonic() - started:.1f}s after the kill")


@pytest.mark.timeout(900)
def test_operator_sigkilled_at_random_while_100_stormservices_come_scale_and_go(
    cluster: DevCluster,
    cluster_dir: Path,
    topology,
    namespace: str,  # type: ignore[no-untyped-def]
) -> None:
    """Proves: with the operator SIGKILLed and restarted at random moments while 100 StormServices are
    created (both arrival ways), scaled and deleted, everything converges: one PodGroup per replica with
    its constraint, no orphan or duplicate PodGroup, and no opted-in pod bound outside its leaf."""
    import random
    import threading

    from stormtopo.devenv.workloads import Role

    rng = random.Random(1730)
    stop = threading.Event()
    kills: list[float] = []

    def chaos() -> None:
        while not stop.is_set():
            time.sleep(rng.uniform(0.5, 3.0))
            dev.stop_component(cluster_dir, "operator", kill=True)
            kills.append(time.monotonic())
            dev.start_operator(cluster_dir)

    cpu_only = (Role("prefill", gpus=0), Role("decode", gpus=0))  # 200+ pods fit in CPU; GPUs stay free
    monkey = threading.Thread(target=chaos, daemon=True)
    monkey.start()
    try:
        for i in range(100):
            _retry(
                lambda i=i: cluster.create(
                    stormservice(f"c{i}", namespace, roles=cpu_only, annotations=HARD_LEAF, volcano_strategy=i % 2 == 0)
                )
            )
        for i in range(0, 100, 5):
            _retry(lambda i=i: cluster.patch_stormservice(namespace, f"c{i}", {"spec": {"replicas": 2}}))
        for i in range(1, 100, 7):
            _retry(lambda i=i: cluster.delete_stormservice(namespace, f"c{i}"))
        time.sleep(8)  # keep killing while the replicas are still being created and bound
    finally:
        stop.set()
        monkey.join(30)
        if not [p for p in dev.processes.tracked(cluster_dir) if p.name == "operator" and p.alive()]:
            dev.start_operator(cluster_dir)
    deleted = set(range(1, 100, 7))
    expected_replicas = {f"c{i}": (2 if i % 5 == 0 else 1) for i in range(100) if i not in deleted}

    def converged() -> bool:
        rolesets = cluster.rolesets(namespace)
        by_service: dict[str, list[str]] = {}
        for rs in rolesets:
            by_service.setdefault(rs["metadata"]["labels"]["storm-service-name"], []).append(rs["metadata"]["name"])
        if {s: len(v) for s, v in by_service.items()} != expected_replicas:
            return False
        groups = cluster.podgroups(namespace)
        names = [g["metadata"]["name"] for g in groups]
        wanted = sorted(n for v in by_service.values() for n in v)
        if sorted(names) != wanted:  # exactly one per replica: no orphan, no duplicate
            return False
        if not all(g["spec"].get("networkTopology") == {"mode": "hard", "highestTierAllowed": 1} for g in groups):
            return False
        pods = cluster.pods(namespace)
        return len([p for p in pods if p["status"].get("phase") == "Running"]) == 2 * sum(expected_replicas.values())

    cluster.wait(converged, 300, "every replica to converge after the chaos", interval=2.0)
    by_replica: dict[str, list[str]] = {}
    for pod in cluster.pods(namespace):
        by_replica.setdefault(pod["metadata"]["labels"]["roleset-name"], []).append(pod["spec"]["nodeName"])
    outside = {rs: nodes for rs, nodes in by_replica.items() if (d := topology.lowest_common_switch(nodes)) is None or d.tier > 1}
    print(f"\n  {len(kills)} SIGKILLs of the operator; {sum(expected_replicas.values())} replicas converged")
    assert len(kills) >= 3 and not outside


def _retry(call, within: float = 90.0) -> None:  # type: ignore[no-untyped-def]
    """API calls during the chaos: while the operator is down (its restart may take up to 60 s), the
    admission policy refuses changes to opted-in services; retry until it is back."""
    deadline = time.monotonic() + within
    retried = False
    while True:
        try:
            call()
            return
        except Exception as exc:
            if retried and getattr(exc, "status", None) == 409:
                return  # an earlier try was stored, and only its answer lost
            if time.monotonic() > deadline:
                raise
            retried = True
            time.sleep(0.5)


def test_a_pod_may_not_join_another_stormservices_podgroup(cluster: DevCluster, namespace: str) -> None:
    """Proves: a pod of one StormService that names another StormService's PodGroup is rejected by the
    webhook, whether or not its own StormService asks for a topology."""
    from kubernetes.client.exceptions import ApiException

    cluster.create(stormservice("owner", namespace, annotations=HARD_LEAF))
    cluster.bound_pods(namespace, "storm-service-name=owner", 2)
    group = cluster.only(lambda: cluster.podgroups(namespace), "PodGroup")
    cluster.create(stormservice("intruder", namespace, scheduler_name="nobody"))  # not opted in
    roleset = cluster.wait(lambda: cluster.rolesets(namespace, "intruder"), 90, "the intruder's RoleSet")[0]["metadata"]["name"]
    pod = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": "sneaky",
            "namespace": namespace,
            "labels": {"storm-service-name": "intruder", "roleset-name": roleset, "role-name": "decode"},
            "annotations": {"scheduling.k8s.io/group-name": group["metadata"]["name"]},
        },
        "spec": {"containers": [{"name": "c", "image": "x"}]},
    }
    with pytest.raises(ApiException) as denied:
        cluster.core.create_namespaced_pod(namespace, pod)
    assert denied.value.status == 403 and "belongs to StormService 'owner'" in str(denied.value.body)


@pytest.mark.timeout(300)
def test_aibrix_controller_restart_never_strips_the_constraint(cluster: DevCluster, cluster_dir: Path, namespace: str) -> None:
    """Proves: when AIBrix's controller restarts (and resyncs every PodGroup from scratch) while a
    service scales, no stored PodGroup version lacks its constraint."""
    from tests.integration.watching import PodGroupVersions

    with PodGroupVersions(cluster, namespace) as versions:
        cluster.create(stormservice("steady", namespace, annotations=HARD_LEAF))
        cluster.bound_pods(namespace, "storm-service-name=steady", 2)
        dev.restart_component(cluster_dir, "aibrix-controller-manager", kill=True, down_for=1.0)
        cluster.patch_stormservice(namespace, "steady", {"spec": {"replicas": 3}})
        cluster.bound_pods(namespace, "storm-service-name=steady", 6, timeout=120)
        time.sleep(3)
    assert len({name for _, name, _ in versions.stored()}) == 3
    assert not versions.without_constraint()
