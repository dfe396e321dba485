"""A soft replica that must preempt is held `hard` within one tier while Volcano preempts for it.

Volcano v1.15.1's gangpreempt treats a soft job as one without a topology: it adds victims anywhere in the
cluster, in priority order, until the gang fits, and takes them all (on the local control plane, six batch
pods on nodes of two leaves where one leaf's four were needed). Held hard within a tier, gangpreempt takes its
victims within one domain of that tier, as it does for a hard replica. So a soft replica held at the room gate
(core/preempting.py) that fits nowhere now (no domain of its tier, nor the cluster's free GPUs together: else
Volcano places it without preempting) and for which some domain within its tier holds lower-priority work
gangpreempt may take, is narrowed to the lowest such tier before its pods go: the leader records it on the
replica's own PodGroup, and lets the pods go once its PodGroup shows it. The victims it counts on are claimed
(core/preempting.py narrowing_claim): the next replica that must preempt plans without them.

The record (`stormtopo.io/narrowed`: {"v": 1, "tier": T, "at": "<UTC time>"}) lives on the replica's PodGroup.
The admission webhook keeps it through AIBrix's rewrites and gives the PodGroup `hard` within T, as the
reconciler does, for NARROWED_FOR seconds from `at`; then the PodGroup asks what the request asks again
(soft), so a replica that did not land by then goes to Volcano's own preemption anywhere, as without stormtopo.
It is honoured only for a valid soft request of scope RoleSet, a tier within the request's, and an `at` no
further ahead than CLOCK_SKEW: whoever may write the PodGroup can make its own replica hard within its own
tier for two minutes, nothing more.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from typing import Any

from stormtopo.core.jsonpatch import pointer, set_annotations, set_spec_fields
from stormtopo.core.moves import CLOCK_SKEW, moving_tier, recorded_seconds, recorded_time, released_topology
from stormtopo.core.podgroup import held_within
from stormtopo.core.request import ClusterTiers, Mode, Scope, TopologyRequest, recorded_request
from stormtopo.core.vocabulary import NARROWED_ANNOTATION, REQUEST_ANNOTATION
from stormtopo.core.writes import PatchPodGroup

NARROWED_FOR = 120.0  # seconds a narrowing holds a soft replica hard, from its record's `at`
RECORD_VERSION = 1
RECORD_LIMIT = 256  # characters: a record stormtopo writes is about 50; longer is not read


def narrowing_ends(podgroup: Mapping[str, Any] | None) -> float | None:
    """When a PodGroup's narrowing ends by its record (wall seconds), for `stormtopo explain`; None without one."""
    at = recorded_seconds((_record(podgroup) or {}).get("at"))
    return None if at is None else at + NARROWED_FOR


def narrowing_record(tier: int, at: float, over: bool = False) -> str:
    """The record; `over`: a narrowing ended before its time (a record taken off would come back from the stored
    PodGroup at AIBrix's next rewrite, which drops annotations it did not set: it is marked over instead)."""
    record = {"v": RECORD_VERSION, "tier": tier, "at": recorded_time(at)} | ({"over": True} if over else {})
    return json.dumps(record, sort_keys=True)


def narrowed_tier(
    podgroup: Mapping[str, Any] | None,
    request: TopologyRequest,
    cluster: ClusterTiers | None,
    now: float | None,
    old: Mapping[str, Any] | None = None,
) -> int | None:
    """The tier a soft replica's PodGroup is held hard within by its narrowing record, or None. The record is
    read from `podgroup`, else from `old` (the stored PodGroup: AIBrix's rewrite drops annotations it did not
    set). `now` None judges no deadline, as for a move (core/moves.py): the reconciler and the webhook pass a
    clock or neither."""
    if request.mode is not Mode.SOFT or request.scope is not Scope.ROLESET:
        return None
    record = _record(podgroup)
    if record is None and old is not None:
        record = _record(old)
    if record is None:
        return None
    tier, at = int(record["tier"]), recorded_seconds(record.get("at"))
    allowed = (cluster or ClusterTiers()).number(request.limit)
    if allowed is None or tier > allowed:
        return None
    if now is not None and (at is None or not -CLOCK_SKEW <= now - at <= NARROWED_FOR):
        return None
    return tier


def narrow(namespace: str, podgroup: Mapping[str, Any], request: TopologyRequest, tier: int, at: float) -> PatchPodGroup:
    """The write that narrows a soft replica's PodGroup: its record, and its networkTopology as the webhook will
    make it (hard within `tier`, the request's defaults kept)."""
    ops = set_spec_fields(podgroup.get("spec"), {"networkTopology": held_within(request, tier)})
    ops += set_annotations(podgroup, {NARROWED_ANNOTATION: narrowing_record(tier, at)})
    return PatchPodGroup(namespace, str(podgroup["metadata"]["name"]), ops)


def unnarrow(namespace: str, podgroup: Mapping[str, Any], request: TopologyRequest) -> PatchPodGroup:
    """The write that ends a narrowing before its time: its record marked over (the webhook then holds nothing)
    and the networkTopology its request asks."""
    record = _record(podgroup) or {}
    over = narrowing_record(int(record.get("tier", 1)), recorded_seconds(record.get("at")) or 0.0, over=True)
    ops = set_spec_fields(podgroup.get("spec"), {"networkTopology": request.network_topology()})
    ops += set_annotations(podgroup, {NARROWED_ANNOTATION: over})
    return PatchPodGroup(namespace, str(podgroup["metadata"]["name"]), ops)


def is_narrowed_to(podgroup: Mapping[str, Any] | None, request: TopologyRequest, tier: int, wall: float) -> bool:
    """The PodGroup as stored carries the narrowing to `tier`, with at least half its time left by the clock
    `wall` (its pods may go: Volcano sees it hard long enough to preempt). A record left from an earlier hold, or
    dated far ahead, is no narrowing for this one: it is written anew."""
    spec = (podgroup or {}).get("spec") or {}
    record = _record(podgroup)
    at = recorded_seconds((record or {}).get("at"))
    fresh = at is not None and -CLOCK_SKEW <= wall - at <= NARROWED_FOR / 2
    return fresh and (record or {}).get("tier") == tier and spec.get("networkTopology") == held_within(request, tier)


def narrowed_since(first: float | None, wall: float) -> float:
    """When a narrowing is dated: as first written for this hold, unless that is past half its time."""
    return first if first is not None and 0 <= wall - first <= NARROWED_FOR / 2 else wall


def _record(podgroup: Mapping[str, Any] | None) -> Mapping[str, Any] | None:
    raw = (((podgroup or {}).get("metadata") or {}).get("annotations") or {}).get(NARROWED_ANNOTATION)
    try:
        record = json.loads(raw) if isinstance(raw, str) and len(raw) <= RECORD_LIMIT else None
    except (ValueError, RecursionError):  # anyone who may write the PodGroup writes this annotation
        return None
    if not isinstance(record, dict) or record.get("v") != RECORD_VERSION or record.get("over") is True:
        return None  # (over: ended before its time)
    tier = record.get("tier")
    return record if isinstance(tier, int) and not isinstance(tier, bool) and tier >= 1 else None  # (JSON's true is no tier)


def held_tier(
    stormservice: Mapping[str, Any] | None,
    replica: str,
    podgroup: Mapping[str, Any] | None,
    request: TopologyRequest,
    cluster: ClusterTiers | None,
    now: float | None,
    old: Mapping[str, Any] | None = None,
) -> int | None:
    """The tier a replica's PodGroup is held `hard` within: a move's (core/moves.py), else a narrowing's. The
    webhook, the reconciler and the doctor all ask this, by the same clock, or each would undo the other."""
    moving = moving_tier(stormservice, replica, now)
    return moving if moving is not None else narrowed_tier(podgroup, request, cluster, now, old)


def narrowing_held(podgroup: Mapping[str, Any] | None) -> int | None:
    """The tier a PodGroup is held hard within by a narrowing, read from the PodGroup alone (no request, no
    clock): its record, and its networkTopology hard within exactly that tier. For letting it go where no valid
    request judges it: a request made invalid meanwhile, an uninstall."""
    record = _record(podgroup)
    topology = ((podgroup or {}).get("spec") or {}).get("networkTopology")
    if record is None or not isinstance(topology, Mapping):
        return None
    tier = int(record["tier"])
    held = topology.get("mode") == Mode.HARD.value and topology.get("highestTierAllowed") == tier and "highestTierName" not in topology
    return tier if held else None


def released_hold(
    podgroup: Mapping[str, Any] | None,
    stormservice: Mapping[str, Any] | None,
    replica: str,
    defaults: tuple[tuple[str, object], ...] = (),
) -> dict[str, object] | None:
    """While a StormService's request is invalid, the networkTopology that lets a hold go: a move's
    (core/moves.py released_topology), or a narrowing's, back to the last valid request its PodGroup records
    (`stormtopo.io/request`, written from the request, never from the hold). None: nothing held, already let go,
    or no record to go back to (left as it is)."""
    released = released_topology(podgroup, stormservice, replica, defaults)
    return released if released is not None else released_narrowing(podgroup, defaults)


def released_narrowing(podgroup: Mapping[str, Any] | None, defaults: tuple[tuple[str, object], ...] = ()) -> dict[str, object] | None:
    """A narrowed PodGroup's networkTopology let go, judged from the PodGroup alone: the request it records
    (`stormtopo.io/request`, written from the request, never from the hold). None: not narrowed, or no record."""
    if narrowing_held(podgroup) is None:
        return None
    annotations = ((podgroup or {}).get("metadata") or {}).get("annotations") or {}
    request = recorded_request(annotations.get(REQUEST_ANNOTATION), defaults)
    return None if request is None else request.network_topology()


def narrows(writes: Iterable[object]) -> bool:
    """A plan's writes narrow a PodGroup (the leader then reads Volcano's configuration as it is now, and does
    not narrow where it runs no gangpreempt)."""
    return any(isinstance(w, PatchPodGroup) and any(_records(op) for op in w.ops) for w in writes)


def _records(op: Mapping[str, Any]) -> bool:
    """The op writes a narrowing's record (not one marked over)."""
    value = op.get("value")
    if op.get("path") == "/metadata/annotations" and isinstance(value, Mapping):
        value = value.get(NARROWED_ANNOTATION)
    elif op.get("path") != pointer("metadata", "annotations", NARROWED_ANNOTATION):
        return False
    return _record({"metadata": {"annotations": {NARROWED_ANNOTATION: value}}}) is not None
