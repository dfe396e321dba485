"""The garbage collector's full passes, kept short enough for the event loop.

CPython 3.11's collector is not incremental: a full pass holds the interpreter (every thread, and the event loop
that answers the webhooks with them) while it walks every object it tracks, about 0.7 ms per 1,000. What the
operator keeps is large: at 10,000 StormServices and 100,000 admitted pods the index and the free-room reading
are about 900,000 objects, and a full pass over them took 0.7 s (`python -m bench collector`). Those objects are
trees of dicts and tuples that their reference counts free, not the collector. So what lives long is frozen out of
the passes (gc.freeze; a frozen object is still freed when nothing uses it): everything loaded by the time the
operator is ready (operator/app.py), the free-room reading once first listed (operator/room.py), and, after any
full pass that took more than SLOW_PASS of CPU, whatever survived it, so that the next pass walks only what was
made since. That bounds passes while the cluster grows; objects that replace others (a rollout of every pod)
count nothing toward the next pass in CPython, and pile up until one comes.

The price of a freeze: a garbage cycle with a frozen member is never collected, with everything it reaches. Measured
by hand (a scratch script, not a benchmark): the operator's webhook app answering 10,000 AdmissionReviews from 16
keep-alive connections while freezing every 10 ms (258 freezes) kept 137 objects (14.5 KB), all of those
connections'; without freezes, none. `stormtopo_gc_frozen_objects` shows what is frozen.

The callback runs inside the collector, on whichever thread allocated: it only times the pass and freezes (no
lock, no log line); the figures are read at each scrape (operator/metrics.py).
"""

from __future__ import annotations

import gc
import time
from dataclasses import dataclass
from typing import Any

SLOW_PASS = 0.02  # seconds: a full pass longer than this freezes what survived it
# A full pass considered every 2 passes of the middle generation, not CPython's 10: with what lived long frozen, a
# pass walks only what survived since the last, so more of them are each shorter (bench collector, one run each: the
# longest while growing to 10,000 StormServices 36 ms instead of 60, through a rollout of every pod 89 ms, not 226).
FULL_EVERY = 2


@dataclass(eq=False)  # one instance is one callback: found in gc.callbacks by identity
class Passes:
    """What the callback saw: full passes, the longest (wall time: what the event loop waited), how many froze
    what survived them. Whether a pass was slow is judged by the CPU time of the thread that ran it: on a busy
    node the wall time of a short pass grows with the waits for a core, and a freeze then buys nothing."""

    slow: float = SLOW_PASS
    full: int = 0
    longest: float = 0.0
    freezes: int = 0
    _started: tuple[float, float] | None = None  # (wall, this thread's CPU) at the pass's start

    def __call__(self, phase: str, info: dict[str, Any]) -> None:
        if info.get("generation") != 2:
            return
        if phase == "start":
            self._started = (time.perf_counter(), time.thread_time())
            return
        if self._started is None:
            return  # installed while a pass ran: its start not seen
        (wall, cpu), self._started = self._started, None
        self.full += 1
        self.longest = max(self.longest, time.perf_counter() - wall)
        if time.thread_time() - cpu > self.slow:
            self.freezes += 1
            gc.freeze()  # what survived a full pass is alive: the next one walks only what is made after it


PASSES = Passes()


def install(slow: float = SLOW_PASS, full_every: int = FULL_EVERY) -> Passes:
    """Time every full pass, and freeze after one longer than `slow` seconds of CPU (once per process)."""
    PASSES.slow = slow
    young, middle, _ = gc.get_threshold()
    gc.set_threshold(young, middle, full_every)
    if not any(callback is PASSES for callback in gc.callbacks):
        gc.callbacks.append(PASSES)
    return PASSES


def freeze() -> None:
    """Everything alive now out of the collector's passes: at a point where what was just loaded will live long
    (the operator ready, the free-room reading listed)."""
    gc.freeze()
