"""One PodGroup per replica against one PodGroup with subGroupPolicy, for the same request: R replicas,
each within one leaf. Time from StormService creation until every pod is bound (Volcano's work)."""

from __future__ import annotations

import statistics
import time
from typing import Any

from stormtopo.core.vocabulary import HIGHEST_TIER, MODE, REPLICA_HIGHEST_TIER, SCOPE
from stormtopo.devenv.client import DevCluster
from stormtopo.devenv.workloads import Role, stormservice

SMALL_PD = (Role("prefill", gpus=1), Role("decode", gpus=1))
EXPRESSIONS = {
    "podgroup_per_replica": {MODE: "hard", HIGHEST_TIER: "1"},
    "one_podgroup_with_subgroups": {MODE: "hard", HIGHEST_TIER: "3", SCOPE: "StormService", REPLICA_HIGHEST_TIER: "1"},
}


def compare(client: DevCluster, namespace: str, replicas: int, rounds: int) -> dict[str, Any]:
    times: dict[str, list[float]] = {name: [] for name in EXPRESSIONS}
    for r in range(rounds):
        for name, request in EXPRESSIONS.items():  # interleaved: both see the same noise
            svc = f"ex-{r}-{name[:3]}"
            start = time.perf_counter()
            client.create(stormservice(svc, namespace, SMALL_PD, replicas=replicas, annotations=request))
            client.bound_pods(namespace, f"storm-service-name={svc}", 2 * replicas, timeout=300)
            times[name].append(time.perf_counter() - start)
            client.delete_stormservice(namespace, svc)
            selector = f"storm-service-name={svc}"
            client.wait(lambda: not client.pods(namespace, selector), 120, "the pods to go", interval=0.5)  # noqa: B023  (called at once)
    medians = {name: statistics.median(values) for name, values in times.items()}
    return {
        "replicas": replicas,
        "rounds": rounds,
        "bound_s_median": {k: round(v, 2) for k, v in medians.items()},
        "subgroups_vs_per_replica": round(medians["one_podgroup_with_subgroups"] / medians["podgroup_per_replica"], 3),
    }
