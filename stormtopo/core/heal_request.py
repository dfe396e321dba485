"""Which StormServices heal, and within which tier: a service's opt-in (wants_healing), the tier its
replicas must be within (tier_to_heal), and whether what the index holds makes it worth a healing pass
(may_need_healing).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from stormtopo.core.explanation import allowed_tier
from stormtopo.core.moves import annotation_table, asks_healing, recorded_moves
from stormtopo.core.request import ClusterTiers, Scope, valid_request
from stormtopo.core.topology.tree import Topology
from stormtopo.core.vocabulary import PLACEMENT_ANNOTATION


def wants_healing(stormservice: Mapping[str, Any]) -> bool:
    return asks_healing(stormservice)


def may_need_healing(stormservice: Mapping[str, Any], tiers: ClusterTiers, topology: Topology) -> bool:
    """Whether a StormService is worth a healing pass, from what the index holds (no API read): it opted
    in with a valid request, and its placement record shows a replica above its tier, or a move of
    one of its replicas has not settled yet."""
    tier = tier_to_heal(stormservice, tiers, topology, opted_in_only=True)
    if tier is None:
        return False
    if any(not move.get("done") for move in recorded_moves(stormservice).values()):
        return True
    return any(
        not isinstance(r.get("tier"), int) or r["tier"] > tier for r in annotation_table(stormservice, PLACEMENT_ANNOTATION).values()
    )


def tier_to_heal(stormservice: Mapping[str, Any], tiers: ClusterTiers, topology: Topology, opted_in_only: bool) -> int | None:
    """The tier a replica of this service must be within, if healing applies to it at all."""
    if opted_in_only and not wants_healing(stormservice):
        return None
    request = valid_request(stormservice, tiers)
    if request is None or request.scope is not Scope.ROLESET:
        return None
    return allowed_tier(request, topology)  # None: soft with no tier, any placement is within it
