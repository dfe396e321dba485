"""The long watch outage: kopf's StormService watch answered 503 for 25 minutes (a proxy in front of
kube-apiserver; every other request passes) while the operator leads. It must never exit nor fail
/healthz (looked at every 2 s), opted-in services created during the outage must be reconciled (kopf's
retries list again, the re-list delivers what they miss), and once the watch answers again a new one must
be reconciled within one resync period.

25 minutes, so it runs only with STORMTOPO_SOAK=1 (`make soak`), never in `make test`.
STORMTOPO_SOAK_OUTAGE_SECONDS shortens it (the run is the same, only shorter).
"""

from __future__ import annotations

import functools
import json
import os
import threading
import time
from pathlib import Path

import pytest

from stormtopo.core.vocabulary import HIGHEST_TIER, MODE
from stormtopo.devenv.client import DevCluster
from stormtopo.devenv.workloads import stormservice
from tests.conftest import TEST_PERIODS
from tests.integration.apiproxy import watch_blackhole
from tests.integration.operators import elected, get, metrics_url, operator_process

pytestmark = [
    pytest.mark.soak,
    pytest.mark.skipif(os.environ.get("STORMTOPO_SOAK") != "1", reason="the soak runs with STORMTOPO_SOAK=1 (make soak)"),
]
OUTAGE_SECONDS = float(os.environ.get("STORMTOPO_SOAK_OUTAGE_SECONDS", "1500"))
CREATE_EVERY = 60.0  # an opted-in StormService created this often during the outage


def constrained(cluster: DevCluster, namespace: str, name: str) -> bool:
    """Its replica's PodGroup (named as its RoleSet) carries the tier-1 constraint."""
    groups = {g["metadata"]["name"]: g for g in cluster.podgroups(namespace)}
    replicas = [groups.get(r["metadata"]["name"]) for r in cluster.rolesets(namespace, name)]
    return len(replicas) == 1 and replicas[0] is not None and replicas[0]["spec"].get("networkTopology", {}).get("highestTierAllowed") == 1


@pytest.mark.timeout(OUTAGE_SECONDS + 600)
def test_a_stormservice_watch_answering_503_for_25_minutes(cluster: DevCluster, cluster_dir: Path, namespace: str, tmp_path: Path) -> None:
    failing = threading.Event()
    failing.set()
    looks: list[int] = []
    stop_looking = threading.Event()
    proxy = watch_blackhole(cluster_dir, "stormservices", tmp_path / "proxy", status=503, blocking=failing)
    with proxy as kubeconfig, elected(cluster_dir, 15, f"--kubeconfig={kubeconfig}", "--relist-seconds=30"):
        operator = operator_process(cluster_dir)

        def look() -> None:
            while not stop_looking.wait(2.0):
                looks.append(get(metrics_url(cluster_dir, "/healthz"))[0])

        looking = threading.Thread(target=look, daemon=True)
        looking.start()
        started, created = time.monotonic(), list[str]()
        while time.monotonic() - started < OUTAGE_SECONDS:
            name = f"during-{len(created)}"
            cluster.create(stormservice(name, namespace, replicas=1, annotations={MODE: "hard", HIGHEST_TIER: "1"}))
            created.append(name)
            time.sleep(min(CREATE_EVERY, max(0.0, OUTAGE_SECONDS - (time.monotonic() - started))))
            assert operator.alive(), "the operator exited during the outage"
        for name in created:  # each within one re-list of its creation at most
            cluster.wait(functools.partial(constrained, cluster, namespace, name), 120, f"{name} constrained during the outage")
        failing.clear()
        back = time.monotonic()
        cluster.create(stormservice("after", namespace, replicas=1, annotations={MODE: "hard", HIGHEST_TIER: "1"}))
        cluster.wait(lambda: constrained(cluster, namespace, "after"), TEST_PERIODS["resync-seconds"] + 60, "a new one after the outage")
        resumed = time.monotonic() - back
        stop_looking.set()
        looking.join()
        body = get(metrics_url(cluster_dir, "/healthz"))[1]
    assert looks and all(code == 200 for code in looks), f"/healthz not 200 at {sum(code != 200 for code in looks)} of {len(looks)} looks"
    missed = json.loads(body)["loops"]["kopf-watches"]["missed, delivered by the re-list"]
    print(
        f"\n  StormService watch answered 503 for {OUTAGE_SECONDS:.0f} s: /healthz 200 at all {len(looks)} looks, "
        f"{len(created)} services created during it all constrained, one after it in {resumed:.1f} s; the re-list delivered {missed}"
    )
