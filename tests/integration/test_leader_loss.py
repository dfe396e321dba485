"""Leader loss leaves nothing behind, and a rolling restart refuses nothing, on the real local control
plane: what the leader held at stormtopo's gate when it died, the next leader lets go; a bulk apply of
opted-in StormServices that spans the restart of every replica has none of its creates refused.

Two replicas run leader-elected as the chart runs them (tests/integration/operators.py): the cluster's
operator restarted with a Lease of LEASE_SECONDS, and a follower beside it on the same webhook port and
certificate, so that the API server reaches the follower's webhook once the leader is gone (without it, the
admission policy refuses every new pod of the opted-in service, as it must while no stormtopo answers). Four replicas spread over
tier 1 are created; their pods are admitted held at stormtopo's gate (the spread decides each replica's
domain before Volcano sees it), and the leader is SIGKILLed as soon as the first is held, before it lets
all of them go. The follower must take the Lease and release every pod, one replica per leaf.

The rolling restart is the chart's Deployment of two replicas rolled as Kubernetes rolls it (maxSurge 1,
maxUnavailable 0): a new replica up and ready, then an old one stopped (SIGTERM), twice, the leader last.
Each create of an opted-in StormService goes through stormtopo's gate (a webhook that fails closed for
them), so a replica that stops answering mid-review, or a new one that is ready before it can review,
shows up as a refused create.
"""

from __future__ import annotations

import contextlib
import subprocess
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import yaml

from stormtopo.core.optin import labelled
from stormtopo.core.topology.tree import Topology
from stormtopo.core.vocabulary import DOMAIN_GATE, HIGHEST_TIER, MODE, REPLICA_SPREAD_TIER
from stormtopo.devenv import processes
from stormtopo.devenv.client import DevCluster
from stormtopo.devenv.workloads import stormservice
from tests.conftest import TEST_PERIODS
from tests.integration.chart import provided_certificates
from tests.integration.operators import elected, follower, operator_process

LEASE_SECONDS = 15  # the chart's leaderElection.leaseDurationSeconds


def held(pod: dict[str, Any]) -> bool:
    return any(g.get("name") == DOMAIN_GATE for g in (pod["spec"].get("schedulingGates") or []))


@pytest.mark.timeout(600)
def test_the_next_leader_lets_go_of_what_the_lost_one_held_at_its_gate(
    cluster: DevCluster, cluster_dir: Path, topology: Topology, namespace: str, tmp_path: Path
) -> None:
    name = "lost-leader"
    selector = f"storm-service-name={name}"
    certs = tmp_path / "tls"
    provided_certificates(certs)  # one certificate for 127.0.0.1, served by both replicas
    with elected(cluster_dir, LEASE_SECONDS, f"--cert-dir={certs}") as identity, follower(cluster_dir, identity, shared_webhook=True):
        annotations = {MODE: "hard", HIGHEST_TIER: "1", REPLICA_SPREAD_TIER: "1"}
        cluster.create(stormservice(name, namespace, replicas=4, annotations=annotations))
        cluster.wait(lambda: any(held(p) for p in cluster.pods(namespace, selector)), 90, "a pod held at stormtopo's gate", interval=0.1)
        processes.stop(operator_process(cluster_dir), kill=True)  # the leader, mid-spread
        killed = time.monotonic()
        gated_at_kill = sum(held(p) for p in cluster.pods(namespace, selector))
        # A takeover waits out the Lease; then one resync period, and Volcano's binding.
        bound = cluster.bound_pods(namespace, selector, 8, timeout=LEASE_SECONDS + TEST_PERIODS["resync-seconds"] + 90)
        released = time.monotonic() - killed
    pods = cluster.pods(namespace, selector)
    assert not [p["metadata"]["name"] for p in pods if held(p)], "a pod still held at stormtopo's gate"
    nodes: dict[str, list[str]] = {}
    for pod in bound:
        nodes.setdefault(pod["metadata"]["labels"]["roleset-name"], []).append(pod["spec"]["nodeName"])
    leaves = {replica: topology.lowest_common_switch(on) for replica, on in nodes.items()}
    assert all(leaf is not None and leaf.tier == 1 for leaf in leaves.values()), nodes
    assert len({leaf.name for leaf in leaves.values() if leaf is not None}) == 4, f"not one replica per leaf: {nodes}"
    print(f"\n  leader SIGKILLed with {gated_at_kill} pods held; every pod bound {released:.1f} s later, one replica per leaf")


BULK = 200  # StormServices in one apply


@dataclass(frozen=True)
class Applied:
    started: float
    ended: float
    returncode: int
    stderr: str


@pytest.mark.timeout(600)
def test_a_rolling_restart_during_a_bulk_apply_refuses_none_of_its_opted_in_services(
    cluster: DevCluster, cluster_dir: Path, namespace: str, tmp_path: Path
) -> None:
    certs = tmp_path / "tls"
    provided_certificates(certs)  # one certificate for 127.0.0.1, served by every replica
    kubectl = str(cluster_dir / "bin" / "kubectl")
    request = {MODE: "hard", HIGHEST_TIER: "1"}
    applies: list[Applied] = []
    rolled = threading.Event()

    def apply_in_rounds() -> None:
        # Round after round of BULK new services (replicas 0: nothing for AIBrix to place), until the
        # restart is over and one more round has run whole after it.
        rounds = 0
        while not rolled.is_set() or not applies or applies[-1].started < rolled_at[0]:
            services = [stormservice(f"bulk-{rounds}-{i:03d}", namespace, replicas=0, annotations=request) for i in range(BULK)]
            started = time.monotonic()
            done = subprocess.run([kubectl, "apply", "-f", "-"], input=yaml.safe_dump_all(services), capture_output=True, text=True)
            applies.append(Applied(started, time.monotonic(), done.returncode, done.stderr))
            rounds += 1

    rolled_at = [float("inf")]
    stopped: list[float] = []
    with contextlib.ExitStack() as stack:
        identity = stack.enter_context(elected(cluster_dir, LEASE_SECONDS, f"--cert-dir={certs}"))
        old = stack.enter_context(follower(cluster_dir, identity, shared_webhook=True, replica="old"))
        applying = threading.Thread(target=apply_in_rounds, daemon=True)
        applying.start()
        try:
            cluster.wait(lambda: len(cluster.stormservices(namespace)) >= 20, 60, "the bulk apply under way", interval=0.2)
            # As a Deployment of two rolls (maxSurge 1, maxUnavailable 0): a new replica ready, an old one stopped.
            stack.enter_context(follower(cluster_dir, identity, shared_webhook=True, replica="new-a"))
            processes.stop(old.process)
            stopped.append(time.monotonic())
            stack.enter_context(follower(cluster_dir, identity, shared_webhook=True, replica="new-b"))
            processes.stop(operator_process(cluster_dir))  # the leader, last: it hands its Lease over
            stopped.append(time.monotonic())
            rolled_at[0] = time.monotonic()
            rolled.set()
            applying.join(timeout=300)
            assert not applying.is_alive(), "the bulk apply did not finish within 300 s"
        finally:
            rolled_at[0] = 0.0
            rolled.set()
            applying.join(timeout=300)
        refused = [a.stderr for a in applies if a.returncode != 0]
        assert not refused, f"{len(refused)} of {len(applies)} applies refused creates: {refused[0][-2000:]}"
        assert applies[0].started < stopped[0] and applies[-1].ended > stopped[-1], "the applies did not span the restart"
        names = {s["metadata"]["name"] for s in cluster.stormservices(namespace)}
        assert len(names) == BULK * len(applies), f"{BULK * len(applies) - len(names)} services missing"

        # Every one of them is held by the opt-in label on its role templates, none by a listing (issue 42).
        stored = cluster.stormservices(namespace)
        assert all(labelled(s) for s in stored), [s["metadata"]["name"] for s in stored if not labelled(s)][:5]
        assert not [k for k in cluster.opted_in() if k.startswith(f"{namespace}.")]
    print(f"\n  {len(applies)} applies of {BULK} opted-in StormServices across a rolling restart of both replicas: none refused")
