"""Leader election (issue 14, item 5): observed time instead of the holder's clock, a renew deadline
that ends leadership while a renewal hangs, and release on shutdown."""

from __future__ import annotations

import asyncio
import contextlib
import copy
import threading
import time
from typing import Any, cast

from stormtopo.kube.client import Api, ApiError, ApiUnavailable
from stormtopo.operator.leader import LEASE_NAME, Leadership, held_by_another, observe
from stormtopo.operator.loops import Loop


def _lease(holder: str, renew: str, rv: str, duration: int = 15) -> dict[str, Any]:
    return {"metadata": {"resourceVersion": rv}, "spec": {"holderIdentity": holder, "renewTime": renew, "leaseDurationSeconds": duration}}


def test_a_follower_measures_expiry_from_when_it_saw_the_lease_change_not_from_the_holders_clock() -> None:
    # The holder's clock is a year behind: its renewTime looks ancient, but it renews; never expired.
    seen = observe(None, _lease("a", "2025-01-01T00:00:00.000000Z", "1"), now=100.0)
    assert held_by_another(seen, _lease("a", "", "1"), "b", 15, now=110.0)
    seen = observe(seen, _lease("a", "2025-01-01T00:00:05.000000Z", "2"), now=112.0)  # changed: a new observation
    assert seen.seen_at == 112.0 and held_by_another(seen, _lease("a", "", "2"), "b", 15, now=126.0)
    # Unchanged for a whole duration by the follower's own clock: expired.
    same = observe(seen, _lease("a", "2025-01-01T00:00:05.000000Z", "2"), now=128.0)
    assert same is seen and not held_by_another(same, _lease("a", "", "2"), "b", 15, now=128.0)
    # A holder's clock a year ahead does not make its lease look valid forever either.
    ahead = observe(None, _lease("a", "2027-12-31T00:00:00.000000Z", "7"), now=0.0)
    assert not held_by_another(ahead, _lease("a", "", "7"), "b", 15, now=15.5)


def test_a_released_or_own_lease_is_free_to_take() -> None:
    seen = observe(None, _lease("", "x", "3", duration=1), now=0.0)
    assert not held_by_another(seen, _lease("", "x", "3", duration=1), "b", 15, now=0.0)
    mine = observe(None, _lease("b", "x", "3"), now=0.0)
    assert not held_by_another(mine, _lease("b", "x", "3"), "b", 15, now=0.0)


class FakeLeases:
    """An in-memory Lease store with resourceVersion checks; `hang` blocks every call while set."""

    def __init__(self) -> None:
        self.lease: dict[str, Any] | None = None
        self.version = 0
        self.hang = threading.Event()

    def _block(self) -> None:
        while self.hang.is_set():
            time.sleep(0.01)

    def get_lease(self, namespace: str, name: str) -> dict[str, Any] | None:
        self._block()
        return copy.deepcopy(self.lease)

    def create_lease(self, body: dict[str, Any]) -> None:
        if self.lease is not None:
            raise ApiError.of(409, "POST", "leases", "exists")
        self.version += 1
        self.lease = copy.deepcopy(body)
        self.lease["metadata"]["resourceVersion"] = str(self.version)

    def replace_lease(self, body: dict[str, Any]) -> None:
        self._block()
        assert self.lease is not None
        if body["metadata"]["resourceVersion"] != self.lease["metadata"]["resourceVersion"]:
            raise ApiError.of(409, "PUT", "leases", "conflict")
        self.version += 1
        self.lease = copy.deepcopy(body)
        self.lease["metadata"]["resourceVersion"] = str(self.version)


async def leading(leader: Leadership, within: float = 5.0) -> None:
    """Wait until `leader` holds the Lease (its election running), failing after `within` seconds."""
    deadline = time.monotonic() + within
    while not leader.is_leader:
        assert time.monotonic() < deadline
        await asyncio.sleep(0.05)


def test_a_leader_whose_renewal_hangs_stops_leading_within_the_renew_deadline_and_releases_on_shutdown() -> None:
    async def scenario() -> None:
        store = FakeLeases()
        leader = Leadership(store, "ns", "a", duration=3)  # type: ignore[arg-type]
        running = asyncio.create_task(leader.run())
        await leading(leader)
        assert store.lease is not None and store.lease["metadata"]["name"] == LEASE_NAME

        store.hang.set()  # the API server stops answering; the renewal never returns
        hung_at = time.monotonic()
        while leader.is_leader:
            await asyncio.sleep(0.05)
        assert time.monotonic() - hung_at <= leader.renew_deadline + 0.2  # before a follower could take over (3 s)

        store.hang.clear()
        while not leader.is_leader:  # the API server is back: it renews its own Lease at once
            assert time.monotonic() - hung_at < 10
            await asyncio.sleep(0.05)
        running.cancel()  # shutdown
        with contextlib.suppress(asyncio.CancelledError):
            await running
        assert not leader.is_leader
        assert store.lease["spec"]["holderIdentity"] == "" and store.lease["spec"]["leaseDurationSeconds"] == 1

        follower = Leadership(store, "ns", "b", duration=3)
        taking = asyncio.create_task(follower.run())
        started = time.monotonic()
        while not follower.is_leader:
            await asyncio.sleep(0.05)
        assert time.monotonic() - started < 1.0  # released: no need to wait out a lease duration
        assert store.lease["spec"]["holderIdentity"] == "b" and store.lease["spec"]["leaseTransitions"] == 1
        taking.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await taking

    asyncio.run(scenario())


def test_a_failing_catch_up_at_election_is_retried_and_never_ends_the_election() -> None:
    """Issue 20: `on_elected` (the resync) was awaited outside the attempt's try, so one API blip at
    election time ended `leadership.run()` for good and left the replicas without a leader."""

    async def scenario() -> None:
        store = FakeLeases()
        leader = Leadership(store, "ns", "a", duration=3)  # type: ignore[arg-type]
        calls: list[float] = []

        async def resync() -> None:
            calls.append(time.monotonic())
            if len(calls) == 1:
                raise ApiUnavailable("GET", "/api/v1/namespaces/ns/configmaps/x", "connection refused")

        leader.on_elected = resync
        loop = Loop("leader-election", leader.retry_period, time.monotonic())
        running = asyncio.create_task(leader.run(loop))
        deadline = time.monotonic() + 10
        while len(calls) < 2:
            assert time.monotonic() < deadline, "the catch-up was not retried"
            await asyncio.sleep(0.05)
        assert 0.9 <= calls[1] - calls[0] < 3  # after a backoff of 1 s
        assert not running.done() and leader.is_leader
        assert loop.last_success is not None  # each renewal is an iteration /healthz sees
        running.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await running

    asyncio.run(scenario())


def test_renewals_do_not_queue_behind_api_work_in_the_default_thread_pool() -> None:
    """Lesser finding of issue 20: Lease renewals shared the default pool with the API workers."""

    async def scenario() -> float:
        leadership = Leadership(FakeLeases(), "ns", "a", duration=15)  # type: ignore[arg-type]
        release = threading.Event()
        loop = asyncio.get_running_loop()
        # Every thread of the default pool busy, as during a burst of API work.
        busy = [loop.run_in_executor(None, release.wait) for _ in range(64)]
        started = time.monotonic()
        await leadership._attempt()
        took = time.monotonic() - started
        assert leadership.is_leader
        release.set()
        await asyncio.gather(*busy)
        return took

    assert asyncio.run(scenario()) < 5.0


def test_a_leader_that_steps_down_while_it_drains_never_takes_the_lease_back() -> None:
    """SIGTERM: the Lease is released at once and the election goes on running while the webhook drains;
    it must not acquire the (now free) Lease again, or no follower could take over until the process ends."""

    async def scenario() -> None:
        store = FakeLeases()
        leader = Leadership(store, "ns", "a", duration=3)  # type: ignore[arg-type]
        running = asyncio.create_task(leader.run())
        await leading(leader)
        await leader.release()
        assert not leader.is_leader and store.lease is not None and store.lease["spec"]["holderIdentity"] == ""
        await asyncio.sleep(3 * leader.retry_period)  # retry periods of the still-running election
        assert not leader.is_leader and store.lease["spec"]["holderIdentity"] == ""
        running.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await running

    asyncio.run(scenario())


def test_a_renewal_that_writes_between_the_releases_read_and_write_does_not_keep_the_lease() -> None:
    """A renewal already past its checks when SIGTERM comes writes the Lease between release()'s read and
    its write: the release's write conflicts, and it reads again and frees the Lease (a follower need not
    wait a duration); an attempt that has not written yet never acquires after the step-down."""

    async def scenario() -> None:
        store = FakeLeases()
        leader = Leadership(store, "ns", "a", duration=15)  # type: ignore[arg-type]
        await leader._attempt()
        assert leader.is_leader
        read, go, reads = threading.Event(), threading.Event(), []
        plain_get = store.get_lease

        def get_lease(namespace: str, name: str) -> dict[str, Any] | None:
            lease = plain_get(namespace, name)
            reads.append(lease)
            if len(reads) == 1:
                read.set()
                go.wait(5)
            return lease

        store.get_lease = get_lease  # type: ignore[method-assign]
        releasing = asyncio.create_task(leader.release())
        await asyncio.to_thread(read.wait, 5)
        renewed = plain_get("ns", LEASE_NAME)  # the renewal under way writes now
        assert renewed is not None
        store.replace_lease(renewed)
        go.set()
        await releasing
        assert store.lease is not None and store.lease["spec"]["holderIdentity"] == "" and len(reads) == 2
        assert await asyncio.to_thread(leader._try_acquire_or_renew) is False  # stepped down: never acquires again
        assert store.lease["spec"]["holderIdentity"] == ""

    asyncio.run(scenario())


def test_a_follower_knows_a_leader_while_the_lease_it_saw_changes_and_not_after() -> None:
    """The webhook holds a pod at the room gate only while some replica is known to lead (core/narrowing.py,
    exact preemption): a held pod waits for a leader to let it go."""
    assert Leadership(None).leader_known()  # no election: this replica leads
    follower = Leadership(cast(Api, object()), "ns", "b")  # never called: only what it observed counts
    assert not follower.leader_known()  # nothing seen yet
    follower._observed = observe(None, _lease("a", "t1", "1"), now=time.monotonic())
    assert follower.leader_known()
    follower._observed = observe(None, _lease("a", "t1", "1"), now=time.monotonic() - 16)  # unchanged a whole duration
    assert not follower.leader_known()
    follower._observed = observe(None, _lease("", "t1", "2"), now=time.monotonic())  # released: nobody leads
    assert not follower.leader_known()
    draining = Leadership(cast(Api, object()), "ns", "b")
    draining._observed = observe(None, _lease("b", "t1", "3"), now=time.monotonic())  # it led a moment ago
    draining._stepped_down = True
    assert not draining.leader_known()  # stepped down: the Lease it last saw names itself
