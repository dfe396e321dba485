"""The long brownout: kube-apiserver accepts connections and answers nothing (SIGSTOP) for 4 minutes, past
every loop's hang limit (180 s) and the Lease, while ten StormServices that ask for healing are in a
healing pass and two of their replicas are moving. The operator runs as the chart runs it.

It must never exit nor fail /healthz (looked at every 2 s); once the API server answers again, healing must
pass again within a minute, the moves under way must end with both replicas in one leaf, and never more
than the cap's two moves may be under way at once, before, during or after.

Four minutes of a stopped API server, so it runs only with STORMTOPO_SOAK=1 (`make soak`), never in `make
test` (which has the 25 s brownout of test_day_two_restart.py). STORMTOPO_SOAK_BROWNOUT_SECONDS shortens it.
"""

from __future__ import annotations

import os
import threading
import time
from pathlib import Path

import pytest

from stormtopo.core.topology.tree import Topology
from stormtopo.devenv.client import DevCluster
from stormtopo.devenv.workloads import stormservice
from tests.integration.faults import apiserver_brownout
from tests.integration.healing_cluster import (  # noqa: F401 (as_installed: the fixture every test here uses)
    BIG,
    HEAL,
    MOVE_WITHIN,
    SOFT_LEAF,
    as_installed,
    fill,
    free,
    healing_passes,
    in_one_leaf,
    move_records,
    replicas,
    wide_placement,
)
from tests.integration.operators import get, metrics_url, operator_process

pytestmark = [
    pytest.mark.soak,
    pytest.mark.usefixtures("as_installed"),
    pytest.mark.skipif(os.environ.get("STORMTOPO_SOAK") != "1", reason="the soak runs with STORMTOPO_SOAK=1 (make soak)"),
]
BROWNOUT_SECONDS = float(os.environ.get("STORMTOPO_SOAK_BROWNOUT_SECONDS", "240"))
RESUME_WITHIN = 60.0  # from the API server's return to the next healing pass: a Lease taken back, then a period
CAP = 2  # the chart's healing.maxMoving


@pytest.mark.timeout(BROWNOUT_SECONDS + 900)
def test_a_four_minute_brownout_in_the_middle_of_a_healing_pass(
    cluster: DevCluster, cluster_dir: Path, grown: Topology, namespace: str
) -> None:
    wide = [f"wide{i}-{namespace}" for i in range(4)]
    idle = [f"idle{i}-{namespace}" for i in range(6)]  # ask for healing with nothing to move: read every pass
    full = ["x8", "x9", "x10", "x11"]  # leaves t4 and t5
    fill(cluster, namespace, ["node0", "node2", "node4", "node6", "x0", "x2", "x4", "x6", *full])
    for name in wide:  # each takes two free nodes of two leaves
        cluster.create(stormservice(name, namespace, roles=BIG, annotations={**SOFT_LEAF, **HEAL}))
        wide_placement(cluster, grown, namespace, name)
    for name in idle:
        cluster.create(stormservice(name, namespace, replicas=0, annotations={**SOFT_LEAF, **HEAL}))
    operator = operator_process(cluster_dir)
    looks: list[int] = []
    under_way: list[int] = []  # moves not settled, at each look the API server answered
    stop = threading.Event()

    def look() -> None:
        while not stop.wait(2.0):
            looks.append(get(metrics_url(cluster_dir, "/healthz"))[0])

    def count_moves() -> None:
        while not stop.wait(0.5):
            try:
                listed = cluster.stormservices(namespace)
            except Exception:  # the API server stopped: nothing to count
                continue
            under_way.append(sum(1 for s in listed for m in move_records(s).values() if not m.get("done")))

    threads = [threading.Thread(target=look, daemon=True), threading.Thread(target=count_moves, daemon=True)]
    for thread in threads:
        thread.start()
    try:
        for node in full:  # two leaves free at once: two replicas may move
            free(cluster, namespace, node)
        cluster.wait(lambda: any(under_way), MOVE_WITHIN, "a move under way")
        apiserver_brownout(cluster_dir, BROWNOUT_SECONDS)
        back, passes = time.monotonic(), healing_passes(cluster_dir)  # (passes end during it, until the Lease goes)
        assert operator.alive(), "the operator exited during the brownout"
        cluster.wait(lambda: healing_passes(cluster_dir) > passes, RESUME_WITHIN, "a healing pass after the API server's return")
        resumed = time.monotonic() - back

        def landed() -> list[str]:
            records = {n: move_records(cluster.stormservice(namespace, n)) for n in wide}
            done = [n for n, moves in records.items() if any(m.get("done") and m.get("landed") for m in moves.values())]
            return done if len(done) >= 2 else []

        moved = cluster.wait(landed, 4 * MOVE_WITHIN + 60, "two replicas moved into the freed leaves")
        settled = time.monotonic() - back
    finally:
        stop.set()
        for thread in threads:
            thread.join()
    assert operator.alive(), "the operator exited"
    assert looks and all(code == 200 for code in looks), f"/healthz not 200 at {sum(code != 200 for code in looks)} of {len(looks)} looks"
    assert max(under_way) <= CAP, f"{max(under_way)} moves under way at once with a cap of {CAP}"
    assert all(in_one_leaf(grown, pods) for name in moved for pods in replicas(cluster, namespace, name).values())
    print(
        f"\n  kube-apiserver stopped {BROWNOUT_SECONDS:.0f} s with a move under way, 10 healing services: /healthz 200 at "
        f"all {len(looks)} looks; healing passed again {resumed:.1f} s after the return; two moves landed "
        f"{settled:.1f} s after it; at most {max(under_way)} under way at once"
    )
