"""Leader election on a coordination.k8s.io Lease: every replica serves the webhook, one reconciles.

kopf's peering only pauses operators that see each other; it does not elect. This is the client-go
scheme in a few lines:
- hold the Lease by renewing it every retry period; optimistic concurrency (resourceVersion) settles races;
- a leader that has not renewed within the renew deadline stops leading at once, even while its renewal
  still hangs, so that it stops writing before a follower may take over (deadline < lease duration);
- a follower never compares the holder's clock with its own: it takes over when it has seen no change
  of the Lease for a whole lease duration, measured by its own monotonic clock (observed time);
- on shutdown the leader releases the Lease, so a follower takes over at once instead of a duration later.
"""

from __future__ import annotations

import asyncio
import logging
import os
import socket
import time
from collections.abc import Awaitable, Callable, Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any, TypeVar

from stormtopo.kube.client import Api, Conflict, micro_time
from stormtopo.operator.loops import Loop, backoff, failure_reason

log = logging.getLogger("stormtopo.leader")
LEASE_NAME = "stormtopo-operator"
T = TypeVar("T")


def default_identity() -> str:
    return os.environ.get("POD_NAME") or f"{socket.gethostname()}-{os.getpid()}"


@dataclass(frozen=True)
class Observation:
    """The Lease as this replica last saw it change, and when, by this replica's monotonic clock."""

    record: tuple[str, str, str]  # holder, renewTime, resourceVersion
    seen_at: float


def observe(previous: Observation | None, lease: Mapping[str, Any], now: float) -> Observation:
    spec, meta = lease.get("spec") or {}, lease.get("metadata") or {}
    record = (str(spec.get("holderIdentity") or ""), str(spec.get("renewTime") or ""), str(meta.get("resourceVersion") or ""))
    if previous is not None and previous.record == record:
        return previous
    return Observation(record, now)


def held_by_another(observation: Observation, lease: Mapping[str, Any], identity: str, default_duration: float, now: float) -> bool:
    """True while another holder's Lease is valid: it changed less than its duration ago (observed time)."""
    spec = lease.get("spec") or {}
    holder = spec.get("holderIdentity")
    if not holder or holder == identity:  # released, or ours
        return False
    return now - observation.seen_at < float(spec.get("leaseDurationSeconds") or default_duration)


class Leadership:
    """`is_leader` is True while this replica holds the Lease (always True when election is off)."""

    def __init__(self, api: Api | None, namespace: str = "", identity: str = "", duration: int = 15) -> None:
        self.api = api
        self.namespace = namespace
        self.identity = identity or default_identity()
        self.duration = duration
        # client-go's ratios (15 s lease, 10 s renew deadline, 2 s retry period).
        self.renew_deadline = duration * 2 / 3
        self.retry_period = max(0.5, duration / 7.5)
        self.on_elected: Callable[[], Awaitable[None]] | None = None
        self._renewed_at: float | None = None  # monotonic start of the last successful renewal
        self._observed: Observation | None = None
        self._catching_up: asyncio.Task[None] | None = None  # on_elected, running beside the renewals
        self._failing = ""  # why the last attempts failed (logged with its traceback once per reason)
        self._stepped_down = False  # released on the way out: never acquired again by this process
        # Threads of the Lease's own: a burst of API work (a resync's writes, a flood of admissions'
        # read-throughs) fills the default pool, and a renewal queued behind it would miss its deadline.
        # Two: one renewal may hang until its HTTP timeout while the next one goes on.
        self._threads = ThreadPoolExecutor(max_workers=2, thread_name_prefix="lease")

    async def _in_lease_thread(self, call: Callable[[], T]) -> T:
        return await asyncio.get_running_loop().run_in_executor(self._threads, call)

    @property
    def is_leader(self) -> bool:
        if self.api is None:
            return True
        # Expires by itself: a renewal that hangs ends leadership at the deadline, not when it returns.
        return self._renewed_at is not None and time.monotonic() - self._renewed_at < self.renew_deadline

    def leader_known(self) -> bool:
        """Some replica leads, as far as this one knows: itself, or another whose Lease this replica saw change
        less than a duration ago. The webhook holds a pod at the room gate only then: a held pod waits for a
        leader to let it go."""
        if self.is_leader:
            return True
        if self._stepped_down:  # draining: the Lease it last saw may still name this replica
            return False
        observed = self._observed
        return observed is not None and bool(observed.record[0]) and time.monotonic() - observed.seen_at < self.duration

    async def run(self, loop: Loop | None = None) -> None:
        """Renew or acquire every retry period, forever: no failure, of the API or of `on_elected`,
        ends it. `loop` (when supervised) learns of every attempt that completed."""
        if self.api is None:
            return
        try:
            while True:
                try:
                    if self._stepped_down:  # stopping (draining): the Lease is a follower's to take
                        await asyncio.sleep(self.retry_period)
                        continue
                    answered = await self._attempt()
                    if loop is not None:
                        loop.succeeded() if answered else loop.alive()
                except Exception:  # a bug, not the API (the attempt catches that): log it, keep electing
                    log.exception("lease %s/%s: election attempt failed", self.namespace, LEASE_NAME)
                await asyncio.sleep(self.retry_period)
        except asyncio.CancelledError:
            await self.release()
            raise

    async def _attempt(self) -> bool:
        """One acquire-or-renew; True if the API server answered."""
        was = self.is_leader
        started = time.monotonic()
        budget = self._renewed_at + self.renew_deadline - started if was and self._renewed_at is not None else self.renew_deadline
        answered = False
        try:
            held = await asyncio.wait_for(self._in_lease_thread(self._try_acquire_or_renew), timeout=max(0.1, budget))
            self._renewed_at = started if held and not self._stepped_down else None
            if held and self._stepped_down:  # acquired by an attempt under way as it stepped down: give it back
                await self._in_lease_thread(self._release)
            answered = True
            if self._failing:
                log.info("lease %s/%s: the API server answers again", self.namespace, LEASE_NAME)
                self._failing = ""
        except TimeoutError:
            log.warning("lease %s/%s: renewal did not finish within the renew deadline", self.namespace, LEASE_NAME)
        except Exception as exc:  # the API server may be restarting: keep trying until the deadline passes
            # Every retry period while the API server is away: the traceback once per reason, not each time.
            reason = failure_reason(exc)
            if reason != self._failing:
                self._failing = reason
                log.exception("lease %s/%s could not be read or renewed", self.namespace, LEASE_NAME)
        if self.is_leader != was:
            log.warning("%s %s leadership of lease %s/%s", self.identity, "took" if self.is_leader else "lost", self.namespace, LEASE_NAME)
            if self.is_leader and self.on_elected is not None:
                self._catch_up()
        return answered

    def _catch_up(self) -> None:
        """Run `on_elected` beside the renewals, not inside them: a slow or failing catch-up must neither
        delay a renewal past its deadline nor end the election. It is retried until it succeeds or this
        replica stops leading."""
        if self._catching_up is not None and not self._catching_up.done():
            return
        self._catching_up = asyncio.get_running_loop().create_task(self._run_on_elected(), name="on-elected")

    async def _run_on_elected(self) -> None:
        assert self.on_elected is not None
        failures = 0
        while self.is_leader:
            try:
                await self.on_elected()
                return
            except Exception:
                failures += 1
                delay = backoff(failures)
                log.exception("catching up after taking leadership failed (%d in a row); retrying in %.0f s", failures, delay)
                await asyncio.sleep(delay)

    async def release(self) -> None:
        """Give the Lease up (shutdown): stop leading first, then clear the holder so a follower need not
        wait a lease duration. Best effort, within the renew deadline. Never acquired again after."""
        self._stepped_down = True
        if self._catching_up is not None:
            self._catching_up.cancel()
        if self.api is None or self._renewed_at is None:
            return
        self._renewed_at = None
        try:
            await asyncio.wait_for(self._in_lease_thread(self._release), timeout=self.renew_deadline)
            log.info("%s released lease %s/%s", self.identity, self.namespace, LEASE_NAME)
        except Exception:
            log.exception("lease %s/%s could not be released; a follower takes over when it expires", self.namespace, LEASE_NAME)

    def _release(self) -> None:
        assert self.api is not None
        for attempt in range(2):  # a renewal under way may write between the read and the write: read again once
            lease = self.api.get_lease(self.namespace, LEASE_NAME)
            if lease is None or (lease.get("spec") or {}).get("holderIdentity") != self.identity:
                return
            lease["spec"].update(holderIdentity="", leaseDurationSeconds=1, renewTime=micro_time())
            try:
                self.api.replace_lease(lease)
                return
            except Conflict:
                if attempt:
                    raise

    def _try_acquire_or_renew(self) -> bool:
        assert self.api is not None
        stamp = micro_time()
        lease = self.api.get_lease(self.namespace, LEASE_NAME)
        if lease is None:
            body = {
                "apiVersion": "coordination.k8s.io/v1",
                "kind": "Lease",
                "metadata": {"name": LEASE_NAME, "namespace": self.namespace},
                "spec": {
                    "holderIdentity": self.identity,
                    "leaseDurationSeconds": self.duration,
                    "acquireTime": stamp,
                    "renewTime": stamp,
                    "leaseTransitions": 0,
                },
            }
            if self._stepped_down:  # stopping: never acquire (checked here, in the lease thread, just before the write)
                return False
            try:
                self.api.create_lease(body)
                return True
            except Conflict:
                return False
        self._observed = observe(self._observed, lease, time.monotonic())
        if held_by_another(self._observed, lease, self.identity, self.duration, time.monotonic()):
            return False
        spec = lease.setdefault("spec", {})
        if spec.get("holderIdentity") != self.identity:
            spec["acquireTime"] = stamp
            spec["leaseTransitions"] = int(spec.get("leaseTransitions") or 0) + 1
        spec.update(holderIdentity=self.identity, renewTime=stamp, leaseDurationSeconds=self.duration)
        if self._stepped_down:
            return False
        try:
            self.api.replace_lease(lease)  # carries resourceVersion
            return True
        except Conflict:  # someone else renewed or took it first
            return False
