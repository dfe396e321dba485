"""The metrics the chart's alerts need beyond the counters (issue 22): whether this replica leads, each
background loop's health, and explanations that ran out of their budget."""

from __future__ import annotations

import time

from prometheus_client import REGISTRY

from stormtopo.core.explanation import Pending, explain
from stormtopo.core.topology.fabric import parse_topology
from stormtopo.operator import metrics
from stormtopo.operator.explainer import outcome
from stormtopo.operator.leader import Leadership
from stormtopo.operator.loops import BACKOFF_CAP, Loop, Loops


def sample(name: str, **labels: str) -> float | None:
    return REGISTRY.get_sample_value(name, labels)


def test_leader_and_loop_health_are_read_at_each_scrape() -> None:
    now = [0.0]
    loops = Loops(clock=lambda: now[0])
    loops.loops = {"resync": Loop("resync", 30.0, 0.0, clock=loops.clock), "relist": Loop("relist", 300.0, 0.0, clock=loops.clock)}
    leading = [True]
    metrics.watch(loops, lambda: leading[0])
    assert sample("stormtopo_leader") == 1.0
    assert sample("stormtopo_loop_stuck", loop="resync") == 0.0 and sample("stormtopo_loop_stuck", loop="relist") == 0.0

    now[0] = 3 * 30.0 + BACKOFF_CAP + 1  # resync has not run an iteration for too long; relist has time
    leading[0] = False
    assert sample("stormtopo_leader") == 0.0
    assert sample("stormtopo_loop_stuck", loop="resync") == 1.0 and sample("stormtopo_loop_stuck", loop="relist") == 0.0
    # A failure is no hang (the API server is down: a restart fixes nothing), but it shows as failures and
    # as a last success that grows old, which StormtopoLoopFailing alerts on.
    loops.loops["resync"].failed(RuntimeError("the API server is down"))
    assert sample("stormtopo_loop_stuck", loop="resync") == 0.0
    assert sample("stormtopo_loop_consecutive_failures", loop="resync") == 1.0
    assert sample("stormtopo_loop_failures_total", loop="resync") == 1.0
    last = sample("stormtopo_loop_last_success_timestamp_seconds", loop="resync")
    assert last is not None and abs(time.time() - now[0] - last) < 5  # never succeeded: counted from its start
    loops.loops["resync"].succeeded()
    last = sample("stormtopo_loop_last_success_timestamp_seconds", loop="resync")
    assert last is not None and abs(time.time() - last) < 5
    assert sample("stormtopo_loop_consecutive_failures", loop="resync") == 0.0
    assert sample("stormtopo_loop_failures_total", loop="resync") == 1.0
    # A probe (a work queue) is stuck in the metric when /healthz says so.
    said: list[str | None] = [None]
    loops.probe("queue-placements", lambda hang: said[0])
    assert sample("stormtopo_loop_stuck", loop="queue-placements") == 0.0
    said[0] = "a worker has held one key for 200 s"
    assert sample("stormtopo_loop_stuck", loop="queue-placements") == 1.0


def test_a_follower_exports_that_it_does_not_lead() -> None:
    follower = Leadership(api=object(), namespace="x", identity="b")  # type: ignore[arg-type]
    metrics.watch(Loops(), lambda: follower.is_leader)
    assert sample("stormtopo_leader") == 0.0  # never renewed a Lease
    metrics.watch(Loops(), lambda: Leadership(None).is_leader)  # election off: the one replica leads
    assert sample("stormtopo_leader") == 1.0


def test_every_explanation_outcome_and_write_verb_exists_before_its_first_event() -> None:
    for name in metrics.EXPLANATION_OUTCOMES:
        assert sample("stormtopo_explanations_total", outcome=name) is not None
    assert sample("stormtopo_podgroup_writes_total", verb="create") is not None
    assert sample("stormtopo_admission_seconds_count", kind="pod") is not None


def test_an_explanation_whose_search_ran_out_of_budget_counts_as_out_of_budget() -> None:
    topology = parse_topology("switches:\n  leaf: [" + ", ".join(f"n{i}" for i in range(9)) + "]\n")
    free = {f"n{i}": 3 for i in range(9)}  # 27 free GPUs
    # 13 pods (beyond the exact search's limit) of 2 GPUs: 26 GPUs, first-fit places 9 and says no.
    inexact = explain(topology, free, [2] * 13, 1)
    assert not inexact.fits and outcome(Pending(1, inexact)) == "out_of_budget"
    assert outcome(Pending(1, explain(topology, free, [2, 2], 1))) == "exact"


def test_a_handler_that_holds_the_event_loop_shows_as_lag() -> None:
    """A stall of 0.3 s (a handler that does not yield) is one observation of at least 0.25 s; a loop that
    yields shows none that long."""
    import asyncio

    def slow_ones() -> float:
        return REGISTRY.get_sample_value("stormtopo_event_loop_lag_seconds_count") - REGISTRY.get_sample_value(
            "stormtopo_event_loop_lag_seconds_bucket", {"le": "0.1"}
        )

    async def measure(hold: float) -> float:
        before = slow_ones()
        task = asyncio.get_running_loop().create_task(metrics.measure_event_loop_lag(Loop("event-loop-lag", 1.0, time.monotonic())))
        await asyncio.sleep(0.01)  # the timer is set
        time.sleep(hold)  # the event loop held
        await asyncio.sleep(2 * metrics.LAG_TICK)
        task.cancel()
        return slow_ones() - before

    assert asyncio.run(measure(0.3)) == 1
    assert asyncio.run(measure(0.0)) == 0
