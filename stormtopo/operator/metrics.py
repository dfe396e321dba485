"""Prometheus metrics of the operator, served on its plain-HTTP metrics port with /readyz.

The chart's alerts and dashboard (deploy/helm/stormtopo/files) query these names; the integration test
tests/integration/test_prometheus.py checks every one of those queries against a real scrape.
"""

from __future__ import annotations

import asyncio
import gc
import time
from collections.abc import Callable, Iterator

from prometheus_client import REGISTRY, Counter, Gauge, Histogram
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from stormtopo.core.verdict import Why
from stormtopo.operator import collector
from stormtopo.operator.loops import Loop, Loops

ADMISSION_SECONDS = Histogram(
    "stormtopo_admission_seconds",
    "Time to answer one admission review",
    ["kind"],
    buckets=(0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0),
)
PODGROUP_WRITES = Counter("stormtopo_podgroup_writes_total", "PodGroups created or patched by the operator", ["verb"])
INVALID_REQUESTS = Gauge("stormtopo_invalid_requests", "Opted-in StormServices whose annotations are invalid")
PENDING_GANGS = Gauge("stormtopo_pending_gangs", "Replicas whose hard request no domain can hold right now")
REPLICAS_BY_TIER = Counter("stormtopo_replicas_placed_total", "Replicas placed, by the tier of their lowest common HyperNode", ["tier"])
PLACEMENT_SECONDS = Histogram(
    "stormtopo_placement_seconds",
    "From a replica's first pod creation to its last pod's binding",
    buckets=(0.5, 1, 2, 5, 10, 30, 60, 120, 300, 600),
)
TOPOLOGY_VIOLATIONS = Counter("stormtopo_topology_violations_total", "Hard replicas found spanning more than their tier allows")
QUEUE_DEPTH = Gauge("stormtopo_workqueue_depth", "Keys waiting to be reconciled", ["queue"])
EXPLANATION_SECONDS = Histogram(
    "stormtopo_explanation_seconds",
    "Time to explain one pending gang in the explanation worker (the packing search over the free-room reading)",
    buckets=(0.01, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 120),
)
OBSERVED = Counter(
    "stormtopo_observed_objects_total",
    "Watch events and listed objects the index recorded, by kind: what the operator's CPU follows",
    ["kind"],
)
WATCH_BEHIND = Gauge(
    "stormtopo_watch_behind",
    "1 while the last two re-lists of a kind both found objects its watch had not delivered: kopf's watch of it refused or "
    "failing while lists work, its changes reaching stormtopo only at each re-list",
    ["kind"],
)
WATCH_MISSED = Counter(
    "stormtopo_watch_missed_total",
    "StormServices, RoleSets and HyperNodes a re-list found that their watch had not delivered (a watch down while lists work)",
    ["kind"],
)
HEALING_PASSES = Counter("stormtopo_healing_passes_total", "Healing passes over the StormServices (by the leader)")
REPLICA_MOVES = Counter("stormtopo_replica_moves_total", "Replicas moved into one domain by healing, by why", ["reason"])
EVICTIONS = Counter("stormtopo_evictions_total", "Pods evicted through the Eviction API to move their replica")
PREEMPTIONS = Counter(
    "stormtopo_preemptions_total",
    "Pods of lower priority evicted for a held replica, the fewest that make room for it (--exact-preemption)",
)
HEALING_WRITES_REFUSED = Counter(
    "stormtopo_healing_writes_refused_total",
    "Writes of healing refused by RBAC or an admission policy (a move's record, an eviction): nothing moves; a Warning says why",
    ["write"],
)
for _write in ("record", "eviction"):
    HEALING_WRITES_REFUSED.labels(_write)
EVICTIONS_REFUSED = Counter("stormtopo_evictions_refused_total", "Evictions the API server refused (a PodDisruptionBudget)")
MOVE_UNAVAILABLE_SECONDS = Histogram(
    "stormtopo_move_unavailable_seconds",
    "From a replica's move to all of its pods ready again",
    buckets=(1, 2, 5, 10, 30, 60, 120, 300, 600),
)
NODE_TIER_WRITES = Counter(
    "stormtopo_node_tier_writes_total",
    "HyperNode writes that keep the node tier's short list current (--node-tier), by verb: create, update (a leaf), delete",
    ["verb"],
)
NODE_TIER_WRITES_REFUSED = Counter(
    "stormtopo_node_tier_writes_refused_total",
    "HyperNode writes of the node tier the API server refused (Volcano's webhook down, a policy, RBAC), by verb",
    ["verb"],
)
for _verb in ("create", "update", "delete"):
    NODE_TIER_WRITES.labels(_verb)
    NODE_TIER_WRITES_REFUSED.labels(_verb)
LEADER = Gauge("stormtopo_leader", "1 while this replica holds the Lease and reconciles (always 1 without leader election)")
EXPLANATIONS = Counter(
    "stormtopo_explanations_total",
    "Explanations of pending gangs by outcome: exact; out_of_budget, the packing search ran out of its step"
    " budget and first-fit answered (its no may be wrong); timed_out, no answer within the explainer's timeout",
    ["outcome"],
)
EXPLANATION_OUTCOMES = ("exact", "out_of_budget", "timed_out")

# Every known label value from the start: a series that appears only at its first event would leave
# rate() and increase() without a base, and alerts and dashboards with no series until then.
for _outcome in EXPLANATION_OUTCOMES:
    EXPLANATIONS.labels(_outcome)
for _verb in ("create", "patch"):
    PODGROUP_WRITES.labels(_verb)
EVENT_LOOP_LAG = Histogram(
    "stormtopo_event_loop_lag_seconds",
    "How late the event loop woke a timer: the webhooks, the gate and /healthz share the loop, so a stall holds their answers as long",
    buckets=(0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0),
)
LAG_TICK = 0.05  # seconds between two looks at the event loop's lag
for _kind in ("pod", "podgroup", "stormservice"):
    ADMISSION_SECONDS.labels(_kind)
for _why in Why:
    REPLICA_MOVES.labels(str(_why))


class LoopHealth(Collector):
    """Each background loop, as metrics read at scrape time: stuck (1 while /healthz says it is: its task
    ended or an iteration hangs), when it last succeeded, and its failures. /healthz makes the kubelet
    restart a stuck replica; a loop that fails for a reason outside stormtopo (the API server down, a
    webhook or a policy refusing) is not stuck, and StormtopoLoopFailing alerts on its last success."""

    def __init__(self, wall_clock: Callable[[], float] = time.time) -> None:
        self.loops: Loops | None = None
        self.wall_clock = wall_clock

    def collect(self) -> Iterator[Metric]:
        stuck = GaugeMetricFamily("stormtopo_loop_stuck", "1 while a background loop is stuck or dead, as /healthz says", labels=["loop"])
        failures = GaugeMetricFamily("stormtopo_loop_consecutive_failures", "Failures of a loop since its success", labels=["loop"])
        total = CounterMetricFamily("stormtopo_loop_failures", "Failed iterations of a loop since the process started", labels=["loop"])
        succeeded = GaugeMetricFamily(
            "stormtopo_loop_last_success_timestamp_seconds",
            "When a loop last succeeded (Unix time); the process's start time until its first success",
            labels=["loop"],
        )
        if self.loops is not None:
            now, wall = self.loops.clock(), self.wall_clock()
            for name, loop in sorted(self.loops.loops.items()):
                stuck.add_metric([name], 0.0 if loop.problem(now) is None else 1.0)
                failures.add_metric([name], float(loop.failures))
                total.add_metric([name], float(loop.failures_total))
                # A loop that never succeeded counts from its start, so the alert's age grows from there.
                last = loop.last_success if loop.last_success is not None else loop.started
                succeeded.add_metric([name], wall - (now - last))
            for name, probe in sorted(self.loops.probes.items()):  # the work queues: stuck only
                stuck.add_metric([name], 0.0 if probe(self.loops.hang) is None else 1.0)
        yield stuck
        yield failures
        yield total
        yield succeeded


LOOPS = LoopHealth()
REGISTRY.register(LOOPS)


class CollectorPasses(Collector):
    """The garbage collector's passes (operator/collector.py), read at scrape time: a pass holds the event loop for
    as long as it takes, so the longest is a stall every webhook answer in flight waited out."""

    def collect(self) -> Iterator[Metric]:
        passes = collector.PASSES
        about = "The longest pass of the garbage collector since the process started, per generation"
        longest = GaugeMetricFamily("stormtopo_gc_longest_pass_seconds", about, labels=["generation"])
        for generation, seconds in enumerate(passes.longest):
            longest.add_metric([str(generation)], seconds)
        yield longest
        freezes = "Full passes longer than the limit, after which what survived was frozen out of later passes"
        frozen = "Objects frozen out of the collector's passes (gc.get_freeze_count): grows with the cluster, not with time"
        yield CounterMetricFamily("stormtopo_gc_freezes", freezes, passes.freezes)
        yield GaugeMetricFamily("stormtopo_gc_frozen_objects", frozen, gc.get_freeze_count())


REGISTRY.register(CollectorPasses())


def watch(loops: Loops, leading: Callable[[], bool]) -> None:
    """Export the operator's loops and whether it leads, both read at each scrape as /healthz reads them."""
    LOOPS.loops = loops
    LEADER.set_function(lambda: float(leading()))


async def measure_event_loop_lag(loop: Loop) -> None:
    """Forever: sleep LAG_TICK and record how much later than asked the event loop woke (a handler that did
    not yield held it that long). Supervised by the operator's loops like the others."""
    clock = asyncio.get_running_loop().time
    while True:
        asked = clock()
        await asyncio.sleep(LAG_TICK)
        EVENT_LOOP_LAG.observe(max(0.0, clock() - asked - LAG_TICK))
        loop.succeeded()
