"""What a move does once its evictions are answered (core/evictions.py), with no shell."""

from __future__ import annotations

from stormtopo.core.evictions import EvictionFailure, Failure, plan_evicted
from stormtopo.core.heal_plan import HealMemory
from stormtopo.core.healing import plan_healing
from stormtopo.core.writes import PostEvent
from tests.builders import service
from tests.core.healing_cases import BIG, SOFT1, WIDE, snap


def failure(pod: str, kind: Failure) -> EvictionFailure:
    return EvictionFailure(pod, kind, f"{kind} for {pod}")


def test_each_answer_to_an_eviction_ends_says_or_resumes_the_move_as_it_should() -> None:
    snapshot = snap(service(SOFT1, BIG, update_strategy="RollingUpdate"), WIDE)
    plan = plan_healing(snapshot, HealMemory())
    assert plan.moving is not None
    decode, prefill = "svc-a-decode-0", "svc-a-prefill-0"
    gone = plan_evicted(snapshot, plan, [failure(decode, Failure.TERMINATING), failure(prefill, Failure.TERMINATING)], 0, HealMemory())
    assert gone.quiet and not gone.writes and gone.say_refused is None and gone.resume is None
    budget = plan_evicted(snapshot, plan, [failure(prefill, Failure.BUDGET)], 1, HealMemory())
    assert budget.refused_by_budget == 1 and budget.memory is not None and budget.resume is None
    assert any(isinstance(w, PostEvent) and w.say.reason == "ReplicaNotMoved" for w in budget.writes)
    policy = plan_evicted(snapshot, plan, [failure(decode, Failure.REFUSED), failure(prefill, Failure.REFUSED)], 0, HealMemory())
    assert policy.say_refused == failure(decode, Failure.REFUSED) and policy.resume == failure(decode, Failure.REFUSED)  # said once
    outage = plan_evicted(snapshot, plan, [failure(decode, Failure.OTHER)], 0, HealMemory())
    assert outage.resume is not None and outage.say_refused is None and outage.memory is None and not outage.quiet
    mixed = plan_evicted(snapshot, plan, [failure(decode, Failure.TERMINATING), failure(prefill, Failure.OTHER)], 0, HealMemory())
    assert not mixed.quiet and mixed.resume == failure(decode, Failure.TERMINATING)
    assert plan_evicted(snapshot, plan, [], 2, HealMemory()) == plan_evicted(snapshot, plan, (), 2, HealMemory())
