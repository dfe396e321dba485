"""The operator's long-running loops: supervised, so that no exception ends one, and visible in /healthz.

Every background task the operator starts is owned by one `Loops` registry. A loop that raises is
logged (with its traceback once per change of reason, not at every retry), waits a capped exponential
backoff (reset by a success) and goes on; only cancellation ends it.

Liveness means stuck, nothing else: `/healthz` fails only when a loop of stormtopo's own
cannot run: its task ended, one iteration has not returned for HANG_SECONDS (a deadlock, an await that
never returns), or no iteration started for much longer than its period. A failed iteration is
progress: the API server down, Volcano's webhook refusing a write, a policy saying no are outside
stormtopo, and a restart fixes none of them, so they show in the metrics (when each loop last
succeeded, how often it failed) and the chart's StormtopoLoopFailing alert instead.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import re
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Collection, Coroutine, Iterable
from dataclasses import dataclass, field
from typing import Any, TypeVar

from stormtopo.kube.errors import ApiError, ApiUnavailable

log = logging.getLogger("stormtopo.loops")
BACKOFF_BASE = 1.0  # seconds before the first retry after a failure
BACKOFF_CAP = 30.0  # the longest wait between retries
# The longest wait while the API server is away (refused, timed out, 503 while it starts): a retry costs it
# nothing then, and a loop waiting out 30 s after it came back would delay placements past a resync period.
UNAVAILABLE_CAP = 5.0
STALE_PERIODS = 3  # a loop is stuck after this many periods (plus the backoff cap) without an iteration
# One iteration still running after this long (or 10 periods, for a slow loop) is stuck. Enough for a pass
# that waits its turn behind an explanation in the shared worker (EXPLAIN_TIMEOUT, 120 s) and then does its
# own work: a slow answer is no reason to restart; a deadlock is found within minutes.
HANG_SECONDS = 180.0
T = TypeVar("T")


async def yielding(items: Iterable[T], every: int = 256) -> AsyncIterator[T]:
    """The items, the event loop yielded to after every `every` of them: the webhooks, the gate and
    /healthz share this loop, and a walk over thousands of services or keys must not hold them."""
    for i, item in enumerate(items):
        if i % every == every - 1:
            await asyncio.sleep(0)
        yield item


def backoff(failures: int, base: float = BACKOFF_BASE, cap: float = BACKOFF_CAP) -> float:
    """Seconds to wait after `failures` consecutive failures: base, 2 base, 4 base ... at most cap."""
    if failures <= 0:
        return 0.0
    return float(min(cap, base * 2 ** min(failures - 1, 32)))


def stuck(
    period: float,
    last_progress: float,
    now: float,
    done: bool,
    cap: float = BACKOFF_CAP,
    busy_since: float | None = None,
    hang: float = HANG_SECONDS,
) -> str | None:
    """Why a loop counts as stuck, or None while it is healthy. `last_progress` is when it last ended an
    iteration, failed or not (or started); `busy_since` when the iteration under way began (None between
    iterations). A loop whose task ended has died: nothing restarts it."""
    if done:
        return "its task ended"
    if busy_since is not None:
        limit = max(hang, 10 * period)
        if now - busy_since > limit:
            return f"one iteration running for {now - busy_since:.0f} s (allowed {limit:.0f} s)"
        return None
    allowed = STALE_PERIODS * period + cap
    if now - last_progress > allowed:
        return f"no iteration completed for {now - last_progress:.0f} s (allowed {allowed:.0f} s)"
    return None


async def run_every(
    loop: Loop,
    seconds: float,
    work: Callable[[], Awaitable[None]],
    when: Callable[[], bool] = lambda: True,
    wake: asyncio.Event | None = None,
    min_gap: float = 0.0,
) -> None:
    """Run `work` every `seconds` while `when()` holds, forever, recording each iteration in `loop`; sooner
    when `wake` is set, but never within `min_gap` of the last start, nor during a backoff. A failure
    is logged with its traceback and retried after a backoff; only cancellation ends it."""
    delay = seconds
    started = float("-inf")
    while True:
        if wake is None or loop.failures:
            await asyncio.sleep(delay)
        else:
            # asyncio.timeout, not wait_for: on Python 3.11 wait_for may swallow a cancellation that comes as
            # the event is set (woken often, the loop then outlived Loops.stop(): a test hung 600 s in CI).
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(delay):
                    await wake.wait()
            await asyncio.sleep(max(0.0, started + min_gap - time.monotonic()))  # events during a pass: one more, not many
            wake.clear()
        started = time.monotonic()
        loop.busy_since = loop.clock()
        try:
            if when():
                await work()
        except Exception as exc:  # anything but cancellation
            delay = loop.failed(exc)
            continue
        finally:
            loop.busy_since = None
        loop.succeeded()
        delay = seconds


def failure_reason(exc: BaseException) -> str:
    """What a failure is, for the log: its type and the first line of its message without digits (a
    resourceVersion, a port, a count differ from one attempt to the next; the reason does not)."""
    first = str(exc).splitlines()[0] if str(exc) else ""
    return f"{type(exc).__name__}: {re.sub(r'[0-9]+', '#', first)[:200]}"


def _unavailable(exc: BaseException) -> bool:
    return isinstance(exc, ApiUnavailable) or (isinstance(exc, ApiError) and exc.unavailable)


def _power_of_ten(n: int) -> bool:
    while n >= 10 and n % 10 == 0:
        n //= 10
    return n == 1


@dataclass
class Loop:
    """One supervised loop's record: what /healthz reports."""

    name: str
    period: float  # how often it is expected to complete an iteration
    started: float
    last_success: float | None = None
    last_progress: float | None = None  # an iteration ended, failed or not
    busy_since: float | None = None  # when the iteration under way began (run_every's loops)
    failures: int = 0  # consecutive
    failures_total: int = 0  # since the process started: the metric stormtopo_loop_failures_total
    last_error: str = ""
    _logged_reason: str = field(default="", repr=False)  # the failure last logged with its traceback
    task: asyncio.Task[None] | None = field(default=None, repr=False)
    clock: Callable[[], float] = field(default=time.monotonic, repr=False)
    hang: float = HANG_SECONDS  # one iteration running longer than this (or 10 periods) is stuck (--hang-seconds)

    def succeeded(self) -> None:
        """An iteration completed (or, for a stream, it made progress)."""
        if self.failures:
            log.info("%s succeeded again after %d failures (the last: %s)", self.name, self.failures, self.last_error)
        self.last_success = self.last_progress = self.clock()
        self.failures = 0
        self._logged_reason = ""

    def alive(self) -> None:
        """Still going, though the work did not succeed (it handles the failure and retries itself):
        not stuck. A loop waiting on an unreachable API server is no reason to restart the replica."""
        self.last_progress = self.clock()

    def failed(self, exc: BaseException) -> float:
        """Record a failure and log it; return how long to wait before the next attempt. A failure is
        progress (the loop runs; what failed is outside it). The traceback is logged when the reason
        changes, a line at each retry after that would say nothing new: a warning at the 1st, 10th,
        100th ... failure of the same reason."""
        self.failures += 1
        self.failures_total += 1
        self.last_progress = self.clock()
        self.last_error = f"{type(exc).__name__}: {exc}"[:300]
        delay = backoff(self.failures, cap=UNAVAILABLE_CAP) if _unavailable(exc) else backoff(self.failures)
        reason = failure_reason(exc)
        if reason != self._logged_reason:
            self._logged_reason = reason
            log.error("%s failed: %s; retrying in %.0f s", self.name, self.last_error, delay, exc_info=exc)
        elif _power_of_ten(self.failures):
            log.warning("%s still failing (%d in a row): %s; retrying in %.0f s", self.name, self.failures, self.last_error, delay)
        return delay

    def problem(self, now: float) -> str | None:
        done = self.task is not None and self.task.done()
        last = self.last_progress if self.last_progress is not None else self.started
        return stuck(self.period, last, now, done, busy_since=self.busy_since, hang=self.hang)

    def report(self, now: float) -> dict[str, Any]:
        return {
            "period_seconds": self.period,
            "last_success_seconds_ago": None if self.last_success is None else round(now - self.last_success, 1),
            "consecutive_failures": self.failures,
            "last_error": self.last_error,
            "problem": self.problem(now),
        }


class Loops:
    """The owner of the operator's background tasks: starts them supervised, reports their health, and
    cancels them all on shutdown."""

    def __init__(self, clock: Callable[[], float] = time.monotonic, hang: float = HANG_SECONDS) -> None:
        self.clock = clock
        self.hang = hang
        self.loops: dict[str, Loop] = {}
        self.probes: dict[str, Callable[[float], str | None]] = {}  # what else /healthz asks: the work queues
        self.notes: dict[str, Callable[[], dict[str, Any]]] = {}  # what else /healthz shows, never a problem

    def probe(self, name: str, stuck: Callable[[float], str | None]) -> None:
        """Report `stuck(hang)` in /healthz beside the loops (a work queue whose worker is wedged)."""
        self.probes[name] = stuck

    def note(self, name: str, report: Callable[[], dict[str, Any]]) -> None:
        """Show `report()` in /healthz beside the loops, as information (what kopf's watches missed)."""
        self.notes[name] = report

    def _record(self, name: str, period: float) -> Loop:
        if name in self.loops:
            raise ValueError(f"a loop named {name!r} runs already")
        loop = Loop(name, period, self.clock(), clock=self.clock, hang=self.hang)
        self.loops[name] = loop
        return loop

    def every(
        self,
        name: str,
        seconds: float,
        work: Callable[[], Awaitable[None]],
        when: Callable[[], bool] = lambda: True,
        wake: asyncio.Event | None = None,
        min_gap: float = 0.0,
    ) -> Loop:
        """Run `work` every `seconds` while `when()` holds, sooner when `wake` is set (at most once a
        `min_gap`); an iteration skipped by `when` still counts."""
        loop = self._record(name, seconds)
        loop.task = self._spawn(name, run_every(loop, seconds, work, when, wake, min_gap))
        return loop

    def supervise(self, name: str, period: float, run: Callable[[Loop], Awaitable[None]]) -> Loop:
        """Run `run(loop)` forever: a stream or a worker that calls `loop.succeeded()` itself as it makes
        progress, at least once a `period`. If it raises or returns, it is started again after a backoff."""
        loop = self._record(name, period)

        async def body() -> None:
            while True:
                try:
                    await run(loop)
                    raise RuntimeError("returned")  # a forever-loop that returns is a bug: restart it
                except Exception as exc:
                    await asyncio.sleep(loop.failed(exc))

        loop.task = self._spawn(name, body())
        return loop

    def _spawn(self, name: str, coroutine: Coroutine[Any, Any, None]) -> asyncio.Task[None]:
        task = asyncio.get_running_loop().create_task(coroutine, name=name)
        task.add_done_callback(self._ended)
        return task

    @staticmethod
    def _ended(task: asyncio.Task[None]) -> None:
        # Only cancellation should end a supervised loop; anything else is reported, not left for
        # "Task exception was never retrieved" at shutdown.
        if not task.cancelled() and task.exception() is not None:
            log.error("background task %s died", task.get_name(), exc_info=task.exception())

    def health(self) -> tuple[bool, dict[str, Any]]:
        """(every loop healthy, a report per loop)."""
        now = self.clock()
        reports = {name: loop.report(now) for name, loop in sorted(self.loops.items())}
        reports |= {name: {"problem": stuck(self.hang)} for name, stuck in sorted(self.probes.items())}
        reports |= {name: {"problem": None, **report()} for name, report in sorted(self.notes.items())}
        return all(r["problem"] is None for r in reports.values()), reports

    async def stop(self, names: Collection[str] | None = None) -> None:
        """Cancel every loop (or those named) and wait until they have ended."""
        tasks = [loop.task for name, loop in self.loops.items() if loop.task is not None and (names is None or name in names)]
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
