"""Stranded replicas: a hard replica with a pod Pending past --heal-stranded-after (STRANDED_AFTER) in a
domain that cannot hold it, its other pods running, as Volcano keeps a gang with a running pod in its
HyperNode. Here, since when a replica's pods have waited (pending_since); whether another
domain within its tier holds it whole, and what is done about it, is healing's (core/healing.py,
Why.STRANDED and plan_stranded).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from stormtopo.core.moves import recorded_seconds

STRANDED_AFTER = 300.0  # seconds a pod of a hard replica waits, its other pods running, before the replica is stranded


def pending_since(pods: Sequence[Mapping[str, Any]]) -> float | None:
    """Of one replica's live pods: since when the longest-waiting unbound one has been found
    unschedulable by the scheduler (its PodScheduled condition False), if another is bound (a gang with
    a running pod is kept in its domain by Volcano); None otherwise. A pod held at a scheduling gate
    (stormtopo's own: a router, a spread replica not let go yet) is not waiting for room."""
    bound = [p for p in pods if (p.get("spec") or {}).get("nodeName")]
    waiting = [t for p in pods if (t := _unschedulable_since(p)) is not None]
    return min(waiting) if bound and waiting else None


def _unschedulable_since(pod: Mapping[str, Any]) -> float | None:
    spec, meta = pod.get("spec") or {}, pod.get("metadata") or {}
    if spec.get("nodeName") or spec.get("schedulingGates") or meta.get("deletionTimestamp"):
        return None
    for condition in (pod.get("status") or {}).get("conditions") or []:
        if condition.get("type") == "PodScheduled" and condition.get("status") == "False" and condition.get("reason") != "SchedulingGated":
            return recorded_seconds(condition.get("lastTransitionTime"))
    return None
