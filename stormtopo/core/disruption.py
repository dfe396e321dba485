"""What a move may take down: the service's own budget, as AIBrix resolves its update strategy
(replica_budget), and a lender's (lender_budget); the PodDisruptionBudgets, as the Eviction API counts
them (_disruption_budgets, _selects); and whether AIBrix is rolling the service out (rollout_under_way),
when a move would take a replica down beyond what either budget counts.
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping, Sequence
from typing import Any

from stormtopo.core.topology.selectors import label_requirements
from stormtopo.core.verdict import Block
from stormtopo.core.vocabulary import REVISION_LABEL


def replica_budget(stormservice: Mapping[str, Any]) -> tuple[int, int]:
    """The service's replicas and how many may be unavailable, as AIBrix resolves its update strategy's
    maxSurge and maxUnavailable (pkg/controller/stormservice/utils.go, ResolveFenceposts): both default
    to 0, a percentage rounds (maxSurge up, maxUnavailable down), and if both come to 0, one may be
    unavailable. A value AIBrix refuses (a string without %, a fraction) leaves none unavailable."""
    spec = stormservice.get("spec") or {}
    replicas = spec.get("replicas", 1)
    replicas = replicas if isinstance(replicas, int) and not isinstance(replicas, bool) and replicas >= 0 else 1
    strategy = spec.get("updateStrategy") or {}
    surge = _scaled(strategy.get("maxSurge"), replicas, round_up=True)
    unavailable = _scaled(strategy.get("maxUnavailable"), replicas, round_up=False)
    if surge is None or unavailable is None:
        return replicas, 0
    if surge == 0 and unavailable == 0:
        unavailable = 1
    return replicas, min(unavailable, replicas)


def lender_budget(stormservice: Mapping[str, Any]) -> tuple[int, int]:
    """A lender's replicas and how many may be unavailable when one moves to make room for another
    service: its own budget (replica_budget, where an unset maxUnavailable resolves to 1), but never
    below max(1, replicas - 1) ready, so at most one, and none for a service with one replica."""
    replicas, budget = replica_budget(stormservice)
    return replicas, max(0, min(budget, replicas - max(1, replicas - 1)))


_PERCENT = re.compile(r"([0-9]+)%")


def _scaled(value: object, total: int, round_up: bool) -> int | None:
    """intstr.GetScaledValueFromIntOrPercent: an int as it is, "<int>%" of `total`; None if refused."""
    if value is None:
        return 0
    if isinstance(value, int) and not isinstance(value, bool):
        return value
    found = _PERCENT.fullmatch(value) if isinstance(value, str) else None
    if found is None:
        return None
    share = int(found.group(1)) * total / 100
    return math.ceil(share) if round_up else math.floor(share)


def _disruption_budgets(budgets: Sequence[Mapping[str, Any]], pods: Sequence[Mapping[str, Any]]) -> tuple[str, Block | None]:
    """Whether evicting `pods` at once is within every PodDisruptionBudget, as the Eviction API counts:
    a pod under more than one budget is refused outright, a budget not yet observed by its controller
    refuses every eviction, and each budget must allow as many disruptions as it covers pods."""
    for pod in pods:
        covering = [b["metadata"]["name"] for b in budgets if _selects(b, pod)]
        if len(covering) > 1:
            return (
                f"pod {pod['metadata']['name']} is covered by PodDisruptionBudgets {', '.join(sorted(covering))}: "
                "the Eviction API refuses a pod under more than one",
                Block.DISRUPTION_BUDGET,
            )
    for pdb in budgets:
        covered = [p for p in pods if _selects(pdb, p)]
        if not covered:
            continue
        status = pdb.get("status") or {}
        name = pdb["metadata"]["name"]
        if int(status.get("observedGeneration") or 0) < int((pdb.get("metadata") or {}).get("generation") or 0):
            return (
                f"PodDisruptionBudget {name} is not yet observed by its controller, and refuses every eviction until it is",
                Block.DISRUPTION_BUDGET,
            )
        allowed = int(status.get("disruptionsAllowed") or 0)
        if allowed < len(covered):
            return (
                f"PodDisruptionBudget {name} allows {allowed} disruptions and moving the replica evicts {len(covered)} of its pods",
                Block.DISRUPTION_BUDGET,
            )
    return "", None


def _selects(pdb: Mapping[str, Any], pod: Mapping[str, Any]) -> bool:
    """Whether a PodDisruptionBudget covers the pod: policy/v1, an empty selector selects every pod of
    its namespace; one Kubernetes would refuse selects none."""
    selector = (pdb.get("spec") or {}).get("selector")
    if selector is None:
        return False
    requirements = label_requirements(selector)
    if requirements is None:
        return False
    labels = (pod.get("metadata") or {}).get("labels") or {}
    return all(r.matches(labels) for r in requirements)


def rollout_under_way(stormservice: Mapping[str, Any], rolesets: Sequence[Mapping[str, Any]] = ()) -> str:
    """What shows AIBrix rolling the StormService out, "" if nothing does: a spec it has not observed
    yet; RoleSets of two revisions (status.currentRevision, which AIBrix v0.7.0 sets to updateRevision
    once no RoleSet of the old one is left); or a RoleSet labelled with another revision than the one
    it updates to (an in-place update relabels every RoleSet at once; a third revision while the second
    rolls out). A move meanwhile would take a replica down beside the ones the rollout replaces, beyond
    what either budget counts. Not updatedReplicas: it dips whenever a pod is re-created, a move's own
    included. A paused service (spec.paused) rolls nothing out: only an unobserved spec counts."""
    status = stormservice.get("status") or {}
    generation = int((stormservice.get("metadata") or {}).get("generation") or 0)
    if int(status.get("observedGeneration") or 0) < generation:
        return f"generation {generation} not yet observed"
    if (stormservice.get("spec") or {}).get("paused"):
        return ""
    current, update = status.get("currentRevision"), status.get("updateRevision")
    if current and update and current != update:
        return f"revision {current} to {update}"
    for roleset in rolesets:
        meta = roleset.get("metadata") or {}
        revision = (meta.get("labels") or {}).get(REVISION_LABEL)
        if update and revision and revision != update:
            return f"RoleSet {meta.get('name')} of revision {revision}, updating to {update}"
    return ""
