"""Leader loss leaves nothing behind (issue 43, item 5), on the real local control plane: what the leader held
at stormtopo's gate when it died, the next leader lets go.

Two replicas run leader-elected as the chart runs them (tests/integration/operators.py): the cluster's
operator restarted with a Lease of LEASE_SECONDS, and a follower beside it on the same webhook port and
certificate, so that the API server reaches the follower's webhook once the leader is gone (without it, the
admission policy refuses every new pod of the opted-in service, as it must while no stormtopo answers). Four replicas spread over
tier 1 are created; their pods are admitted held at stormtopo's gate (the spread decides each replica's
domain before Volcano sees it), and the leader is SIGKILLed as soon as the first is held, before it lets
all of them go. The follower must take the Lease and release every pod, one replica per leaf.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import pytest

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
