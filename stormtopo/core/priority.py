"""A replica's priority, as Volcano must see it: on its PodGroup.

Volcano ranks and preempts jobs by the PodGroup's `spec.priorityClassName` alone (v1.15.1: a job's
priority is its PodGroup's class, or the cluster's default class; the pods' own classes only order
tasks within one job). AIBrix copies a class onto the PodGroup only from the RoleSet's
`volcanoSchedulingStrategy.priorityClassName`; roles that set `priorityClassName` in their pod
templates leave the PodGroup without one, and the gang then ranks below the batch work it should
displace. stormtopo gives the PodGroup the class its pods run at: AIBrix's own setting where it has
one (it writes that itself on every sync), else the roles' class, the highest by value where roles
differ (a gang is placed whole: it is worth what its most important pod is worth).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

# In the priority values (every PriorityClass's, by name): the cluster's default under this key, the value of
# the globalDefault class (0 without one). Volcano ranks a job whose PodGroup names no class, or one that does
# not exist, at it. No class is named "" (Kubernetes requires a name).
DEFAULT_CLASS = ""


def priority_values(classes: Iterable[Mapping[str, Any]]) -> dict[str, int]:
    """Every PriorityClass's value by name, as listed, and the cluster's default under DEFAULT_CLASS: the
    globalDefault class's value (the highest, should several claim it), 0 without one."""
    values = {str(c["metadata"]["name"]): int(c.get("value") or 0) for c in classes}
    default = max((int(c.get("value") or 0) for c in classes if c.get("globalDefault")), default=0)
    return {DEFAULT_CLASS: default, **values}


def job_priority(priority_class: str, values: Mapping[str, int]) -> int:
    """The priority Volcano ranks a job at: its PodGroup's class's value, else the cluster's default."""
    return values.get(priority_class, values.get(DEFAULT_CLASS, 0))  # ("" is DEFAULT_CLASS itself)


def strategy_priority_class(roleset_spec: Mapping[str, Any]) -> str | None:
    """The class AIBrix's scheduling strategy names for the replica's PodGroup, if any."""
    strategy = (roleset_spec.get("schedulingStrategy") or {}).get("volcanoSchedulingStrategy") or {}
    name = strategy.get("priorityClassName") if isinstance(strategy, Mapping) else None
    return name if isinstance(name, str) and name else None


def role_priority_classes(roleset_spec: Mapping[str, Any]) -> frozenset[str]:
    """The priority classes the replica's roles give their pods."""
    classes = set()
    for role in roleset_spec.get("roles") or []:
        name = (((role or {}).get("template") or {}).get("spec") or {}).get("priorityClassName")
        if isinstance(name, str) and name:
            classes.add(name)
    return frozenset(classes)


def replica_priority(roleset_spec: Mapping[str, Any], values: Mapping[str, int]) -> int:
    """The priority Volcano gives the replica's gang: its class's value (the cluster's default without a class,
    or with one whose value is not known: the globalDefault class's value, 0 without one)."""
    return job_priority(replica_priority_class(roleset_spec, values) or "", values)


def known_replica_priority(roleset_spec: Mapping[str, Any], values: Mapping[str, int]) -> int | None:
    """replica_priority, or None while its class is named but its value not read yet (a class created a
    moment ago): better to say nothing of preemption than to rank the gang at 0."""
    name = replica_priority_class(roleset_spec, values)
    if name is not None and name not in values:
        return None
    return replica_priority(roleset_spec, values)


def replica_priority_class(roleset_spec: Mapping[str, Any], values: Mapping[str, int]) -> str | None:
    """The class a replica's PodGroup carries: AIBrix's strategy's, else the roles' (the highest by
    value where they differ; a class whose value is unknown ranks below every known one, then by
    name, so that every replica of the operator chooses the same). None: no class anywhere, Volcano
    then uses the cluster's default class as it would without stormtopo."""
    named = strategy_priority_class(roleset_spec)
    if named is not None:
        return named
    classes = role_priority_classes(roleset_spec)
    if not classes:
        return None
    return max(sorted(classes), key=lambda name: (name in values, values.get(name, 0)))
