"""What healing makes of one replica (Verdict): why it moves (Why), and why it does not move now (Block).

Their values are the healing metrics' labels (operator/metrics.py) and the kinds its Events are said
once per (core/heal_events.py _say_once); the planner that judges a replica is core/healing.py's.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum

from stormtopo.core.packing import DomainFit


class Why(StrEnum):
    """Why a replica moves: the metric's label and the Event's words."""

    SOFT_WIDE = "soft-above-tier"
    VIOLATION = "hard-violation"
    MAKE_ROOM = "make-room"  # within its tier, it moves to another domain so that a wide replica fits (core/room.py)
    # A hard replica with a pod Pending past --heal-stranded-after in a domain that cannot hold it, while another
    # domain within its tier holds it whole: Volcano keeps a gang with a running pod in its HyperNode.
    STRANDED = "stranded"


class Block(StrEnum):
    """Why a wide replica does not move now: said once per kind, whatever the numbers in the message."""

    MOVING = "another-moving"
    COOLDOWN = "cool-down"
    BACKOFF = "back-off"
    BUDGET = "service-budget"
    DISRUPTION_BUDGET = "pod-disruption-budget"
    NEXT = "one-at-a-time"
    NO_ROOM = "no-room"
    ROLLOUT = "rollout"
    UNCHECKED = "not-checked"  # wide and free to move, but this pass searched enough others
    CLUSTER_CAP = "cluster-cap"  # as many replicas are moving in the cluster as may at once
    GAVE_UP = "gave-up"  # its last GIVE_UP_AFTER moves did not land within its tier


@dataclass(frozen=True)
class Verdict:
    """What healing makes of one replica: wide or not, and if wide whether it moves now, and why not."""

    replica: str
    span: str  # where it is: "s4, tier 2"
    why: Why | None  # None: within its request (or not judged: `blocked` says why)
    target: DomainFit | None = None  # the domain with room, lowest tier first, most free GPUs first
    blocked: str = ""  # why it does not move now ("" when it does, or is within its request)
    block: Block | None = None

    @property
    def moves(self) -> bool:
        return self.why is not None and self.target is not None and not self.blocked
