"""`python -m bench loop-stall`: the leader's event loop while a resync queues every StormService and RoleSet, and
while a re-list prunes what it no longer has (issue 42, item 3), without a cluster.

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
Then, with four admitted pods per RoleSet in the index (120,000 at the defaults), a re-list's prunes of every kind
(handlers.Operator.relist), nothing gone: as they were (every kind's keys walked in one go for each kind) and as
they are (per kind, a slice at a time).
"""

from __future__ import annotations

import asyncio
import statistics
import tempfile
import threading
import time
from collections.abc import Awaitable, Callable, Hashable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any, cast

from bench.admission_load import Probe, Webhook, open_loop
from stormtopo.core.admission import admit_pod
from stormtopo.core.replica import ReplicaMemory, plan_replica
from stormtopo.devenv import cluster as dev
from stormtopo.devenv.workloads import stormservice
from stormtopo.kube.client import Api
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


async def drain(index: Index, queue_kind: type[WorkQueue[Hashable]], chunk: int | None) -> dict[str, Any]:
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
    pod, roleset, service = probe_pod(index)
    watch = LoopWatch(lambda: admit_pod(pod, roleset, service, index.cluster_tiers()))
    async with watch:
        loop = asyncio.get_running_loop()
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
    for task in (*services._tasks, *placements._tasks):
        task.cancel()
    return {"drain_seconds": round(drained, 3), **watch.result()}


class LoopWatch:
    """While entered: a ticker that sleeps TICK at a time and records how late each wake-up is (the longest is
    the loop's longest stall), and a probe that calls `admit` (what the pod webhook does for a pod) every
    PROBE_EVERY and records the time from its arrival to its answer."""

    def __init__(self, admit: Callable[[], object]) -> None:
        self.admit = admit
        self.stalls: list[float] = []
        self.answers: list[float] = []
        self._done = asyncio.Event()
        self._tasks: list[asyncio.Task[None]] = []

    async def __aenter__(self) -> LoopWatch:
        loop = asyncio.get_running_loop()
        self._tasks = [loop.create_task(self._ticker()), loop.create_task(self._prober())]
        await asyncio.sleep(0.05)
        return self

    async def __aexit__(self, *_: object) -> None:
        self._done.set()
        await asyncio.gather(*self._tasks)

    async def _ticker(self) -> None:
        loop = asyncio.get_running_loop()
        while not self._done.is_set():
            started = loop.time()
            await asyncio.sleep(TICK)
            self.stalls.append(loop.time() - started - TICK)

    async def _answer(self, asked: float) -> None:
        self.admit()
        self.answers.append(asyncio.get_running_loop().time() - asked)

    async def _prober(self) -> None:
        # Requests arrive every PROBE_EVERY whatever the loop does (the API server sends them): those due
        # while the loop was held are taken as arrived when due, and wait from then.
        loop = asyncio.get_running_loop()
        pending: set[asyncio.Task[None]] = set()
        due = loop.time()
        while not self._done.is_set():
            while due <= loop.time():
                task = loop.create_task(self._answer(due))
                pending.add(task)
                task.add_done_callback(pending.discard)
                due += PROBE_EVERY
            await asyncio.sleep(max(0.0, due - loop.time()))
        await asyncio.gather(*pending)

    def result(self) -> dict[str, Any]:
        ordered = sorted(self.answers)
        return {
            "longest_stall_ms": round(1000 * max(self.stalls), 2),
            "webhook_p99_ms": round(1000 * ordered[int(0.99 * (len(ordered) - 1))], 2),
            "webhook_max_ms": round(1000 * ordered[-1], 2),
            "webhook_median_ms": round(1000 * statistics.median(ordered), 3),
            "probes": len(ordered),
        }


RELISTED = ("StormService", "RoleSet", "HyperNode", "PodGroup", "Pod")  # handlers.Operator.relist's kinds, in its order


def admit_pods(index: Index, per_replica: int) -> int:
    """`per_replica` admitted pods of each RoleSet, as the pod webhook's admissions leave them in the index."""
    for namespace, name in list(index.rolesets):
        labels = {"storm-service-name": name.rsplit("-roleset-", 1)[0], "roleset-name": name, "role-name": "prefill"}
        for p in range(per_replica):
            index.observe("Pod", None, {"metadata": {"name": f"{name}-prefill-{p}", "namespace": namespace, "labels": labels}})
    return len(index.pods)


def prune_before(seen: dict[tuple[str, Any], int], kind: str, listed: set[Any], mark: int) -> list[Any]:
    """The prune as it was: one walk, in one go, of every kind's keys (one dict of (kind, key)) for each kind listed."""
    return [key for (k, key), when in list(seen.items()) if k == kind and when <= mark and key not in listed]


async def relist(index: Index, before: bool) -> dict[str, Any]:
    """What a re-list does on the loop once each kind's list is in (handlers.Operator.relist): the prune of every kind,
    here with nothing gone (every key listed), with the ticker and the probe running."""
    listed = {kind: set(index._store(kind)) for kind in RELISTED}
    combined = {(kind, key): when for kind, seen in index._seen.items() for key, when in seen.items()}
    mark = index.mark()
    pod, roleset, service = probe_pod(index)
    watch = LoopWatch(lambda: admit_pod(pod, roleset, service, index.cluster_tiers()))
    async with watch:
        for kind in RELISTED:
            if before:
                prune_before(combined, kind, listed[kind], mark)
            else:
                await index.prune(kind, listed[kind], mark)
            await asyncio.sleep(0)  # (the next kind's list, on a thread)
    return watch.result()


def run(services: int, replicas: int, pods_per_replica: int = 4) -> dict[str, Any]:
    index = cluster(services, replicas)
    before = asyncio.run(drain(index, QueueBefore, None))
    after = asyncio.run(drain(index, cast(type[WorkQueue[Hashable]], WorkQueue), RESYNC_CHUNK))
    pods = admit_pods(index, pods_per_replica)
    relist_before, relist_after = asyncio.run(relist(index, before=True)), asyncio.run(relist(index, before=False))
    return {
        "services": services,
        "rolesets": len(index.rolesets),
        "before": before,
        "after": after,
        "longest_stall_ratio": round(after["longest_stall_ms"] / before["longest_stall_ms"], 4) if before["longest_stall_ms"] else None,
        "relist": {
            "admitted_pods": pods,
            "before": relist_before,
            "after": relist_after,
            "longest_stall_ratio": round(relist_after["longest_stall_ms"] / relist_before["longest_stall_ms"], 4),
        },
    }


# -- the same question on the real control plane ---------------------------------------------------------

PROBE_RATE = 200.0  # AdmissionReviews a second straight to the pod webhook (every 5 ms, as above)
CREATORS = 16  # threads creating the StormServices and RoleSets
LAG_PREFIX = 'stormtopo_event_loop_lag_seconds_bucket{le="'


def _create_all(state: Path, services: int, replicas: int, namespaces: int) -> float:
    """`services` StormServices that never opted in over `namespaces` namespaces, and `replicas` RoleSets
    each, labelled as AIBrix labels them (its controller is stopped: nothing else is made of them)."""
    api = Api(str(state / "kubeconfig"))
    for n in range(namespaces):
        api.request("POST", "/api/v1/namespaces", {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": f"team-{n:03d}"}})
    base = "/apis/orchestration.aibrix.ai/v1alpha1/namespaces"

    def create(i: int) -> None:
        namespace, name = f"team-{i % namespaces:03d}", f"svc-{i:05d}"
        svc = stormservice(name, namespace, replicas=replicas)
        api.request("POST", f"{base}/{namespace}/stormservices", svc)
        for r in range(replicas):
            labels = {"storm-service-name": name}
            roleset = {
                "apiVersion": "orchestration.aibrix.ai/v1alpha1",
                "kind": "RoleSet",
                "metadata": {"name": f"{name}-roleset-{r:02d}", "namespace": namespace, "labels": labels},
                "spec": svc["spec"]["template"]["spec"],
            }
            api.request("POST", f"{base}/{namespace}/rolesets", roleset)

    started = time.monotonic()
    with ThreadPoolExecutor(max_workers=CREATORS) as pool:
        list(pool.map(create, range(services)))
    return time.monotonic() - started


def _lag_buckets(probe: Probe) -> dict[float, float]:
    text = probe.metrics()
    return {
        float(line[len(LAG_PREFIX) :].split('"')[0]): float(line.split()[-1]) for line in text.splitlines() if line.startswith(LAG_PREFIX)
    }


def _longest_lag(before: dict[float, float], after: dict[float, float]) -> tuple[float, float, int]:
    """From two reads of the cumulative lag histogram: the bounds (lower, upper, in ms) of the longest lag
    observed between them, and how many looks were later than 50 ms."""
    bounds = sorted(after)
    cumulative = [after[b] - before.get(b, 0.0) for b in bounds]
    counts = [c - (cumulative[i - 1] if i else 0.0) for i, c in enumerate(cumulative)]
    top = max((i for i, c in enumerate(counts) if c > 0), default=0)
    lower = bounds[top - 1] if top else 0.0
    later = cumulative[-1] - cumulative[bounds.index(0.05)]
    return round(1000 * lower, 1), round(1000 * bounds[top], 1), int(later)


def _delivered(probe: Probe, started: float, quiet: float = 10.0) -> float:
    """Seconds from the operator's start until the objects its index has recorded stop growing for `quiet`
    seconds: kopf has delivered its first event of every StormService and RoleSet (the index had them
    from its own first list already; kopf's per-object processing is what takes the time)."""
    last, since = -1.0, time.monotonic()
    while True:
        total = sum(probe.observed().values())
        if total != last:
            last, since = total, time.monotonic()
        elif time.monotonic() - since >= quiet:
            return round(since - started, 1)
        time.sleep(1.0)


def _phase(state: Path, pod: dict[str, Any], seconds: float) -> dict[str, Any]:
    """Probe the pod webhook for `seconds` at PROBE_RATE; meanwhile read the work queues' depth once a second."""
    probe, webhook = Probe(state), Webhook(state)
    webhook.review(pod)  # untimed: the bench's TLS handshake
    depths: list[float] = []
    stop = threading.Event()

    def read_depth() -> None:
        while not stop.wait(1.0):
            depths.append(probe.queue_depth())

    reader = threading.Thread(target=read_depth, daemon=True)
    before = _lag_buckets(probe)
    reader.start()

    def send(_i: int, _path: str) -> None:
        webhook.review(pod)

    times = open_loop(send, ("direct",), seconds, PROBE_RATE)["direct"]
    stop.set()
    reader.join()
    lower, upper, later = _longest_lag(before, _lag_buckets(probe))
    ordered = sorted(times)
    return {
        "seconds": seconds,
        "probes": len(ordered),
        "webhook_p50_ms": round(1000 * statistics.median(ordered), 2),
        "webhook_p99_ms": round(1000 * ordered[int(0.99 * (len(ordered) - 1))], 2),
        "webhook_max_ms": round(1000 * ordered[-1], 2),
        "longest_lag_ms_between": [lower, upper],
        "lag_looks_over_50ms": later,
        "queue_depth_max": max(depths, default=0.0),
    }


def _status_mib(pid: int, field: str) -> float:
    status = Path(f"/proc/{pid}/status").read_text()
    return int(next(line.split()[1] for line in status.splitlines() if line.startswith(f"{field}:"))) / 1024


def run_on_cluster(services: int, replicas: int, namespaces: int = 100, seconds: float = 60.0, resync: float = 5.0) -> dict[str, Any]:
    """On the local control plane (AIBrix's controller stopped once the cluster is up, so the objects stay
    as created): the operator restarted without a resync in the window (the baseline), then with one every
    `resync` seconds, each probed the same way."""
    state = Path(tempfile.mkdtemp(prefix="stormtopo-bench-loop-stall-"))
    dev.up(state, timeout=300)
    try:
        dev.stop_component(state, "aibrix-controller-manager")
        created = _create_all(state, services, replicas, namespaces)
        print(f"  {services} StormServices and {services * replicas} RoleSets created in {created:.0f} s", flush=True)
        labels = {"storm-service-name": "svc-00000", "roleset-name": "svc-00000-roleset-00", "role-name": "prefill"}
        pod = {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {"name": "svc-00000-roleset-00-prefill-0", "namespace": "team-000", "labels": labels},
            "spec": {"containers": [{"name": "c", "image": "x"}]},
        }
        phases: dict[str, Any] = {}
        for label, flags in (("no_resync", ("--resync-seconds=100000",)), ("resync", (f"--resync-seconds={resync:g}",))):
            dev.stop_component(state, "operator")
            started = time.monotonic()
            operator = dev.start_operator(state, timeout=600, extra=flags)
            ready = time.monotonic() - started
            delivered = _delivered(Probe(state), started)  # kopf's first events of every object, after the first list
            phases[label] = {"operator_ready_seconds": round(ready, 1), "kopf_delivered_seconds": delivered, **_phase(state, pod, seconds)}
            # The real process's memory, kopf's per-object state and the watch buffers included (bench/memory.py
            # simulates the index alone): its peak, and what it holds after the phase.
            phases[label] |= {
                "operator_peak_rss_mib": round(_status_mib(operator.pid, "VmHWM"), 1),
                "operator_rss_mib": round(_status_mib(operator.pid, "VmRSS"), 1),
            }
            print(f"  {label}: {phases[label]}", flush=True)
        a, b = phases["no_resync"], phases["resync"]
        return {
            "services": services,
            "rolesets": services * replicas,
            "namespaces": namespaces,
            "created_seconds": round(created, 1),
            "resync_seconds": resync,
            "probe_rate": PROBE_RATE,
            **phases,
            "webhook_p99_ratio": round(b["webhook_p99_ms"] / a["webhook_p99_ms"], 3),
        }
    finally:
        dev.down(state)
