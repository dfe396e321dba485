"""`python -m bench loop-stall`: the leader's event loop while a resync queues every StormService and RoleSet
(issue 42, item 3), without a cluster.

The webhooks, the gate and /healthz share one asyncio loop with the work queues' workers. A resync queues every
StormService and RoleSet of every tenant; a handler with nothing to do (a service that never opted in) returns
without awaiting, and `asyncio.Queue.get()` does not suspend while keys wait, so a worker that never yields
holds the loop until every key is drained. Measured here with the operator's own pieces: the index holding
SERVICES StormServices that never opted in, each with ROLESETS_PER replicas; the real Reconciler (its pure plan
and its writes, of which there are none for such a service) behind the StormServices queue, the placement
planner (plan_replica over the index's snapshot) behind the RoleSets queue. While the resync's keys drain:
- a ticker sleeps 1 ms at a time and records how late each wake-up is: the longest is the loop's longest stall;
- a probe admits an AIBrix pod of a service that never opted in (core/admission.py admit_pod, what the pod
  webhook does for it) every 5 ms, and records the time from its arrival (every 5 ms, whatever the loop
  does: one due while the loop was held waits from when it was due) to its answer: p99 and max.
The same run measures the resync and the work queue as they were before they yielded (the resync queued
every key at once, a worker took the next key at once: the baseline), and as they are: both and their ratio.
"""

from __future__ import annotations

import asyncio
import statistics
import time
from collections.abc import Awaitable, Callable, Hashable
from typing import Any, cast

from stormtopo.core.admission import admit_pod
from stormtopo.core.replica import ReplicaMemory, plan_replica
from stormtopo.devenv.workloads import stormservice
from stormtopo.operator.handlers import RESYNC_CHUNK
from stormtopo.operator.index import Index
from stormtopo.operator.optin import OptedInList
from stormtopo.operator.reconciliation import Reconciler
from stormtopo.operator.workqueue import WorkQueue

PROBE_EVERY = 0.005  # seconds between two pod admissions of the probe
TICK = 0.001


class QueueBefore(WorkQueue[Hashable]):
    """The work queue as it was: the next key at once, whatever waits on the loop."""

    async def _work(self) -> None:
        while True:
            key = await self._queue.get()
            self._waiting.discard(key)
            self._active.add(key)
            try:
                await self._handle(key)
            except Exception:  # as the real one: one broken key does not stop the others
                pass
            finally:
                self._active.discard(key)
                if key in self._waiting:
                    self._queue.put_nowait(key)


def cluster(services: int, replicas: int) -> Index:
    """The index as the leader holds it: `services` StormServices that never opted in, `replicas` RoleSets each."""
    index = Index(cast(Any, None))
    for i in range(services):
        svc = stormservice(f"svc-{i:05d}", f"team-{i % 100:03d}")
        svc["metadata"]["uid"] = f"uid-{i}"
        index.observe("StormService", "ADDED", svc)
        for r in range(replicas):
            roleset = {
                "kind": "RoleSet",
                "metadata": {
                    "name": f"svc-{i:05d}-roleset-{r:05d}",
                    "namespace": f"team-{i % 100:03d}",
                    "labels": {"storm-service-name": f"svc-{i:05d}"},
                },
                "spec": svc["spec"]["template"]["spec"],
            }
            index.observe("RoleSet", "ADDED", roleset)
    return index


def probe_pod(index: Index) -> tuple[dict[str, Any], dict[str, Any], dict[str, Any]]:
    """An AIBrix pod of a service that never opted in, with its RoleSet and StormService."""
    (namespace, name), roleset = next(iter(index.rolesets.items()))
    service = index.stormservices[(namespace, roleset["metadata"]["labels"]["storm-service-name"])]
    labels = {"storm-service-name": service["metadata"]["name"], "roleset-name": name, "role-name": "prefill"}
    pod = {"metadata": {"name": f"{name}-prefill-0", "namespace": namespace, "labels": labels}, "spec": {"containers": [{"name": "c"}]}}
    return pod, roleset, service


async def drain(index: Index, queue_kind: type[WorkQueue[Hashable]], chunk: int | None) -> dict[str, float]:
    """Queue every key as the resync does (yielding every `chunk` keys; None: never, as it did before) and
    drain both queues, with the ticker and the probe running."""
    reconciler = Reconciler(index, cast(Any, None), cast(Any, None), OptedInList(cast(Any, None)))

    async def reconcile(key: Hashable) -> None:
        body = index.stormservices.get(cast(Any, key))
        if body is not None:
            await reconciler.reconcile(body)

    async def place(key: Hashable) -> None:
        snapshot = index.replica_snapshot(cast(Any, key), time.monotonic())
        if snapshot is not None:
            plan_replica(snapshot, ReplicaMemory())

    handlers: list[Callable[[Hashable], Awaitable[None]]] = [reconcile, place]
    services, placements = (
        queue_kind(name, handle, workers=4) for name, handle in zip(("stormservices", "placements"), handlers, strict=True)
    )
    loop = asyncio.get_running_loop()
    stalls: list[float] = []
    answers: list[float] = []
    pod, roleset, service = probe_pod(index)
    done = asyncio.Event()

    async def ticker() -> None:
        while not done.is_set():
            started = loop.time()
            await asyncio.sleep(TICK)
            stalls.append(loop.time() - started - TICK)

    async def admit(asked: float) -> None:
        admit_pod(pod, roleset, service, index.cluster_tiers())
        answers.append(loop.time() - asked)

    async def prober() -> None:
        # Requests arrive every PROBE_EVERY whatever the loop does (the API server sends them): those due
        # while the loop was held are taken as arrived when due, and wait from then.
        pending: set[asyncio.Task[None]] = set()
        due = loop.time()
        while not done.is_set():
            while due <= loop.time():
                task = loop.create_task(admit(due))
                pending.add(task)
                task.add_done_callback(pending.discard)
                due += PROBE_EVERY
            await asyncio.sleep(max(0.0, due - loop.time()))
        await asyncio.gather(*pending)

    watchers = [loop.create_task(ticker()), loop.create_task(prober())]
    await asyncio.sleep(0.05)
    started = loop.time()
    services.start()
    placements.start()
    for i, key in enumerate(list(index.stormservices)):  # the resync, as handlers.Operator.resync queues
        services.add(key)
        if chunk is not None and i % chunk == chunk - 1:
            await asyncio.sleep(0)
    for i, key in enumerate(list(index.rolesets)):
        placements.add(key)
        if chunk is not None and i % chunk == chunk - 1:
            await asyncio.sleep(0)
    while len(services) or len(placements):
        await asyncio.sleep(0.01)
    drained = loop.time() - started
    done.set()
    await asyncio.gather(*watchers)
    for task in (*services._tasks, *placements._tasks):
        task.cancel()
    ordered = sorted(answers)
    return {
        "drain_seconds": round(drained, 3),
        "longest_stall_ms": round(1000 * max(stalls), 2),
        "webhook_p99_ms": round(1000 * ordered[int(0.99 * (len(ordered) - 1))], 2),
        "webhook_max_ms": round(1000 * ordered[-1], 2),
        "webhook_median_ms": round(1000 * statistics.median(ordered), 3),
        "probes": len(answers),
    }


def run(services: int, replicas: int) -> dict[str, Any]:
    index = cluster(services, replicas)
    before = asyncio.run(drain(index, QueueBefore, None))
    after = asyncio.run(drain(index, cast(type[WorkQueue[Hashable]], WorkQueue), RESYNC_CHUNK))
    return {
        "services": services,
        "rolesets": len(index.rolesets),
        "before": before,
        "after": after,
        "longest_stall_ratio": round(after["longest_stall_ms"] / before["longest_stall_ms"], 4) if before["longest_stall_ms"] else None,
    }
