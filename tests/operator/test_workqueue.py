"""The operator's work queue: a key is queued at most once and never handled twice at the same time."""

from __future__ import annotations

import asyncio
import itertools

from stormtopo.operator.workqueue import WorkQueue


def test_a_key_added_many_times_while_waiting_is_handled_once() -> None:
    handled: list[str] = []

    async def handle(key: str) -> None:
        handled.append(key)

    async def scenario() -> None:
        queue: WorkQueue[str] = WorkQueue("test", handle, workers=2)
        for _ in range(5):
            queue.add("a")
        queue.add("b")
        queue.start()
        await asyncio.wait_for(queue.drained(), 5)

    asyncio.run(scenario())
    assert sorted(handled) == ["a", "b"]


def test_a_key_added_while_being_handled_runs_again_after_and_never_alongside() -> None:
    running: set[str] = set()
    overlaps: list[str] = []
    runs: list[str] = []

    async def handle(key: str) -> None:
        if key in running:
            overlaps.append(key)
        running.add(key)
        runs.append(key)
        await asyncio.sleep(0.05)
        running.discard(key)

    async def scenario() -> None:
        queue: WorkQueue[str] = WorkQueue("test", handle, workers=4)
        queue.start()
        queue.add("a")
        await asyncio.sleep(0.01)  # "a" is being handled now
        queue.add("a")
        queue.add("a")
        await asyncio.wait_for(queue.drained(), 5)

    asyncio.run(scenario())
    assert runs == ["a", "a"]  # once for the first add, once more for the changes that came during it
    assert overlaps == []


def test_a_failing_key_does_not_stop_the_others() -> None:
    handled: list[str] = []

    async def handle(key: str) -> None:
        if key == "bad":
            raise RuntimeError("boom")
        handled.append(key)

    async def scenario() -> None:
        queue: WorkQueue[str] = WorkQueue("test", handle, workers=1)
        queue.start()
        for key in ("bad", "good", "bad", "also-good"):
            queue.add(key)
        await asyncio.wait_for(queue.drained(), 5)

    asyncio.run(scenario())
    assert handled == ["good", "also-good"]


def test_draining_many_keys_with_nothing_to_do_never_holds_the_event_loop() -> None:
    """Issue 42, item 3: the webhooks and /healthz share the loop with the workers. Handlers that return
    at once (a service with nothing to do) must still let another coroutine run between two keys."""
    handled = 0
    seen_between: list[int] = []

    async def handle(key: int) -> None:
        nonlocal handled
        handled += 1

    async def other() -> None:  # what a webhook request does: wait its turn on the loop
        while handled < 10_000:
            seen_between.append(handled)
            await asyncio.sleep(0)

    async def scenario() -> None:
        queue: WorkQueue[int] = WorkQueue("test", handle, workers=4)
        for key in range(10_000):
            queue.add(key)
        queue.start()
        await asyncio.wait_for(asyncio.gather(queue.drained(), other()), 30)

    asyncio.run(scenario())
    # The other coroutine ran again and again while the keys drained, a few keys apart, not once at the end.
    gaps = [b - a for a, b in itertools.pairwise(seen_between)]
    assert len(seen_between) > 1000 and max(gaps) <= 8, (len(seen_between), max(gaps))


def test_a_wedged_worker_makes_the_queue_stuck_in_healthz() -> None:
    """Issue 42, item 6: /healthz sees the work queues' workers; one whose handler never returns is reported."""
    from stormtopo.operator.loops import Loops

    now = [0.0]
    forever = asyncio.Event()

    async def handle(key: str) -> None:
        if key == "wedged":
            await forever.wait()  # an await that never returns

    async def scenario() -> tuple[bool, dict[str, object], bool]:
        loops = Loops(clock=lambda: now[0], hang=60.0)
        queue: WorkQueue[str] = WorkQueue("test", handle, workers=2, clock=lambda: now[0])
        loops.probe("queue-test", queue.stuck)
        queue.start()
        queue.add("fine")
        queue.add("wedged")
        await asyncio.sleep(0.05)
        healthy_now = loops.health()[0]
        now[0] = 61.0
        ok, report = loops.health()
        assert not ok
        forever.set()
        await asyncio.wait_for(queue.drained(), 5)
        return healthy_now, report, loops.health()[0]

    healthy_now, report, healthy_after = asyncio.run(scenario())
    assert healthy_now and healthy_after
    problem = report["queue-test"]["problem"]  # type: ignore[index]
    assert isinstance(problem, str) and "wedged" in problem and "61 s" in problem


def test_stop_ends_every_worker_even_one_mid_handling() -> None:
    """On the way out the workers are stopped, not left for kopf, which waits 5 s for every task of the
    loop before it cancels them (a replica's stop, and so a rolling update, 5 s longer)."""
    started = asyncio.Event()

    async def handle(key: str) -> None:
        started.set()
        await asyncio.sleep(3600)  # a handler that would never return by itself

    async def scenario() -> None:
        queue: WorkQueue[str] = WorkQueue("test", handle, workers=3)
        queue.start()
        queue.add("a")
        await asyncio.wait_for(started.wait(), 5)
        workers = [t for t in asyncio.all_tasks() if "test worker" in t.get_name()]
        assert len(workers) == 3
        await asyncio.wait_for(queue.stop(), 1)
        assert all(t.done() for t in workers)
        assert queue.stuck(0.0) is None  # stopped, not reported as workers that ended

    asyncio.run(scenario())
