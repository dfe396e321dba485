"""Explaining a pending gang, in a process of its own.

An explanation runs a packing search per domain over every node's free GPUs (the free-room reading,
room.py, passed in). The search is CPU work that holds the GIL: on a thread of the process that answers
admissions it would delay every admission (BENCHMARKS.md, "Admission while hard gangs are pending"),
and with many gangs pending continuously. In another process it costs the webhook nothing but a core it
shares with everything else.
"""

from __future__ import annotations

import asyncio
import logging
import multiprocessing
import os
import threading
import time
from collections.abc import Mapping, Sequence
from concurrent.futures import ProcessPoolExecutor
from concurrent.futures.process import BrokenProcessPool

from stormtopo.core.explanation import Pending, plan_pending
from stormtopo.core.preemption import Holder
from stormtopo.core.replica import Explain
from stormtopo.core.topology.tree import Topology
from stormtopo.core.victims import GangSize
from stormtopo.core.volcano_conf import SchedulerConf
from stormtopo.operator import metrics

log = logging.getLogger(__name__)

WORKER_NICENESS = 10  # added to the operator's: a tenth of its CPU share when both want the CPU
EXPLAIN_TIMEOUT = 120.0  # an answer later than this is not waited for (the search itself has a step budget)


def _start_worker(parent: int) -> None:
    """The worker's initializer. Explanations are background work: at a lower priority, the operator's
    answer to an admission never waits for the worker's CPU. A SIGKILLed operator cannot stop its
    worker, and the worker would wait for work forever (it holds both ends of its queue's pipe): it
    watches its parent and exits with it."""
    os.nice(WORKER_NICENESS)

    def watch() -> None:
        while os.getppid() == parent:
            time.sleep(1.0)
        os._exit(0)

    threading.Thread(target=watch, name="exit-with-parent", daemon=True).start()


def outcome(pending: Pending) -> str:
    """How an explanation ended, for stormtopo_explanations_total: out_of_budget when a domain's packing
    search ran out of its step budget and first-fit said no, which may be wrong."""
    return "exact" if pending.explanation.exact else "out_of_budget"


class Explainer:
    """Sends explanations to one worker process, started at the first pending gang and restarted if
    it dies. One worker: explanations queue behind each other rather than take both cores."""

    def __init__(self) -> None:
        self._pool: ProcessPoolExecutor | None = None

    def _executor(self) -> ProcessPoolExecutor:
        if self._pool is None:
            # spawn, not fork: the operator has threads and an event loop that a forked child would copy.
            self._pool = ProcessPoolExecutor(
                max_workers=1,
                mp_context=multiprocessing.get_context("spawn"),
                initializer=_start_worker,
                initargs=(os.getpid(),),
            )
        return self._pool

    async def explain(
        self,
        ask: Explain,
        topology: Topology,
        free: dict[str, int],
        holders: Mapping[str, Sequence[Holder]],
        gangs: dict[str, GangSize] | None = None,
        volcano: SchedulerConf | None = None,
    ) -> Pending | None:
        """Plan the explanation in the worker, over the operator's own tree (the one its placement checks use,
        built from every node), the free GPUs it read and the pods holding them, and Volcano's configuration."""
        loop = asyncio.get_running_loop()
        started = time.monotonic()
        try:
            args = (ask.request, list(ask.pods), ask.created, topology, free, holders, ask.priority, gangs, volcano)
            work = loop.run_in_executor(self._executor(), plan_pending, *args)
            pending = await asyncio.wait_for(work, EXPLAIN_TIMEOUT)
            metrics.EXPLANATION_SECONDS.observe(time.monotonic() - started)
            if pending is not None:
                metrics.EXPLANATIONS.labels(outcome(pending)).inc()
            return pending
        except TimeoutError:
            metrics.EXPLANATIONS.labels("timed_out").inc()
            raise
        except BrokenProcessPool:
            log.warning("the explanation worker died; starting another for the next explanation")
            self.close()
            return None

    def close(self) -> None:
        if self._pool is not None:
            self._pool.shutdown(wait=False, cancel_futures=True)
            self._pool = None
