"""`python -m bench room-stall`: the leader's event loop while held replicas that must preempt are planned over
16,384 nodes (issue 42, item 3: the loop never blocks longer than 50 ms), without a cluster.

A replica held at the room gate that fits nowhere is planned over who holds every node's GPUs (core/preempting.py):
the leader reads its free-room reading on the event loop (operator/replica.py `_room_reading`: free GPUs, the
pods holding them, their gangs, every node's facts) and plans on a thread of its own. The cluster is
bench/preemption.py's fragmented one (leaves of 2 to 8 nodes of 8 GPUs, filled with jobs of 1 to 8 GPUs, each pod
with its PodGroup), fed to the real free-room reading (operator/room.py) as its watch delivers pods and nodes.
Each round, as on a busy cluster, one batch pod ends and another is bound in its place (the reading changes, with
new objects), then a hard tier-1 replica of 2 pods x 8 GPUs is planned: the reading on the loop, the plan on a
thread. Meanwhile the loop is watched as `python -m bench loop-stall` watches it (bench/loop_stall.py LoopWatch):
its longest stall, and a pod admission every 5 ms, p99.

Each arm runs in a fresh interpreter that imports the operator of its source tree, installs what that operator
installs at its start, and freezes what it loaded (as the operator does once ready): the baseline is the operator
of commit BEFORE (from `git archive`), which rebuilt who holds the GPUs, their gangs and the nodes' facts from every
bound pod at each change of the reading; the other, this checkout's. Arms alternate, RUNS each.
"""

from __future__ import annotations

import asyncio
import functools
import gc
import inspect
import json
import statistics
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any, cast

REPO = Path(__file__).resolve().parents[1]
BEFORE = "e017910"  # the reading rebuilt per change of it
RUNS = 2  # children per arm, alternating
PRIORITY = 1000  # the held replica's: above every batch job of the cluster


def _node(name: str) -> dict[str, Any]:
    from bench.preemption import NODE_GPUS
    from stormtopo.core.vocabulary import GPU

    return {"metadata": {"name": name, "labels": {}}, "spec": {}, "status": {"allocatable": {GPU: str(NODE_GPUS)}}}


def _pod(name: str, job: str, node: str, gpus: int, priority: int) -> dict[str, Any]:
    """A running batch pod as the kubelet reports it, in its PodGroup (Volcano's pg-controller gives each one)."""
    from stormtopo.core.vocabulary import GPU, GROUP_NAME_ANNOTATION, VOLCANO_SCHEDULER

    return {
        "metadata": {"name": name, "namespace": "batch", "annotations": {GROUP_NAME_ANNOTATION: job}},
        "spec": {
            "nodeName": node,
            "schedulerName": VOLCANO_SCHEDULER,
            "priority": priority,
            "containers": [{"name": "c", "resources": {"requests": {GPU: str(gpus)}}}],
        },
        "status": {"phase": "Running"},
    }


async def planning(nodes: int, rounds: int, seed: int) -> dict[str, Any]:
    """In the child: the cluster, the reading fed as its watch feeds it, then `rounds` times one pod ended and one
    bound in its place, and the held replica's reading (on the loop) and plan (on a thread), the loop watched."""
    from bench import preemption
    from bench.loop_stall import LoopWatch
    from stormtopo.core.admission import admit_pod
    from stormtopo.core.preempting import HeldReplica, plan_room
    from stormtopo.core.request import ClusterTiers, Mode, TierLimit, TopologyRequest
    from stormtopo.core.vocabulary import GROUP_NAME_ANNOTATION, ROOM_GATE
    from stormtopo.kube.client import Api
    from stormtopo.operator.index import Index
    from stormtopo.operator.loops import Loops
    from stormtopo.operator.replica import PlacementReporter
    from stormtopo.operator.room import NodeRoom

    cluster = preemption.cluster(nodes, seed)
    topology = preemption.topology_of(cluster)
    pods = [_pod(p.name, job.name, p.node, p.gpus, job.priority) for job in cluster.jobs for p in job.pods]
    gc.collect()
    gc.freeze()  # what the operator had loaded by the time it was ready; the bench's own objects
    room = NodeRoom(cast(Api, None), Loops())
    for leaf in cluster.leaves.values():
        for name in leaf:
            room._on_node("ADDED", _node(name))
    for pod in pods:
        room._on_pod("ADDED", pod)
    if hasattr(room, "_on_listed"):  # as its watch tells it once listed (the operator of BEFORE had no such step)
        room._on_listed("Node")
        room._on_listed("Pod")
    reporter = PlacementReporter(Index(cast(Any, None)), cast(Any, None), lambda *_: None, cast(Any, None), room)
    # The replica the reading is for, where the operator's reading asks (a replica's own claim is its own room).
    read_room: Any = reporter._room_reading
    if "key" in inspect.signature(read_room).parameters:
        read_room = functools.partial(read_room, ("bench", "held"))
    gated = {"schedulingGates": [{"name": ROOM_GATE}]}
    held = [{"metadata": {"name": f"svc-rs-{role}-0", "namespace": "inference"}, "spec": gated} for role in ("prefill", "decode")]
    replica = HeldReplica("inference", "svc-rs", held, [8, 8], 2, 0, [{}], 0.0)
    request = TopologyRequest(Mode.HARD, TierLimit(tier=1))
    probe = {"metadata": {"name": "plain-0", "namespace": "team", "labels": {}}, "spec": {"containers": [{"name": "c"}]}}
    loop = asyncio.get_running_loop()
    reads: list[float] = []
    plans: list[float] = []
    victims = 0
    with ThreadPoolExecutor(1) as planner:
        async with LoopWatch(lambda: admit_pod(probe, None, None, ClusterTiers())) as watch:
            for i in range(rounds):
                ended = pods[(i * 7919) % len(pods)]  # one batch pod ends, another is bound in its place
                room._on_pod("DELETED", ended)
                name = f"{ended['metadata']['name']}-{i}"  # (its own PodGroup, as Volcano's pg-controller gives it)
                after = {**ended, "metadata": {**ended["metadata"], "name": name, "annotations": {GROUP_NAME_ANNOTATION: name}}}
                room._on_pod("ADDED", after)
                pods[(i * 7919) % len(pods)] = after
                started = time.perf_counter()
                reading = read_room(room.free_now())
                reads.append(time.perf_counter() - started)
                started = time.perf_counter()
                planned = functools.partial(plan_room, replica, request, 1, topology, {}, PRIORITY, reading, None)
                plan = await loop.run_in_executor(planner, planned)
                plans.append(time.perf_counter() - started)
                victims += bool(plan.needs_groups)  # victims found: their PodGroups asked for next
                await asyncio.sleep(0.05)  # the victims' PodGroups read meanwhile, as the operator does
    return {
        "bound_pods": len(pods),
        "rounds": rounds,
        "plans_with_victims": victims,
        "reading_on_loop_ms_median": round(1000 * statistics.median(reads), 2),
        "reading_on_loop_ms_max": round(1000 * max(reads), 2),
        "plan_on_thread_ms_median": round(1000 * statistics.median(plans), 1),
        **watch.result(),
    }


def operator_of(commit: str, into: Path) -> Path:
    """The operator of `commit` (its stormtopo package), from git archive, to import from `into`."""
    archive = subprocess.run(["git", "-C", str(REPO), "archive", commit, "stormtopo"], check=True, capture_output=True).stdout
    subprocess.run(["tar", "-x", "-C", str(into)], input=archive, check=True)
    return into


def in_child(script: str, source: Path, argv: list[str]) -> dict[str, Any]:
    """One run of an arm: `script` in a fresh interpreter that imports the operator of `source` first; its last line."""
    env = {"MALLOC_ARENA_MAX": "2", "PATH": "", "PYTHONPATH": f"{source}:{REPO}"}
    done = subprocess.run([sys.executable, script, *argv], cwd=source, capture_output=True, text=True, env=env)
    if done.returncode != 0:
        raise RuntimeError(done.stderr[-2000:])
    return dict(json.loads(done.stdout.strip().splitlines()[-1]))


def alternating(script: str, argv: list[str], before: str) -> dict[str, list[dict[str, Any]]]:
    """RUNS runs of each arm, alternating (the machine is shared and drifts): the operator of commit `before`, from
    git archive, and this checkout's."""
    runs: dict[str, list[dict[str, Any]]] = {"before": [], "after": []}
    with tempfile.TemporaryDirectory() as tmp:
        sources = {"before": operator_of(before, Path(tmp)), "after": REPO}
        for _ in range(RUNS):
            for arm in ("before", "after"):
                runs[arm].append(in_child(script, sources[arm], argv))
                print(f"  {arm}: longest stall {runs[arm][-1]['longest_stall_ms']} ms", flush=True)
    return runs


def run(nodes: int, rounds: int, seed: int = 1, before: str = BEFORE) -> dict[str, Any]:
    runs = alternating(__file__, [str(nodes), str(rounds), str(seed)], before)
    out: dict[str, Any] = {"nodes": nodes, "seed": seed, "before_commit": before, "runs": runs}
    for arm in ("before", "after"):
        runs = out["runs"][arm]
        out[arm] = {key: max(r[key] for r in runs) for key in ("longest_stall_ms", "webhook_p99_ms", "reading_on_loop_ms_max")}
        out[arm]["reading_on_loop_ms_median"] = statistics.median(r["reading_on_loop_ms_median"] for r in runs)
        out[arm]["plan_on_thread_ms_median"] = statistics.median(r["plan_on_thread_ms_median"] for r in runs)
    out["bound_pods"] = out["runs"]["after"][0]["bound_pods"]
    out["longest_stall_ratio"] = round(out["after"]["longest_stall_ms"] / out["before"]["longest_stall_ms"], 4)
    out["webhook_p99_ratio"] = round(out["after"]["webhook_p99_ms"] / out["before"]["webhook_p99_ms"], 4)
    return out


if __name__ == "__main__":  # the child: the operator of its source tree, as it starts
    import stormtopo.operator.app  # noqa: F401  (kopf, aiohttp and every module the operator imports)

    try:
        from stormtopo.operator import collector

        collector.install()  # (operator/app.py's run installs it first)
    except ImportError:
        pass  # an operator from before it
    nodes_, rounds_, seed_ = (int(a) for a in sys.argv[1:4])
    print(json.dumps(asyncio.run(planning(nodes_, rounds_, seed_))))
