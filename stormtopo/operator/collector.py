"""The garbage collector's full passes, kept short enough for the event loop.

CPython 3.11's collector is not incremental: a full pass holds the interpreter (every thread, and the event loop
that answers the webhooks with them) while it walks every object it tracks, about 0.7 ms per 1,000. What the
operator keeps is large: at 10,000 StormServices and 100,000 admitted pods the index and the free-room reading
are about a million objects, and a full pass over them took 0.7 s; passes come again as the cluster grows or its
pods churn (`python -m bench collector`). Those objects are trees of dicts and tuples that their reference counts
free, not the collector. So what lives long is frozen out of the passes (gc.freeze; a frozen object is still freed
when nothing uses it): everything loaded by the time the operator is ready (operator/app.py), the free-room
reading once listed (operator/room.py), and, after any full pass longer than SLOW_PASS, whatever survived it, so
that the next pass walks only what was made since. The price: a reference cycle among frozen objects that later
becomes garbage is never collected (measured by the same benchmark: what a final pass over everything found).

The callback runs inside the collector, on whichever thread allocated: it only times the pass and freezes (no
lock, no log line); the figures are read at each scrape (operator/metrics.py).
"""

from __future__ import annotations

import gc
import time
from dataclasses import dataclass
from typing import Any

SLOW_PASS = 0.02  # seconds: a full pass longer than this freezes what survived it


@dataclass
class Passes:
    """What the callback saw: full passes, the longest, how many froze what survived them."""

    slow: float = SLOW_PASS
    full: int = 0
    longest: float = 0.0
    freezes: int = 0
    _started: float = 0.0

    def __call__(self, phase: str, info: dict[str, Any]) -> None:
        if info.get("generation") != 2:
            return
        if phase == "start":
            self._started = time.perf_counter()
            return
        took = time.perf_counter() - self._started
        self.full += 1
        self.longest = max(self.longest, took)
        if took > self.slow:
            self.freezes += 1
            gc.freeze()  # what survived a full pass is alive: the next one walks only what is made after it


PASSES = Passes()


def install(slow: float = SLOW_PASS) -> Passes:
    """Time every full pass, and freeze after one longer than `slow` seconds (once per process)."""
    PASSES.slow = slow
    if PASSES not in gc.callbacks:
        gc.callbacks.append(PASSES)
    return PASSES


def freeze() -> None:
    """Everything alive now out of the collector's passes: at a point where what was just loaded will live long
    (the operator ready, the free-room reading listed)."""
    gc.freeze()
