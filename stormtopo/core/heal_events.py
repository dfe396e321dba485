"""What healing says in its Events: a replica moving and why (ReplicaMoving), a wide replica not moved
and why not (ReplicaNotMoved), each reason said once per kind (_say_once).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import replace
from typing import Any

from stormtopo.core.heal_plan import HealMemory
from stormtopo.core.lending import MakeRoom
from stormtopo.core.replica_pods import Replica
from stormtopo.core.request import TopologyRequest
from stormtopo.core.verdict import Block, Verdict, Why
from stormtopo.core.writes import PostEvent, Say, Write


def _moving(verdict: Verdict, request: TopologyRequest, tier: int, replica: Replica, make_room: MakeRoom | None) -> str:
    assert verdict.target is not None
    target = verdict.target
    return (
        f"replica {verdict.replica} moves from {verdict.span} to {target.switch.name} (tier {target.switch.tier}): "
        f"{_because(verdict, request, tier, make_room)}; {target.switch.name} has {target.free_gpus} free GPUs for its "
        f"{len(replica.wanted())} pods ({sum(replica.wanted())} GPUs). Its pods are evicted and placed again as one gang"
    )


def _not_moved(verdict: Verdict, request: TopologyRequest, tier: int, make_room: MakeRoom | None) -> Say:
    kind = "Warning" if verdict.block in (Block.DISRUPTION_BUDGET, Block.BACKOFF, Block.GAVE_UP) else "Normal"
    return Say(
        kind,
        "ReplicaNotMoved",
        f"replica {verdict.replica} spans {verdict.span} and is not moved: "
        f"{verdict.blocked} ({_because(verdict, request, tier, make_room)})",
    )


def _because(verdict: Verdict, request: TopologyRequest, tier: int, make_room: MakeRoom | None = None) -> str:
    if verdict.why is Why.MAKE_ROOM and make_room is not None:
        return f"it makes room in {make_room.frees} for {make_room.wide}, which no domain within its tier holds now"
    if verdict.why is Why.VIOLATION:
        return f"it violates its hard request ({request.describe()})"
    if verdict.why is Why.STRANDED:
        return (
            f"a pod of it has waited in {verdict.span} since its other pods ran there, which cannot hold it, and "
            f"Volcano keeps a gang with a running pod in its domain ({request.describe()})"
        )
    return f"it landed above tier {tier} ({request.describe()})"


def _say_once(memory: HealMemory, about: Mapping[str, Any], says: Sequence[tuple[Verdict, Say]]) -> tuple[list[Write], HealMemory]:
    """Why a replica is not moved is said once per kind of reason (the check repeats every pass, and
    the numbers in the message change); a move, every time."""
    out: list[Write] = []
    said = dict(memory.said)
    for verdict, say in says:
        key = f"{verdict.replica}/{say.reason}"
        kind = str(verdict.block or "")
        if say.reason != "ReplicaMoving" and said.get(key) == kind:
            continue
        said[key] = kind
        out.append(PostEvent(about, say))
    return out, replace(memory, said=said)
