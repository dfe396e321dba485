"""Explaining a pending gang, in a process of its own.

An explanation reads every node's free GPUs (a list of every bound pod in the cluster, parsed) and runs
a packing search per domain. Both are CPU work that holds the GIL: json.loads of a 250-pod page cannot
be interrupted at all. On a thread of the process that answers admissions they delay every admission
(BENCHMARKS.md, "Admission while hard gangs are pending"), and with many gangs pending they would
delay it continuously. In another process they cost the webhook nothing but a core it shares with
everything else. The worker keeps its own API client and its own cached readings.
"""

from __future__ import annotations

import asyncio
import logging
import multiprocessing
import os
import threading
import time
from collections.abc import Sequence
from concurrent.futures import ProcessPoolExecutor
from concurrent.futures.process import BrokenProcessPool

from stormtopo.core.explanation import Pending, plan_pending
from stormtopo.core.request import TopologyRequest
from stormtopo.core.topology.tree import Topology
from stormtopo.kube.client import Api
from stormtopo.operator import metrics

log = logging.getLogger(__name__)

FREE_GPUS_TTL = 5.0  # seconds a reading of every node's free GPUs is reused, however many gangs are pending
WORKER_NICENESS = 10  # added to the operator's: a tenth of its CPU share when both want the CPU
EXPLAIN_TIMEOUT = 120.0  # an answer later than this is not waited for (the search itself has a step budget)


class _Worker:
    """The worker process's state: one API client, the last readings."""

    api: Api | None = None
    free: tuple[float, dict[str, int]] = (float("-inf"), {})
    schedulable: tuple[float, dict[str, int]] = (float("-inf"), {})  # healing's: nodes that take new pods only
    allocatable: tuple[float, dict[str, int]] = (float("-inf"), {})  # making room's: every node's allocatable GPUs


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


def _stale(read_at: float, ttl: float) -> bool:
    return time.monotonic() - read_at > ttl


def explain_in_worker(
    kubeconfig: str | None, request: TopologyRequest, pods: Sequence[int], created: int, topology: Topology
) -> Pending | None:
    """Runs in the worker: read free GPUs, then plan over the operator's own tree (the one its
    placement checks use, built from every node)."""
    return plan_pending(request, pods, created, topology, free_gpus_in_worker(kubeconfig))


def free_gpus_in_worker(kubeconfig: str | None, taking_new_pods: bool = False, max_age: float = FREE_GPUS_TTL) -> dict[str, int]:
    """Runs in the worker: every node's free GPUs, the reading the explanations share (healing's and the
    node tier's: only nodes that take new pods), no older than `max_age`."""
    if _Worker.api is None:
        _Worker.api = Api(kubeconfig)
    if taking_new_pods:
        if _stale(_Worker.schedulable[0], max_age):
            _Worker.schedulable = (time.monotonic(), _Worker.api.free_gpus(taking_new_pods=True))
        return _Worker.schedulable[1]
    if _stale(_Worker.free[0], max_age):
        _Worker.free = (time.monotonic(), _Worker.api.free_gpus())
    return _Worker.free[1]


def allocatable_gpus_in_worker(kubeconfig: str | None) -> dict[str, int]:
    """Runs in the worker: every node's allocatable GPUs (what a HyperNode's binpack divides by)."""
    if _Worker.api is None:
        _Worker.api = Api(kubeconfig)
    if _stale(_Worker.allocatable[0], FREE_GPUS_TTL):
        _Worker.allocatable = (time.monotonic(), _Worker.api.gpu_totals())
    return _Worker.allocatable[1]


def outcome(pending: Pending) -> str:
    """How an explanation ended, for stormtopo_explanations_total: out_of_budget when a domain's packing
    search ran out of its step budget and first-fit said no, which may be wrong."""
    return "exact" if pending.explanation.exact else "out_of_budget"


class Explainer:
    """Sends explanations to one worker process, started at the first pending gang and restarted if
    it dies. One worker: explanations queue behind each other rather than take both cores."""

    def __init__(self, kubeconfig: str | None) -> None:
        self.kubeconfig = kubeconfig
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

    async def explain(self, request: TopologyRequest, pods: Sequence[int], created: int, topology: Topology) -> Pending | None:
        loop = asyncio.get_running_loop()
        started = time.monotonic()
        try:
            work = loop.run_in_executor(self._executor(), explain_in_worker, self.kubeconfig, request, list(pods), created, topology)
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

    async def free_gpus(self, max_age: float = FREE_GPUS_TTL) -> dict[str, int]:
        """Free GPUs of every node that takes new pods, read in the worker (healing's reading), at
        most `max_age` seconds old."""
        loop = asyncio.get_running_loop()
        try:
            work = loop.run_in_executor(self._executor(), free_gpus_in_worker, self.kubeconfig, True, max_age)
            return await asyncio.wait_for(work, EXPLAIN_TIMEOUT)
        except BrokenProcessPool:
            log.warning("the explanation worker died; starting another for the next reading")
            self.close()
            raise

    async def allocatable_gpus(self) -> dict[str, int]:
        """Allocatable GPUs of every node, read in the worker (making room's reading)."""
        loop = asyncio.get_running_loop()
        try:
            work = loop.run_in_executor(self._executor(), allocatable_gpus_in_worker, self.kubeconfig)
            return await asyncio.wait_for(work, EXPLAIN_TIMEOUT)
        except BrokenProcessPool:
            log.warning("the explanation worker died; starting another for the next reading")
            self.close()
            raise

    def close(self) -> None:
        if self._pool is not None:
            self._pool.shutdown(wait=False, cancel_futures=True)
            self._pool = None
