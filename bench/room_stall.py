"""`python -m bench room-stall`: the leader's event loop while held replicas that must preempt are planned over
16,384 nodes (issue 42, item 3: the loop never blocks longer than 50 ms), without a cluster.

A replica held at the room gate that fits nowhere is planned over who holds every node's GPUs (core/preempting.py):
the leader reads its free-room reading on the event loop (operator/replica.py `_room_reading`: free GPUs, the
pods holding them, their gangs, every node's facts) and plans on a thread of its own. The cluster is
bench/preemption.py's fragmented one (leaves of 2 to 8 nodes of 8 GPUs, filled with jobs of 1 to 8 GPUs, each pod
with its PodGroup), fed to the real free-room reading (operator/room.py) as its watch delivers pods and nodes.
Each round, as on a busy cluster, the pod watch delivers one change (every reading built from it is stale), then a
hard tier-1 replica of 2 pods x 8 GPUs is planned: the reading on the loop, the plan on a thread. Meanwhile the
loop is watched as `python -m bench loop-stall` watches it (bench/loop_stall.py LoopWatch): its longest stall,
and a pod admission every 5 ms, p99.

Baseline, in the same run: the reading as it was before (commit e017910), which rebuilt who holds the GPUs,
their gangs and the nodes' facts from every bound pod at each change of the reading, and left what it holds in
the collector's full passes (now frozen out of them once listed, as the operator freezes what it loaded at ready).
"""

from __future__ import annotations

import asyncio
import functools
import gc
import statistics
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Any, cast

from bench import preemption
from bench.loop_stall import LoopWatch
from stormtopo.core.admission import admit_pod
from stormtopo.core.node_fit import NodeFacts
from stormtopo.core.preempting import HeldReplica, plan_room
from stormtopo.core.preemption import Holder
from stormtopo.core.request import ClusterTiers, Mode, TierLimit, TopologyRequest
from stormtopo.core.victims import GangSize
from stormtopo.core.vocabulary import GPU, GROUP_NAME_ANNOTATION, ROOM_GATE, VOLCANO_SCHEDULER
from stormtopo.kube.client import Api
from stormtopo.operator.index import Index
from stormtopo.operator.loops import Loops
from stormtopo.operator.replica import PlacementReporter
from stormtopo.operator.room import NodeRoom

HARD1 = TopologyRequest(Mode.HARD, TierLimit(tier=1))
PRIORITY = 1000  # the held replica's: above every batch job of the cluster


class RebuiltRoom(NodeRoom):
    """The reading as it was: who holds the GPUs, their gangs and the nodes' facts rebuilt whole from every bound
    pod at each change (pods alike sharing one Holder, as then), all of it in the collector's full passes."""

    def _on_listed(self, kind: str) -> None:
        self._listed.setdefault(kind, asyncio.Event()).set()  # nothing frozen out of the collector's reach

    def holders_now(self) -> dict[str, tuple[Holder, ...]]:
        out: dict[str, list[Holder]] = {}
        kinds: dict[tuple[int, int, bool, str | None], Holder] = {}
        for node, h in self._pods.values():
            holder = kinds.setdefault((h.gpus, h.priority, h.preemptable, h.gang), Holder(h.gpus, h.priority, h.preemptable, h.gang))
            out.setdefault(node, []).append(holder)
        return {node: tuple(hs) for node, hs in out.items()}

    def gangs_now(self) -> dict[str, GangSize]:
        running: dict[str, list[int]] = {}
        for _, h in self._pods.values():
            if h.gang is not None:
                running.setdefault(h.gang, []).append(h.gpus)
        return {gang: GangSize(len(gpus), len(gpus), sum(gpus)) for gang, gpus in running.items()}

    def facts_now(self) -> dict[str, NodeFacts]:
        out = {}
        for name, (labels, taints, allocatable) in self._facts.items():
            requested = self._requested.get(name, {})
            out[name] = NodeFacts(labels, taints, {r: amount - requested.get(r, 0) for r, amount in allocatable.items()})
        return out


def _node(name: str) -> dict[str, Any]:
    return {"metadata": {"name": name, "labels": {}}, "spec": {}, "status": {"allocatable": {GPU: str(preemption.NODE_GPUS)}}}


def _pod(pod: preemption.Pod, priority: int) -> dict[str, Any]:
    """A running batch pod as the kubelet reports it, in its PodGroup (Volcano's pg-controller gives each one)."""
    return {
        "metadata": {"name": pod.name, "namespace": "batch", "annotations": {GROUP_NAME_ANNOTATION: pod.job}},
        "spec": {
            "nodeName": pod.node,
            "schedulerName": VOLCANO_SCHEDULER,
            "priority": priority,
            "containers": [{"name": "c", "resources": {"requests": {GPU: str(pod.gpus)}}}],
        },
        "status": {"phase": "Running"},
    }


def filled(kind: type[NodeRoom], cluster: preemption.Cluster) -> tuple[NodeRoom, dict[str, Any]]:
    """The reading after its first lists, and one of its pods (for the changes the watch delivers)."""
    room = kind(cast(Api, None), Loops())
    for nodes in cluster.leaves.values():
        for name in nodes:
            room._on_node("ADDED", _node(name))
    pods = [_pod(pod, job.priority) for job in cluster.jobs for pod in job.pods]
    for pod in pods:
        room._on_pod("ADDED", pod)
    for listed in ("Node", "Pod"):  # as the watch tells it after its first lists
        room._on_listed(listed)
    return room, pods[0]


async def planning(room: NodeRoom, pod: dict[str, Any], cluster: preemption.Cluster, rounds: int) -> dict[str, Any]:
    """`rounds` times: one change from the pod watch, then the held replica's reading (on the loop) and plan (on a
    thread), while the loop is watched."""
    topology = preemption.topology_of(cluster)
    reporter = PlacementReporter(Index(cast(Any, None)), cast(Any, None), lambda *_: None, cast(Any, None), room)
    held = [
        {"metadata": {"name": f"svc-rs-{role}-0", "namespace": "inference"}, "spec": {"schedulingGates": [{"name": ROOM_GATE}]}}
        for role in ("prefill", "decode")
    ]
    replica = HeldReplica("inference", "svc-rs", held, [8, 8], 2, 0, [{}], 0.0)
    probe = {"metadata": {"name": "plain-0", "namespace": "team", "labels": {}}, "spec": {"containers": [{"name": "c"}]}}
    loop = asyncio.get_running_loop()
    reads: list[float] = []
    plans: list[float] = []
    victims = 0
    with ThreadPoolExecutor(1) as planner:
        async with LoopWatch(lambda: admit_pod(probe, None, None, ClusterTiers())) as watch:
            for i in range(rounds):
                if i % 2:  # the pod watch delivers a change: the pod being deleted, then not
                    pod["metadata"].pop("deletionTimestamp", None)
                else:
                    pod["metadata"]["deletionTimestamp"] = "2026-12-06T00:00:00Z"
                room._on_pod("MODIFIED", pod)
                started = time.perf_counter()
                reading = reporter._room_reading(room.free_now())
                reads.append(time.perf_counter() - started)
                started = time.perf_counter()
                planned = functools.partial(plan_room, replica, HARD1, 1, topology, {}, PRIORITY, reading, None)
                plan = await loop.run_in_executor(planner, planned)
                plans.append(time.perf_counter() - started)
                victims += bool(plan.needs_groups)  # victims found: their PodGroups asked for next
                await asyncio.sleep(0.05)  # the replica's victims' PodGroups read meanwhile, as the operator does
    return {
        "rounds": rounds,
        "plans_with_victims": victims,
        "reading_on_loop_ms_median": round(1000 * statistics.median(reads), 2),
        "reading_on_loop_ms_max": round(1000 * max(reads), 2),
        "plan_on_thread_ms_median": round(1000 * statistics.median(plans), 1),
        **watch.result(),
    }


def run(nodes: int, rounds: int, seed: int = 1) -> dict[str, Any]:
    cluster = preemption.cluster(nodes, seed)
    gc.collect()
    gc.freeze()  # the bench's own objects, which the operator does not have (it froze what it had loaded at ready)
    out: dict[str, Any] = {"nodes": nodes, "bound_pods": sum(len(j.pods) for j in cluster.jobs), "seed": seed}
    for name, kind in (("before", RebuiltRoom), ("after", NodeRoom)):
        room, pod = filled(kind, cluster)
        out[name] = asyncio.run(planning(room, pod, cluster, rounds))
    before, after = out["before"], out["after"]
    out["longest_stall_ratio"] = round(after["longest_stall_ms"] / before["longest_stall_ms"], 4)
    out["webhook_p99_ratio"] = round(after["webhook_p99_ms"] / before["webhook_p99_ms"], 4)
    return out
