"""The garbage collector's passes, kept short enough for the event loop.

CPython 3.11's collector is not incremental: a pass holds the interpreter (every thread, and the event loop that
answers the webhooks with them) while it walks every object of the generations it collects, about 0.7 ms per 1,000.
What the operator keeps is large: at 10,000 StormServices and 100,000 admitted pods the index and the free-room
reading are about 900,000 objects, and a full pass over them took 0.7 s (`python -m bench collector`). Those
objects are trees of dicts and tuples that their reference counts free, not the collector. So what lives long is
frozen out of the passes (gc.freeze; a frozen object is still freed when nothing uses it): everything loaded by the
time the operator is ready (operator/app.py), the free-room reading once first listed (operator/room.py), and,
after any full pass that took more than SLOW_PASS of CPU, whatever survived it, so that the next passes walk only
what was made since. A middle pass that slow asks for a full pass at once (a thread of its own runs it: a pass
cannot start another), which then freezes: not the middle pass itself, since only a full pass collects the
garbage cycles that died in the oldest generation, and a freeze would keep them for good. The young generation's
passes are not judged: what survived one pass only is mostly what the next event replaces.

Two things keep a freeze from holding. A dict of only strings, numbers and tuples of them (a reading keyed by
namespace and name) is untracked by a full pass, and tracked again, in the youngest generation, by the next fresh
tuple it is given, as a key or a value, new or replacing an equal one: every pass walks it whole from then (2.5 ms
per 100,000 entries) until a full pass untracks it again. Such dicts are LongLived: always tracked, so once frozen
they stay frozen (a dict holding dicts is never untracked: it needs nothing). And objects that replace others (a
rollout replacing every pod) count nothing toward CPython's next pass, which comes later and walks more: the
generations' thresholds are (CPython's young one, MIDDLE_EVERY, FULL_EVERY), so that a middle pass comes after 4
young ones (CPython: 11) and what survives a pass reaches a judged pass soon.

The price of a freeze: a garbage cycle with a frozen member is never collected, with everything it reaches. Since a
freeze comes right after a full pass, what it keeps is cycles alive then that die later. Measured by hand (a scratch
script, not a benchmark): the operator's webhook app answering 10,000 AdmissionReviews from 16 keep-alive
connections while freezing every 10 ms (258 freezes) kept 137 objects (14.5 KB), all of those connections';
without freezes, none. Freezes come with growth and churn (about 80 per 100,000 pods created or replaced in the
benchmark); at rest, at most a few per re-list of a very large cluster (a re-list of 100,000 pods made full passes
of about 5 ms). `stormtopo_gc_frozen_objects` shows what is frozen.

The callback runs inside the collector, on whichever thread allocated: it only times the pass, freezes or asks for a
full pass (no lock, no log line); the figures are read at each scrape (operator/metrics.py).
"""

from __future__ import annotations

import contextlib
import gc
import logging
import os
import threading
import time
from dataclasses import dataclass, field
from typing import Any, TypeVar

SLOW_PASS = 0.0025  # seconds of CPU: a full pass longer than this freezes; a middle one, a full pass next
# The older generations' thresholds (CPython: 10, 10): a middle pass once more than 3 young passes ran since the last,
# a full one once more than 2 middle ones did. More, shorter passes: with what lived long frozen, a pass walks only
# what survived since the last (bench collector: see BENCHMARKS.md).
MIDDLE_EVERY = 3
FULL_EVERY = 2
GENERATIONS = 3

log = logging.getLogger("stormtopo.collector")
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
    # A middle pass was slow: a full pass next, by full_passes, woken through a pipe (`wake`: its writing end). No
    # lock: the callback runs at any allocation, inside whatever its thread holds (a threading.Event's own lock, say).
    full_due: bool = False
    wake: int | None = None
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
        if generation == 0 or time.thread_time() - cpu <= self.slow:
            return
        if generation == 1:
            self.full_due = True  # (full_passes: a pass cannot start another)
            if self.wake is not None:
                with contextlib.suppress(OSError):  # (full: a wake-up is waiting already)
                    os.write(self.wake, b"\0")
            return
        self.freezes += 1
        gc.freeze()  # what survived a full pass is alive: the next ones walk only what is made after it


PASSES = Passes()
_FULL_PASSES: list[threading.Thread] = []  # the thread that runs the full passes slow middle ones ask for (one)


def full_passes(passes: Passes, woken: int, pause: float = 1.0) -> None:
    """A full pass as soon as a middle pass was slow, each time `woken` (a pipe's reading end) is written to, until
    its writing end is closed (never, for the operator's daemon thread). It holds the interpreter as any pass does:
    about as long as the middle pass, since what survived that pass is most of what it walks (bench collector)."""
    while os.read(woken, 512):
        while passes.full_due:
            passes.full_due = False
            full = passes.passes[2]
            try:
                gc.collect()
            except Exception:  # (none is known: but a loop that dies in silence is the worst bug)
                log.exception("a full pass of the garbage collector failed; trying again in %.0f s", pause)
                time.sleep(pause)
            if passes.passes[2] == full:  # it did nothing: the pass that asked (writing the pipe) was not over yet
                passes.full_due = True
                time.sleep(0.001)


def install(slow: float = SLOW_PASS, middle_every: int = MIDDLE_EVERY, full_every: int = FULL_EVERY) -> Passes:
    """Time every pass, freeze after a full one longer than `slow` seconds of CPU, and run a full pass after a
    middle one as slow (installed once per process)."""
    PASSES.slow = slow
    young, _, _ = gc.get_threshold()
    gc.set_threshold(young, middle_every, full_every)
    if not any(callback is PASSES for callback in gc.callbacks):
        gc.callbacks.append(PASSES)
    if not _FULL_PASSES:
        woken, PASSES.wake = os.pipe()
        os.set_blocking(PASSES.wake, False)
        _FULL_PASSES.append(threading.Thread(target=full_passes, args=(PASSES, woken), name="stormtopo-full-passes", daemon=True))
        _FULL_PASSES[0].start()
    return PASSES


def freeze() -> None:
    """Everything alive now out of the collector's passes: at a point where what was just loaded will live long
    (the operator ready, the free-room reading listed)."""
    gc.freeze()
