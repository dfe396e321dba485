"""The operator's work queue: a key is queued at most once and never handled twice at the same time."""

from __future__ import annotations

import asyncio

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
