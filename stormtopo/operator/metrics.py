"""Prometheus metrics of the operator, served on its plain-HTTP metrics port with /readyz."""

from __future__ import annotations

from prometheus_client import Counter, Gauge, Histogram

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
    "Time to explain one pending gang in the explanation worker, its free-GPU reading included",
    buckets=(0.01, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 120),
)
OBSERVED = Counter(
    "stormtopo_observed_objects_total",
    "Watch events and listed objects the index recorded, by kind: what the operator's CPU follows",
    ["kind"],
)
HEALING_PASSES = Counter("stormtopo_healing_passes_total", "Healing passes over the StormServices (by the leader)")
REPLICA_MOVES = Counter("stormtopo_replica_moves_total", "Replicas moved into one domain by healing, by why", ["reason"])
EVICTIONS = Counter("stormtopo_evictions_total", "Pods evicted through the Eviction API to move their replica")
EVICTIONS_REFUSED = Counter("stormtopo_evictions_refused_total", "Evictions the API server refused (a PodDisruptionBudget)")
MOVE_UNAVAILABLE_SECONDS = Histogram(
    "stormtopo_move_unavailable_seconds",
    "From a replica's move to all of its pods ready again",
    buckets=(1, 2, 5, 10, 30, 60, 120, 300, 600),
)
