"""The garbage collector's passes, kept short enough for the event loop.

CPython 3.11's collector is not incremental: a pass holds the interpreter (every thread, and the event loop that
answers the webhooks with them) while it walks every object of the generations it collects, about 0.7 ms per 1,000.
What the operator keeps is large: at 10,000 StormServices and 100,000 admitted pods the index and the free-room
reading are about 900,000 objects, and a full pass over them took 0.7 s (`python -m bench collector`). Those
objects are trees of dicts and tuples that their reference counts free, not the collector. So what lives long is
frozen out of the passes (gc.freeze; a frozen object is still freed when nothing uses it): everything loaded by the
time the operator is ready (operator/app.py), the free-room reading once first listed (operator/room.py), and,
after any pass of the middle or the oldest generation that took more than SLOW_PASS of CPU, whatever survived it,
so that the next passes walk only what was made since. The young generation's passes are not judged: what survived
one pass only is mostly what the next event replaces.

Two things keep a freeze from holding. A dict of strings and tuples of strings (a reading keyed by namespace and
name) is untracked by a full pass, and tracked again, in the youngest generation, by the next key it is given:
every pass walks it whole from then (2.5 ms per 100,000 entries) until a full pass untracks it again. Such dicts are
LongLived: always tracked, so once frozen they stay frozen. And objects that replace others (a rollout replacing
every pod) count nothing toward CPython's next pass, which comes later and walks more: the middle generation is
collected every MIDDLE_EVERY passes of the young one, not CPython's 10, so that what survives a pass reaches a
judged pass soon.

The price of a freeze: a garbage cycle with a frozen member is never collected, with everything it reaches. A freeze
after a middle pass also keeps cycles that died since the last full pass. Measured by hand (a scratch script, not
a benchmark): the operator's webhook app answering 10,000 AdmissionReviews from 16 keep-alive connections while
freezing every 10 ms (258 freezes) kept 137 objects (14.5 KB), all of those connections'; without freezes, none.
Freezes come only with growth or churn (tens per 100,000 pods), none at rest. `stormtopo_gc_frozen_objects` shows
what is frozen.

The callback runs inside the collector, on whichever thread allocated: it only times the pass and freezes (no
lock, no log line); the figures are read at each scrape (operator/metrics.py).
"""

from __future__ import annotations

import gc
import time
from dataclasses import dataclass, field
from typing import Any, TypeVar

SLOW_PASS = 0.005  # seconds of CPU: a middle or full pass longer than this freezes what survived it
# Passes of the younger generation between two of the older (CPython: 10, 10). More, shorter passes: with what
# lived long frozen, a pass walks only what survived since the last (bench collector: see BENCHMARKS.md).
MIDDLE_EVERY = 3
FULL_EVERY = 2
GENERATIONS = 3

K = TypeVar("K")
V = TypeVar("V")


class LongLived(dict[K, V]):
    """A dict kept for the process's life, always tracked by the collector (CPython untracks exact dicts only), so
    that once frozen it stays out of every pass however its entries change."""

    __slots__ = ()


@dataclass(eq=False)  # one instance is one callback: found in gc.callbacks by identity
class Passes:
    """What the callback saw, per generation: passes, the longest (wall time: what the event loop waited); and how
    many froze what survived them. Whether a pass was slow is judged by the CPU time of the thread that ran it: on
    a busy node the wall time of a short pass grows with the waits for a core, and a freeze then buys nothing."""

    slow: float = SLOW_PASS
    passes: list[int] = field(default_factory=lambda: [0] * GENERATIONS)
    longest: list[float] = field(default_factory=lambda: [0.0] * GENERATIONS)
    freezes: int = 0
    _started: tuple[int, float, float] | None = None  # (generation, wall, this thread's CPU) at the pass's start

    def __call__(self, phase: str, info: dict[str, Any]) -> None:
        generation = info.get("generation")
        if not isinstance(generation, int) or not 0 <= generation < GENERATIONS:
            return
        if phase == "start":
            self._started = (generation, time.perf_counter(), time.thread_time())
            return
        if self._started is None or self._started[0] != generation:
            return  # installed while a pass ran: its start not seen
        (_, wall, cpu), self._started = self._started, None
        self.passes[generation] += 1
        self.longest[generation] = max(self.longest[generation], time.perf_counter() - wall)
        if generation > 0 and time.thread_time() - cpu > self.slow:
            self.freezes += 1
            gc.freeze()  # what survived a middle or full pass is alive: the next ones walk only what is made after


PASSES = Passes()


def install(slow: float = SLOW_PASS, middle_every: int = MIDDLE_EVERY, full_every: int = FULL_EVERY) -> Passes:
    """Time every pass, and freeze after a middle or full one longer than `slow` seconds of CPU (once per process)."""
    PASSES.slow = slow
    young, _, _ = gc.get_threshold()
    gc.set_threshold(young, middle_every, full_every)
    if not any(callback is PASSES for callback in gc.callbacks):
        gc.callbacks.append(PASSES)
    return PASSES


def freeze() -> None:
    """Everything alive now out of the collector's passes: at a point where what was just loaded will live long
    (the operator ready, the free-room reading listed)."""
    gc.freeze()
