"""Whether a replica's pods could run on a node at all, beyond its GPUs: the node's
taints against the pods' tolerations, the pods' nodeSelector and required node affinity against the
node's labels and name, and every other resource the pods request (CPU, memory, RDMA devices ...)
against what the node has left. Healing and making room count a node as room for a replica only if
each of its pods passes here; the GPUs are counted by the packing maths (core/packing.py).

A node that passes may still refuse a pod for reasons this does not model (pod affinity, topology
spread, volumes, ports); Volcano then leaves the moved replica where it cannot land, and the move's
deadline ends its hold (core/moves.py)."""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from fractions import Fraction
from typing import Any

from stormtopo.core.gang import quantity
from stormtopo.core.vocabulary import GPU, HOSTNAME_LABEL

HOSTNAME = "metadata.name"  # the one field a nodeSelectorTerm's matchFields may name


@dataclass(frozen=True)
class NodeFacts:
    """What decides whether a pod may run on a node, GPUs aside: its labels, its taints, and what it has
    left of each resource (milli-units: 500m of CPU is 500, 1 GiB of memory is 1024**3 * 1000)."""

    labels: Mapping[str, str] = field(default_factory=dict)
    taints: tuple[Mapping[str, str], ...] = ()
    left: Mapping[str, int] = field(default_factory=dict)


def milli(value: object) -> int:
    """A quantity in thousandths, rounded up; 0 for what is not one (the API server admits only quantities)."""
    try:
        return math.ceil(quantity(value) * 1000)
    except ValueError:
        return 0


def pod_requests(pod_spec: Mapping[str, Any]) -> dict[str, int]:
    """What a pod asks a node for, per resource in milli-units: its containers' requests summed, or an
    init container's if larger (they run one at a time, before the others), as the scheduler counts."""
    total: dict[str, int] = {}
    for container in pod_spec.get("containers") or []:
        for resource, value in ((container.get("resources") or {}).get("requests") or {}).items():
            total[resource] = total.get(resource, 0) + milli(value)
    for container in pod_spec.get("initContainers") or []:
        for resource, value in ((container.get("resources") or {}).get("requests") or {}).items():
            total[resource] = max(total.get(resource, 0), milli(value))
    return total


def _tolerates(tolerations: Sequence[Mapping[str, Any]], taint: Mapping[str, str]) -> bool:
    for t in tolerations:
        if t.get("effect") and t.get("effect") != taint.get("effect"):
            continue
        if t.get("operator") == "Exists":
            if not t.get("key") or t.get("key") == taint.get("key"):
                return True
        elif t.get("key") == taint.get("key") and str(t.get("value") or "") == str(taint.get("value") or ""):
            return True
    return False


def _expression_holds(expression: Mapping[str, Any], value: str | None) -> bool:
    operator, values = expression.get("operator"), [str(v) for v in expression.get("values") or []]
    if operator == "In":
        return value is not None and value in values
    if operator == "NotIn":
        return value is None or value not in values
    if operator == "Exists":
        return value is not None
    if operator == "DoesNotExist":
        return value is None
    if operator in ("Gt", "Lt") and value is not None and values:
        try:
            have, bound = int(value), int(values[0])
        except ValueError:
            return False
        return have > bound if operator == "Gt" else have < bound
    return False


def _term_holds(term: Mapping[str, Any], name: str, labels: Mapping[str, str]) -> bool:
    expressions = term.get("matchExpressions") or []
    fields = term.get("matchFields") or []
    if not expressions and not fields:
        return False  # an empty term matches no node (the API's rule)
    return all(_expression_holds(e, labels.get(str(e.get("key")))) for e in expressions) and all(
        _expression_holds(f, name if f.get("key") == HOSTNAME else None) for f in fields
    )


def why_not(pod_spec: Mapping[str, Any], name: str, node: NodeFacts, freed: Mapping[str, int] | None = None) -> str:
    """Why a pod of this spec could not run on `node` ("" if it could), GPUs aside; `freed` is what the
    replica's own pods hold there now (free again when it moves)."""
    for taint in node.taints:
        if taint.get("effect") in ("NoSchedule", "NoExecute") and not _tolerates(pod_spec.get("tolerations") or [], taint):
            return f"taint {taint.get('key')}={taint.get('value', '')}:{taint.get('effect')} not tolerated"
    for key, value in (pod_spec.get("nodeSelector") or {}).items():
        if node.labels.get(key) != str(value):
            return f"nodeSelector {key}={value}"
    required = (((pod_spec.get("affinity") or {}).get("nodeAffinity") or {}).get("requiredDuringSchedulingIgnoredDuringExecution")) or {}
    terms = required.get("nodeSelectorTerms") or []
    if terms and not any(_term_holds(t, name, node.labels) for t in terms):
        return "required node affinity"
    for resource, wanted in pod_requests(pod_spec).items():
        if resource == GPU or not wanted:
            continue  # GPUs are the packing maths' (core/packing.py)
        left = node.left.get(resource, 0) + (freed or {}).get(resource, 0)
        if wanted > left:
            return f"{resource}: asks {Fraction(wanted, 1000)}, {Fraction(left, 1000)} left"
    return ""


def without_pins(pod_spec: Mapping[str, Any]) -> Mapping[str, Any]:
    """A pod's spec without node-affinity requirements by node (the hostname label, the metadata.name
    field): those stormtopo adds itself (a released pod kept in its gang's domain, a spread replica kept
    out of its siblings' domains) say where the replica is, not where it could run once moved. A user's
    own pin by hostname is dropped too (rare in a template AIBrix replicates across replicas)."""
    affinity = pod_spec.get("affinity") or {}
    required = ((affinity.get("nodeAffinity") or {}).get("requiredDuringSchedulingIgnoredDuringExecution")) or {}
    terms = required.get("nodeSelectorTerms") or []
    if not terms:
        return pod_spec
    kept = []
    for term in terms:
        expressions = [e for e in term.get("matchExpressions") or [] if e.get("key") != HOSTNAME_LABEL]
        fields = [f for f in term.get("matchFields") or [] if f.get("key") != HOSTNAME]
        if expressions or fields:
            kept.append({**({"matchExpressions": expressions} if expressions else {}), **({"matchFields": fields} if fields else {})})
        else:
            return {**pod_spec, "affinity": {**affinity, "nodeAffinity": {}}}  # a term of pins alone: any node would do
    node_affinity = {**(affinity.get("nodeAffinity") or {}), "requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": kept}}
    return {**pod_spec, "affinity": {**affinity, "nodeAffinity": node_affinity}}


def nodes_for(
    pod_specs: Iterable[Mapping[str, Any]], nodes: Mapping[str, NodeFacts], freed: Mapping[str, Mapping[str, int]] | None = None
) -> frozenset[str]:
    """The nodes every one of these pods could run on, GPUs aside (each pod of a replica may land on any
    node of its domain: a node counts only if all of them could run there). `freed`: per node, what
    the replica's own pods hold there now."""
    specs = list(pod_specs)
    return frozenset(
        name for name, facts in nodes.items() if all(not why_not(spec, name, facts, (freed or {}).get(name)) for spec in specs)
    )
