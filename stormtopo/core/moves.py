"""Moves by healing, as recorded on the StormService (`stormtopo.io/moves`): each replica's last move,
and while one is under way, the tier its PodGroup is held to.

While a replica moves, its PodGroup asks Volcano for `hard` within the target's tier, whatever the
request's mode: a soft gang is placed one pod at a time, the first by node score alone (Volcano
v1.15.1 allocate.go: no topology score before a pod is placed, ties broken at random), so it could
land on a node it just left in another leaf and be wide again. Hard, Volcano dry-runs the whole gang
in each domain of the tier. The hold ends when the move settles, or after HOLD seconds: a soft replica
then goes wherever there is room, as it did before.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

from stormtopo.core.vocabulary import HEAL_ANNOTATION, MOVES_ANNOTATION

HOLD = 120.0  # seconds a moving replica's gang is held to its target's tier


def heal_annotation_problem(stormservice: Mapping[str, Any], scope_is_roleset: bool) -> str | None:
    """What is wrong with a StormService's stormtopo.io/heal annotation, if anything: healing then stays
    off, and the request's Event says why (a typo must not pass for "off" in silence)."""
    annotations = (stormservice.get("metadata") or {}).get("annotations") or {}
    if HEAL_ANNOTATION not in annotations:
        return None
    value = str(annotations[HEAL_ANNOTATION]).strip().lower()
    if value not in ("true", "false"):
        given = annotations[HEAL_ANNOTATION]
        return f'annotation {HEAL_ANNOTATION}: {given!r} is not understood, healing stays off; accepted: "true" or "false"'
    if value == "true" and not scope_is_roleset:
        return (
            f"annotation {HEAL_ANNOTATION} applies to scope RoleSet only (each replica its own gang); "
            "with scope StormService, healing stays off"
        )
    return None


def recorded_moves(stormservice: Mapping[str, Any]) -> dict[str, Mapping[str, Any]]:
    """The last move of each replica (unreadable: none)."""
    return annotation_table(stormservice, MOVES_ANNOTATION)


def annotation_table(obj: Mapping[str, Any], annotation: str) -> dict[str, Mapping[str, Any]]:
    """A per-replica table stormtopo keeps in an annotation of the StormService (unreadable: empty)."""
    raw = ((obj.get("metadata") or {}).get("annotations") or {}).get(annotation)
    try:
        table = json.loads(raw) if raw else {}
    except ValueError:
        return {}
    if not isinstance(table, dict):
        return {}
    return {str(k): v for k, v in table.items() if isinstance(v, dict)}


def moving_tier(stormservice: Mapping[str, Any] | None, replica: str) -> int | None:
    """The tier a replica's gang is held to while it moves; None when it is not moving."""
    move = recorded_moves(stormservice or {}).get(replica) or {}
    tier = move.get("toTier")
    if move.get("done") or not isinstance(tier, int) or isinstance(tier, bool) or tier < 1:
        return None
    return tier
