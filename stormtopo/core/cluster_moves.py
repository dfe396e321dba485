"""The cluster's moves under way, from the move records every StormService keeps: which records count
(trusted_moves: a StormService's owner can write them), how many replicas move at once against the
cluster's cap (moving_in_cluster, MAX_MOVING), and the room their targets take until their pods are
placed again (set_aside, placed_since).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from stormtopo.core.gang import replica_pods
from stormtopo.core.moves import CLOCK_SKEW, MOVE_DEADLINE, asks_healing, recorded_moves, recorded_seconds
from stormtopo.core.topology.tree import Topology

MAX_MOVING = 2  # replicas moving at once in the whole cluster (--heal-max-moving): a recovery is no synchronised restart


def is_being_deleted(stormservice: Mapping[str, Any]) -> bool:
    """A StormService being deleted (alone, or with its namespace) heals nothing, and its moves, which
    go with it, hold back no other service's."""
    return bool((stormservice.get("metadata") or {}).get("deletionTimestamp"))


def trusted_moves(stormservice: Mapping[str, Any], now: float) -> list[tuple[Mapping[str, Any], float]]:
    """The move records of a StormService that may count in what healing knows of the whole cluster (the
    cap on moves at once, a move to make room under way, room made for whom), each with its start.

    A StormService's owner can write its annotations, so its records are input, not stormtopo's word:
    they count only on a service that asks for healing (whose moves the healer settles at each look),
    not being deleted, each with a readable start no further ahead of `now` than CLOCK_SKEW (a record
    dated in the future would otherwise count until then)."""
    if is_being_deleted(stormservice) or not asks_healing(stormservice):
        return []
    out = []
    for move in recorded_moves(stormservice).values():
        at = recorded_seconds(move.get("at"))
        if at is not None and at - now <= CLOCK_SKEW:
            out.append((move, at))
    return out


def _under_way(move: Mapping[str, Any], at: float, now: float) -> bool:
    return not move.get("done") and now - at <= MOVE_DEADLINE


def moves_under_way(stormservice: Mapping[str, Any], now: float) -> bool:
    """A trusted move of the service not settled and within its deadline: its target is set aside."""
    return any(_under_way(m, at, now) for m, at in trusted_moves(stormservice, now))


def moving_in_cluster(stormservices: Iterable[Mapping[str, Any]], now: float) -> int:
    """Replicas moving now across the cluster: trusted moves (trusted_moves), not settled, within their
    deadline; at most one per service, as the healer moves one replica of a service at a time (so a
    service's forged records take no more of the cap than its own healing could)."""
    return sum(
        1
        for stormservice in stormservices
        if any(_under_way(m, at, now) and m.get("toTier") is not None for m, at in trusted_moves(stormservice, now))
    )


def set_aside(
    free: Mapping[str, int],
    topology: Topology,
    stormservice: Mapping[str, Any],
    rolesets: Sequence[Mapping[str, Any]],
    placed_since: Mapping[str, int],
) -> dict[str, int]:
    """Free GPUs with room set aside for this service's replicas that are moving and not yet placed:
    their pods are evicted and pending, so nothing of theirs reads as used, but their target is taken.
    Without this, a second service's replica, planned in the same pass or the next, would be moved into
    the same room, and one of the two would wait, held, for nothing. `placed_since`: per replica, its
    pods bound since its move began. Each pod is set aside on the target's node with the least room
    that holds it, as the packing check would place it."""
    out = dict(free)
    spec_of = {str(r["metadata"]["name"]): r.get("spec") or {} for r in rolesets}
    for replica, move in recorded_moves(stormservice).items():
        target = move.get("to")
        if move.get("done") or not isinstance(target, str) or target not in topology.switches or replica not in spec_of:
            continue
        wanted = sorted(replica_pods(spec_of[replica]), reverse=True)[placed_since.get(replica, 0) :]
        nodes = [n for n in topology.nodes_under(target) if n in out]
        for gpus in wanted:
            fitting = [n for n in nodes if out[n] >= gpus]
            if fitting:
                node = min(fitting, key=lambda n: (out[n], n))
                out[node] -= gpus
    return out


def placed_since(pods: Sequence[Mapping[str, Any]], stormservice: Mapping[str, Any], replica: str) -> int:
    """Pods of a moving replica bound since its move began (set_aside's `placed_since`)."""
    at = str((recorded_moves(stormservice).get(replica) or {}).get("at") or "")
    return sum(
        1
        for p in pods
        if (p.get("spec") or {}).get("nodeName")
        and not (p.get("metadata") or {}).get("deletionTimestamp")
        and str((p.get("metadata") or {}).get("creationTimestamp") or "") >= at
    )
