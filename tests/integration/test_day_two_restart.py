"""Day two (issue 20, item 1): kube-apiserver stopped 25 s (a brownout: connections accepted, nothing
answered), or down past every loop's old liveness limit (connections refused), then back. Every loop of
the operator must go on: resync (a stale opted-in key goes), Events (a new invalid request gets its
Warning), the watches (a new replica is placed and reported), leadership (the Lease is kept through the
outage, or lost and taken back), and /healthz says ok.

The operator runs leader-elected here, as the chart runs it: leadership is one of the loops that died.
The long outage keeps its Lease (a 180 s Lease: a 120 s renew deadline), the brownout loses it (15 s):
between them, both ways back to leading; one outage of each kind keeps this module near 4 minutes.
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path
from typing import Any

import pytest
import yaml
from kubernetes import client

from stormtopo.core.optin import split_key
from stormtopo.core.topology.tree import Topology
from stormtopo.core.vocabulary import HIGHEST_TIER, MODE
from stormtopo.devenv import processes
from stormtopo.devenv.client import DevCluster
from stormtopo.devenv.cluster import OPERATOR_ARGS_ENV
from stormtopo.devenv.workloads import stormservice
from stormtopo.operator.events import IDLE_BEAT
from tests.conftest import TEST_PERIODS
from tests.integration.apiproxy import watch_blackhole
from tests.integration.chart import InstalledOperator, kubectl
from tests.integration.faults import apiserver_brownout
from tests.integration.operators import elected, follower, get, metrics_url, operator_process

LEASE_NAMESPACE = "default"  # the operator's default: its Lease lives here
HARD_LEAF = {MODE: "hard", HIGHEST_TIER: "1"}
# A brownout past the 15 s Lease's 10 s renew deadline, with the API server's slow first answers after it.
BROWNOUT_SECONDS = 25.0
LONG_LEASE_SECONDS = 180  # its renew deadline (120 s) outlasts the long outage and the API server's restart


def _lease(cluster: DevCluster) -> tuple[str, str]:
    """(holder, renewTime); empty while the API server cannot answer."""
    try:
        leases = client.CoordinationV1Api(cluster.api_client)
        lease = leases.read_namespaced_lease("stormtopo-operator", LEASE_NAMESPACE, _request_timeout=3)
        return str(lease.spec.holder_identity or ""), str(lease.spec.renew_time or "")
    except Exception:
        return "", ""


def _add_stale_key(cluster: DevCluster, key: str) -> None:
    """A key whose StormService does not exist: what a StormService deleted while stormtopo was down leaves."""
    cluster.list_opted_in(*split_key(key), "RoleSet")


def _reasons(cluster: DevCluster, namespace: str, name: str) -> set[str]:
    return {str(e.get("reason")) for e in cluster.events(namespace, name)}


@pytest.mark.timeout(600)
def test_every_loop_goes_on_after_a_brownout_that_cost_the_lease(cluster: DevCluster, cluster_dir: Path, namespace: str) -> None:
    """Proves: after kube-apiserver was stopped 25 s, a stale opted-in key goes within 90 s (resync), a new
    invalid request gets its Warning (Events), a new opted-in replica is placed and reported (the
    server-side pod and PodGroup watches), the Lease is renewed by the same replica again (leadership), and
    /healthz is 200 with every loop healthy.

    With a 15 s Lease the leader loses it during the brownout and takes it back, so its catch-up at
    election runs into the API's return (the long outage below keeps its Lease)."""
    with elected(cluster_dir, 15) as identity:
        _survives(cluster, cluster_dir, namespace, identity)


def _work_to_resume(cluster: DevCluster, namespace: str, ghost: str) -> str:
    """What a fault's recovery is judged by, made right after the API server is back: a stale listing (its
    key returned), a new invalid request and a new hard replica."""
    stale = f"{namespace}.{ghost}"
    _add_stale_key(cluster, stale)
    cluster.create(stormservice("typo", namespace, annotations={MODE: "hard", HIGHEST_TIER: "9"}, scheduler_name="nobody"))
    cluster.create(stormservice("after", namespace, annotations=HARD_LEAF, volcano_strategy=False))
    return stale


def _survives(cluster: DevCluster, cluster_dir: Path, namespace: str, elected: str) -> None:
    cluster.wait(lambda: _lease(cluster)[0] == elected, 60, f"{elected} to hold the Lease")
    log = cluster_dir / "logs" / "operator.log"
    log_start = log.stat().st_size

    started = time.monotonic()
    apiserver_brownout(cluster_dir, BROWNOUT_SECONDS)
    cluster.wait(lambda: cluster.api_ready(), 120, "the API server back after the brownout", interval=0.5)
    back = time.monotonic()

    stale = _work_to_resume(cluster, namespace, "ghost-brownout")

    cluster.wait(lambda: stale not in cluster.opted_in(), 90, f"the stale key {stale} removed by the resync", interval=1.0)
    unlisted = time.monotonic() - back
    cluster.wait(lambda: "InvalidTopologyRequest" in _reasons(cluster, namespace, "typo"), 90, "the Warning on the invalid request")
    cluster.bound_pods(namespace, "storm-service-name=after", 2, timeout=120)
    cluster.wait(lambda: "ReplicaPlaced" in _reasons(cluster, namespace, "after"), 90, "the new replica reported as placed", interval=1.0)

    holder, renewed = _lease(cluster)
    assert holder == elected
    cluster.wait(lambda: _lease(cluster)[0] == elected and _lease(cluster)[1] != renewed, 30, "the Lease renewed again")

    status, body = get(metrics_url(cluster_dir, "/healthz"))
    assert status == 200, body
    health: dict[str, Any] = json.loads(body)
    assert health["ok"] and {"resync", "relist", "leader-election", "event-poster", "watch-pods"} <= set(health["loops"])
    assert health["loops"]["resync"]["last_success_seconds_ago"] is not None
    assert health["loops"]["resync"]["last_success_seconds_ago"] < 65  # it ran after the outage

    text = log.read_text(errors="replace")[log_start:]
    assert "Task exception was never retrieved" not in text and "died" not in text
    print(
        f"\n  brownout {BROWNOUT_SECONDS:.0f} s: API back {back - started:.0f} s after it began; stale key gone "
        f"{unlisted:.0f} s later; {text.count('failed (')} loop failures logged"
    )


PERIOD = TEST_PERIODS["resync-seconds"]  # the operator's resync period in these tests (tests/conftest.py)
MARGIN = 20.0  # a loaded 2-core machine: the API server's first answers after a restart are slow
# Past the old liveness limit of every loop (three periods + 30 s): with the tests' periods at most 60 s, the
# event poster's (10 s); 150 s with production's periods (120 s for the 30 s loops), the same bug class.
LONG_OUTAGE_SECONDS = max(75.0, 3 * max(PERIOD, TEST_PERIODS["volcano-recheck-seconds"], IDLE_BEAT) + 30.0 + 15.0)


@pytest.mark.timeout(900)
def test_healthz_stays_200_on_leader_and_follower_through_an_outage_past_every_loops_old_limit(
    cluster: DevCluster, cluster_dir: Path, namespace: str
) -> None:
    """Issue 32, item 1: liveness means stuck, nothing else. kube-apiserver down LONG_OUTAGE_SECONDS: /healthz of the
    leader and of a follower answers 200 at every look (a restart would fix nothing and leave the webhook
    without a server for the kubelet's back-off); once the API is back, the resync, Events and placements
    resume within one resync period, the leader still holds its Lease and renews it, and the loops'
    failures are in the metrics."""
    with elected(cluster_dir, LONG_LEASE_SECONDS) as identity, follower(cluster_dir, identity) as second:
        urls = {"leader": metrics_url(cluster_dir, "/healthz"), "follower": second.url("/healthz")}
        cluster.wait(lambda: _lease(cluster)[0] == identity, 60, f"{identity} to hold the Lease")
        log = cluster_dir / "logs" / "operator.log"
        log_start = log.stat().st_size
        apiserver = next(p for p in processes.tracked(cluster_dir) if p.name == "kube-apiserver")
        argv = json.loads(apiserver.pidfile.read_text())["argv"]
        processes.stop(apiserver, kill=True)
        started = time.monotonic()
        looks: dict[str, list[int]] = {"leader": [], "follower": []}
        try:
            while time.monotonic() - started < LONG_OUTAGE_SECONDS:  # the fault's length, sampled throughout
                for who, url in urls.items():
                    status, body = get(url)
                    looks[who].append(status)
                    assert status == 200, f"{who} /healthz {status} {time.monotonic() - started:.0f} s into the outage: {body}"
                time.sleep(2.0)
        finally:
            processes.start(cluster_dir, "kube-apiserver", argv)
        assert second.process.alive() and operator_process(cluster_dir).alive()
        cluster.wait(lambda: cluster.api_ready(), 120, "the API server back", interval=0.5)
        back = time.monotonic()

        stale = _work_to_resume(cluster, namespace, "ghost-long")

        def resynced() -> bool:  # the leader's resync completed a pass after the API server came back
            status, body = get(urls["leader"])
            ago = json.loads(body)["loops"]["resync"]["last_success_seconds_ago"] if status == 200 else None
            return ago is not None and ago < time.monotonic() - back

        # Each within one period (the resync's 30 s) and a margin for this loaded machine: nothing waits
        # out a restart or the 30 s backoff cap.
        cluster.wait(resynced, PERIOD + MARGIN, "a resync pass after the API server came back", interval=1.0)
        resync = time.monotonic() - back
        cluster.wait(
            lambda: "InvalidTopologyRequest" in _reasons(cluster, namespace, "typo"),
            PERIOD + MARGIN,
            "the Warning on the invalid request",
        )
        warned = time.monotonic() - back
        cluster.bound_pods(namespace, "storm-service-name=after", 2, timeout=120)
        bound = time.monotonic()
        cluster.wait(
            lambda: "ReplicaPlaced" in _reasons(cluster, namespace, "after"), PERIOD + MARGIN, "the new replica reported as placed"
        )
        placed = time.monotonic() - bound
        # A stale key goes at the second resync that misses it (by design: one miss may be a list racing
        # a create), so two periods.
        cluster.wait(lambda: stale not in cluster.opted_in(), 2 * PERIOD + MARGIN, "the stale key removed by the resync", interval=1.0)
        resumed = time.monotonic() - back
        holder, renewed = _lease(cluster)  # kept through the outage: its renew deadline outlasts it
        assert holder == identity
        cluster.wait(lambda: _lease(cluster)[0] == identity and _lease(cluster)[1] != renewed, 30, "the Lease renewed again")
        status, text = get(metrics_url(cluster_dir, "/metrics"))
        assert status == 200
        failed = [line for line in text.splitlines() if line.startswith("stormtopo_loop_failures_total{")]
        assert any(float(line.rsplit(" ", 1)[1]) > 0 for line in failed), failed  # the outage shows as failures
        assert "stormtopo_loop_last_success_timestamp_seconds{" in text
        logged = log.read_text(errors="replace")[log_start:]
        assert "Task exception was never retrieved" not in logged and "died" not in logged
        print(
            f"\n  {LONG_OUTAGE_SECONDS:.0f} s outage: {len(looks['leader'])} looks at each /healthz, all 200; after the API came back: "
            f"resync {resync:.0f} s, Warning {warned:.0f} s, ReplicaPlaced {placed:.0f} s after its pods bound, "
            f"stale key gone {resumed:.0f} s"
        )


@pytest.mark.timeout(300)
def test_a_stormservice_watch_refused_for_good_is_not_blind(
    cluster: DevCluster, cluster_dir: Path, topology: Topology, namespace: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The operator as installed, its ServiceAccount allowed to list StormServices but not to watch them
    (a watch refused for good while lists work): a new opted-in StormService's replica is still placed
    within its tier, and /healthz stays 200 and shows kopf's watches. What delivers it here is kopf's own
    retry (each retry of its watch lists again, up to 49 attempts with a growing backoff) or the re-list
    (--relist-seconds), whichever comes first; the re-list's delivery is unit-tested (test_handlers.py)."""
    monkeypatch.setenv(OPERATOR_ARGS_ENV, f"{os.environ.get(OPERATOR_ARGS_ENV, '')} --relist-seconds=3")
    installed = InstalledOperator(cluster_dir, tmp_path / "installed")
    installed.start()
    try:
        roles = [d for d in yaml.safe_load_all(installed.rendered) if d["kind"] == "ClusterRole"]
        role = next(r for r in roles if any(rule.get("resources") == ["stormservices"] for rule in r["rules"]))
        for rule in role["rules"]:
            if rule.get("resources") == ["stormservices"]:
                rule["verbs"] = [v for v in rule["verbs"] if v != "watch"]
        assert kubectl(cluster_dir, "apply", "-f", "-", stdin=yaml.safe_dump(role)).returncode == 0
        installed.restart()
        name = "unwatched"
        cluster.create(stormservice(name, namespace, annotations={MODE: "hard", HIGHEST_TIER: "1"}))
        pods = cluster.bound_pods(namespace, f"storm-service-name={name}", 2, timeout=120)
        leaf = topology.lowest_common_switch([p["spec"]["nodeName"] for p in pods])
        assert leaf is not None and leaf.tier == 1
        status, body = get(metrics_url(cluster_dir, "/healthz"))
        assert status == 200, body
        missed = json.loads(body)["loops"]["kopf-watches"]["missed, delivered by the re-list"]
        print(f"\n  StormService watch refused: the replica placed within tier 1; the re-list delivered {missed or 'nothing'}")
    finally:
        installed.start()  # the chart's RBAC as it was
        installed.stop()


@pytest.mark.timeout(300)
def test_a_stormservice_watch_that_never_answers_is_not_blind(
    cluster: DevCluster, cluster_dir: Path, namespace: str, tmp_path: Path
) -> None:
    """kopf's StormService watch accepted and never answered (a proxy in front of kube-apiserver holds it;
    every other request passes): after its first list kopf delivers no StormService event. A live replica
    whose service then opts in has nothing else that would tell the operator (its RoleSet and pods do not
    change): the re-list (every --relist-seconds) delivers the new version, and the replica's PodGroup gets
    its constraint. /healthz stays 200 and counts what the watch missed."""
    name = "unheard"
    cluster.create(stormservice(name, namespace))
    cluster.bound_pods(namespace, f"storm-service-name={name}", 2)
    proxy = watch_blackhole(cluster_dir, "stormservices", tmp_path / "proxy")
    with proxy as kubeconfig, elected(cluster_dir, 15, f"--kubeconfig={kubeconfig}", "--relist-seconds=3"):
        cluster.patch_stormservice(namespace, name, {"metadata": {"annotations": {MODE: "hard", HIGHEST_TIER: "1"}}})

        def constrained() -> bool:
            groups = cluster.podgroups(namespace)
            return len(groups) == 1 and groups[0]["spec"].get("networkTopology", {}).get("highestTierAllowed") == 1

        cluster.wait(constrained, 60, "the live replica's PodGroup constrained to tier 1")
        status, body = get(metrics_url(cluster_dir, "/healthz"))
        assert status == 200, body
        missed = json.loads(body)["loops"]["kopf-watches"]["missed, delivered by the re-list"]
        assert missed.get("StormService", 0) >= 1, body
    print(f"\n  StormService watch held unanswered: the opt-in of a live service applied; the re-list delivered {missed}")
