"""What a StormService's healing plan returns (HealPlan: every replica's verdict, the writes in order,
the move started and the moves settled) and what the planner remembers of the service from one pass
to the next (HealMemory: back-offs, what was said, when it is next worth a look).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field, replace

from stormtopo.core.cooldown import BACKOFF, BACKOFF_MAX
from stormtopo.core.verdict import Verdict
from stormtopo.core.writes import Write


@dataclass(frozen=True)
class HealMemory:
    """Per replica: the back-off after a refused eviction. Say-once. When the service is next worth a look."""

    next_try: Mapping[str, float] = field(default_factory=dict)
    backoff: Mapping[str, float] = field(default_factory=dict)
    said: Mapping[str, str] = field(default_factory=dict)  # "replica/kind" -> the message said
    quiet_until: float = float("-inf")  # no move under way and nowhere to go: no reading before this

    def refused(self, replica: str, now: float) -> HealMemory:
        """An eviction of `replica` was refused: wait, twice as long as last time."""
        wait = min(BACKOFF_MAX, 2 * self.backoff[replica]) if replica in self.backoff else BACKOFF
        return replace(self, next_try={**self.next_try, replica: now + wait}, backoff={**self.backoff, replica: wait})


@dataclass(frozen=True)
class Settled:
    """A move that finished: its replica bound and ready again, or given up."""

    replica: str
    unavailable: float | None  # seconds from the move to all pods ready again; None: it did not come back in time
    landed: bool  # within its tier


@dataclass(frozen=True)
class HealPlan:
    verdicts: tuple[Verdict, ...] = ()
    writes: tuple[Write, ...] = ()  # Events, the records, the PodGroups held or let go, then the evictions
    memory: HealMemory = HealMemory()
    moving: Verdict | None = None
    settled: tuple[Settled, ...] = ()
    one_at_a_time: bool = False  # evictions one after another (a PodDisruptionBudget covers a pod), else together
