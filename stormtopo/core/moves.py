"""Moves by healing, as recorded on the StormService (`stormtopo.io/moves`): each replica's last move,
and while one is under way, the tier its PodGroup is held to.

While a replica moves, its PodGroup asks Volcano for `hard` within the target's tier, whatever the
request's mode: a soft gang is placed one pod at a time, the first by node score alone (Volcano
v1.15.1 allocate.go: no topology score before a pod is placed, ties broken at random), so it could
land on a node it just left in another leaf and be wide again. Hard, Volcano dry-runs the whole gang
in each domain of the tier. The healer settles the move (and so ends the hold) once the replica is
ready on new pods, or, still not bound HOLD seconds after the move, once its new pods are pending: a
soft replica then goes wherever there is room, as it did before.

Every hold ends, whatever the healer does or sees afterwards (it only settles the moves of services
still asking for healing, and its write may be refused): the reconciler and the admission webhook
hold a PodGroup only while its StormService still asks for healing (`stormtopo.io/heal: "true"`,
scope RoleSet, a valid request) and for at most MOVE_DEADLINE seconds after the move began, by the
time recorded in the move (`at`) against the clock their shell passes in.
"""

from __future__ import annotations

import datetime
import json
from collections.abc import Mapping
from typing import Any

from stormtopo.core.request import Mode, Scope, TopologyRequest, network_topology_of, recorded_request
from stormtopo.core.switches import switch_problem, switched_on
from stormtopo.core.vocabulary import HEAL_ANNOTATION, MOVES_ANNOTATION, REQUEST_ANNOTATION, SCOPE

# A move record's version ("v"): 2 names the wide replica it makes room for as data ({"namespace",
# "stormService", "replica"}); records without one (the release before) named it in a sentence, still read.
MOVE_RECORD_VERSION = 2
HOLD = 120.0  # seconds: a moving gang still not bound this long after its move is let go (the healer settles it)
CLOCK_SKEW = 60.0  # seconds a move's recorded start may be ahead of the reader's clock (replicas' clocks differ)
MOVE_DEADLINE = 600.0  # seconds: a move not settled by then no longer holds its gang, nor the service's other replicas back


def asks_healing(stormservice: Mapping[str, Any] | None) -> bool:
    """`stormtopo.io/heal: "true"` (core/switches.py): the service lets stormtopo move its replicas."""
    return switched_on(stormservice, HEAL_ANNOTATION)


def heal_annotation_problem(stormservice: Mapping[str, Any], scope_is_roleset: bool) -> str | None:
    """What is wrong with a StormService's stormtopo.io/heal annotation, if anything: healing then stays
    off, and the request's Event says why (a typo must not pass for "off" in silence)."""
    problem = switch_problem(stormservice, HEAL_ANNOTATION)
    if problem is not None:
        return problem
    if asks_healing(stormservice) and not scope_is_roleset:
        return (
            f"annotation {HEAL_ANNOTATION} applies to scope RoleSet only (each replica its own gang); "
            "with scope StormService, healing stays off"
        )
    return None


def recorded_moves(stormservice: Mapping[str, Any]) -> dict[str, Mapping[str, Any]]:
    """The last move of each replica (unreadable: none). Every version is counted (a later release's record, after a
    rollback, still holds room and counts against the cap until its deadline); each field is read as this release
    knows it."""
    return annotation_table(stormservice, MOVES_ANNOTATION)


def annotation_table(obj: Mapping[str, Any], annotation: str) -> dict[str, Mapping[str, Any]]:
    """A per-replica table stormtopo keeps in an annotation of the StormService (unreadable: empty)."""
    raw = ((obj.get("metadata") or {}).get("annotations") or {}).get(annotation)
    try:
        table = json.loads(raw) if raw else {}
    except (ValueError, RecursionError):  # its owner may write anything here ("[" * 200,000 recurses)
        return {}
    if not isinstance(table, dict):
        return {}
    return {str(k): v for k, v in table.items() if isinstance(v, dict)}


def moving_tier(stormservice: Mapping[str, Any] | None, replica: str, now: float | None = None) -> int | None:
    """The tier a replica's gang is held to while it moves; None when it is not moving, or no longer held.

    Held only while the move is unsettled, the StormService still asks for healing (`stormtopo.io/heal`
    exactly "true", not removed, "false" or a typo; its scope RoleSet), and, given the clock `now`
    (seconds), no more than MOVE_DEADLINE seconds after the move began. The caller passes only a valid
    RoleSet-scoped request (an invalid one: see released_topology). `now` None judges no deadline: the
    reconciler and the admission webhook must both pass a clock or neither, or one holds what the
    other lets go and each undoes the other's write."""
    annotations = ((stormservice or {}).get("metadata") or {}).get("annotations") or {}
    if not asks_healing(stormservice):
        return None
    if str(annotations.get(SCOPE, Scope.ROLESET.value)).strip() != Scope.ROLESET.value:
        return None
    move = recorded_moves(stormservice or {}).get(replica) or {}
    tier = _held_to(move)
    if move.get("done") or tier is None:
        return None
    if now is not None:
        began = recorded_seconds(move.get("at"))
        if began is None or not -CLOCK_SKEW <= now - began <= MOVE_DEADLINE:
            # No start to count from, past its deadline, or written by a clock far ahead (a leader whose
            # clock was wrong would otherwise hold it for as long as it was ahead): the hold is over.
            return None
    return tier


def _held_to(move: Mapping[str, Any]) -> int | None:
    tier = move.get("toTier")
    return tier if isinstance(tier, int) and not isinstance(tier, bool) and tier >= 1 else None


def released_topology(
    podgroup: Mapping[str, Any] | None,
    stormservice: Mapping[str, Any] | None,
    replica: str,
    defaults: tuple[tuple[str, object], ...] = (),
) -> dict[str, object] | None:
    """While a StormService's request is invalid, "the last valid request stays applied": but a hold is
    no request, and must not stay. For a replica's PodGroup that a move holds (its record names a
    target tier, settled or not: a service whose request is invalid asks for no healing, and the healer
    no longer looks at it) and that carries the hold (hard within exactly that tier), the networkTopology
    its last valid request asks, as the PodGroup records it in `stormtopo.io/request` (set from the
    request, never from the hold, on every write the admission webhook sees). None when it is not held,
    already let go, or that record cannot be read back: the PodGroup is then left as it is, rather than
    given a topology guessed from nothing."""
    move = recorded_moves(stormservice or {}).get(replica) or {}
    tier = _held_to(move)
    topology = ((podgroup or {}).get("spec") or {}).get("networkTopology")
    if tier is None or not isinstance(topology, Mapping):
        return None
    if topology.get("mode") != Mode.HARD.value or topology.get("highestTierAllowed") != tier or "highestTierName" in topology:
        return None
    # The PodGroup's own record first: it follows every valid change of the request, also one made while
    # the replica moved. The move's record of the request as it began, where that cannot be read.
    recorded = ((podgroup or {}).get("metadata") or {}).get("annotations") or {}
    request = recorded_request(recorded.get(REQUEST_ANNOTATION), defaults)
    asked = recorded_topology(move.get("request"))
    if request is not None:
        wanted: dict[str, object] = request.network_topology()
    elif asked is not None:
        wanted = {**dict(defaults), **asked}
    else:
        return None
    return wanted if wanted != dict(topology) else None


def request_topology(request: TopologyRequest) -> dict[str, object]:
    """What a move records of the replica's request: its mode and tier as the PodGroup asks them."""
    return network_topology_of(request.mode, request.limit)


def recorded_topology(recorded: object) -> dict[str, object] | None:
    """A move's record of its replica's request, if it is one request_topology writes: a mode, and a tier
    number (1 or more) or a tier name (soft may have neither), nothing else. A record its owner edited into
    anything else is not read."""
    if not isinstance(recorded, Mapping) or recorded.get("mode") not in (Mode.HARD.value, Mode.SOFT.value):
        return None
    if set(recorded) - {"mode", "highestTierAllowed", "highestTierName"}:
        return None
    tier, name = recorded.get("highestTierAllowed"), recorded.get("highestTierName")
    if tier is not None and name is not None:
        return None
    if tier is None and name is None:
        return {"mode": Mode.SOFT.value} if recorded["mode"] == Mode.SOFT.value else None
    if tier is not None and not (isinstance(tier, int) and not isinstance(tier, bool) and tier >= 1):
        return None
    if name is not None and not (isinstance(name, str) and name):
        return None
    return dict(recorded)


def recorded_time(seconds: float) -> str:
    """A time as stormtopo records it ("2027-01-15T08:00:00Z"), read back by recorded_seconds."""
    return datetime.datetime.fromtimestamp(seconds, datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def recorded_seconds(text: object) -> float | None:
    """A time stormtopo recorded ("2027-01-15T08:00:00Z") in seconds; None if there is none or it is unreadable."""
    if not isinstance(text, str) or not text:
        return None
    try:
        return datetime.datetime.fromisoformat(text.replace("Z", "+00:00")).timestamp()
    except ValueError:
        return None
