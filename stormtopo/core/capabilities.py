"""What a cluster offers a request: its HyperNodes' tiers and tier names, and the PodGroup fields of
the installed Volcano (read from its CRD schema). The operator and the CLI judge requests alike."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from stormtopo.core.request import ClusterTiers

# The releases COMPATIBILITY.md records as run together on the real control plane (`make compat`): the one
# place in code that holds the tested range (`stormtopo doctor` compares a cluster's against it). Keep the two
# in step (tests/core/test_diagnosis.py reads the table).
TESTED_AIBRIX = ("v0.6.0", "v0.7.0")
TESTED_VOLCANO = ("v1.14.1", "v1.15.0", "v1.15.1")
MIN_VOLCANO = (1, 12)  # PodGroup spec.networkTopology
TIER_NAMES_VOLCANO = (1, 14)  # highestTierName and subGroupPolicy: tier names and nested placement


def cluster_tiers(hypernodes: Iterable[Mapping[str, Any]], podgroup_schema: Mapping[str, Any] | None) -> ClusterTiers:
    """`podgroup_schema`: the PodGroup CRD's openAPIV3Schema; None when unknown (every field assumed)."""
    specs = [h.get("spec") or {} for h in hypernodes]
    tiers = frozenset(t for t in (int(s.get("tier", 0)) for s in specs) if t > 0)
    names = frozenset(str(s["tierName"]) for s in specs if s.get("tierName"))
    tier_of_name = tuple(sorted({(str(s["tierName"]), int(s.get("tier", 0))) for s in specs if s.get("tierName")}))
    if podgroup_schema is None:
        return ClusterTiers(tiers, names, tier_of_name=tier_of_name)
    spec = ((podgroup_schema.get("properties") or {}).get("spec") or {}).get("properties") or {}
    topology = (spec.get("networkTopology") or {}).get("properties") or {}
    defaults = tuple(sorted((field, prop["default"]) for field, prop in topology.items() if "default" in (prop or {})))
    return ClusterTiers(
        tiers,
        names,
        network_topology_defaults=defaults,
        has_network_topology="networkTopology" in spec,  # Volcano >= 1.12
        has_tier_name_field="highestTierName" in topology,  # Volcano >= 1.14
        has_subgroup_policy="subGroupPolicy" in spec,  # Volcano >= 1.14
        tier_of_name=tier_of_name,
    )
