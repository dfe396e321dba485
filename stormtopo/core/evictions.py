"""What a move does once its evictions are answered (core/healing.py made the plan, operator/writer.py
evicted): the shell says what each failure was (EvictionFailure, from the API's answer), this decides.

- Every failure because the namespace is being deleted: the move ends with it, quietly (no Event can be
  posted there, and nobody refused anything).
- A PodDisruptionBudget refused one of the moving replica's pods: the move is over and recorded so, said,
  and the replica backs off (core/healing.py plan_refused).
- RBAC, a webhook or a policy refused: said once a pass as a HealingRefused Warning, whatever the number of
  pods; the move stays under way.
- Anything else (an outage, a conflict): the move stays under way and the next pass resumes it."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from enum import StrEnum

from stormtopo.core.heal_plan import HealMemory, HealPlan
from stormtopo.core.heal_snapshot import HealSnapshot
from stormtopo.core.healing import plan_refused
from stormtopo.core.writes import Write


class Failure(StrEnum):
    TERMINATING = "terminating"  # the pod's namespace is being deleted
    BUDGET = "budget"  # a PodDisruptionBudget forbids it
    REFUSED = "refused"  # RBAC, or an admission webhook or policy: not a budget, not an outage
    OTHER = "other"  # an outage, a conflict, API priority and fairness


@dataclass(frozen=True)
class EvictionFailure:
    pod: str
    kind: Failure
    message: str  # the API server's own words


@dataclass(frozen=True)
class AfterEvictions:
    writes: tuple[Write, ...] = ()  # the move refused by a budget, ended and recorded so
    memory: HealMemory | None = None  # the service's healing memory to keep; None: as it was
    refused_by_budget: int = 0
    say_refused: EvictionFailure | None = None  # a HealingRefused Warning (RBAC, a webhook or a policy)
    logged: tuple[EvictionFailure, ...] = ()  # failures that are no budget refusal: logged as warnings
    resume: EvictionFailure | None = None  # the move stays under way: the pass reports it, the next resumes it
    quiet: bool = False  # the namespace is going: the move ends with it, nothing said


def plan_evicted(
    snapshot: HealSnapshot, plan: HealPlan, failures: Sequence[EvictionFailure], evicted: int, memory: HealMemory
) -> AfterEvictions:
    if failures and all(f.kind is Failure.TERMINATING for f in failures):
        return AfterEvictions(quiet=True)
    budget = [f for f in failures if plan.moving is not None and f.kind is Failure.BUDGET]
    logged = tuple(f for f in failures if f not in budget)
    say = next((f for f in logged if f.kind is Failure.REFUSED), None)
    if not budget:
        return AfterEvictions(say_refused=say, logged=logged, resume=failures[0] if failures else None)
    writes, memory = plan_refused(snapshot, plan, budget[0].pod, budget[0].message, memory, evicted=evicted)
    return AfterEvictions(tuple(writes), memory, len(budget), say, logged)
