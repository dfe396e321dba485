"""`python -m bench node-tier-stall`: the leader's event loop while the node tier keeps its short lists current over
16,384 nodes (issue 42, item 3: the loop never blocks longer than 50 ms), without a cluster.

With `--node-tier`, every pass (up to twice a second when GPUs are bound or freed) the leader reads the GPUs per node
from its free-room reading and the HyperNodes from its index, plans the leaves' short lists (core/node_tier_pass.py)
and writes what moved. The cluster: bench/fabric.py's 3-tier fabric (16 spines of 32 leaves of 32 nodes of 8 GPUs),
fragmented as bench/fabric.py fragments it, its HyperNodes as `stormtopo topology apply` writes them, fed to the
real index and free-room reading (operator/index.py, operator/room.py) as their watches deliver them. Each round,
as on a busy cluster, one pass runs
(operator/node_tier.py `NodeTier.check`): two pods end anywhere and two replicas' pods are bound on nodes the lists
name, so those leaves' lists move; the HyperNodes it writes go to an API server that is a dict here and
back to the index as its watch delivers them; then a placement check reads the switch tree (`Index.topology`,
rebuilt on the loop after HyperNodes changed). Meanwhile the loop is watched as `python -m bench loop-stall`
watches it (bench/loop_stall.py LoopWatch): its longest stall, and a pod admission every 5 ms, p99.

Each arm runs in a fresh interpreter that imports the operator of its source tree, installs what that operator
installs at its start, and freezes what it loaded (as the operator does once ready): the baseline is the operator
of commit BEFORE (from `git archive`), which planned each pass on the event loop; the other, this checkout's.
Arms alternate, RUNS each.
"""

from __future__ import annotations

import asyncio
import copy
import gc
import json
import random
import statistics
import sys
import time
from typing import Any, cast

from bench.room_stall import alternating

BEFORE = "b477526"  # each node tier pass planned on the event loop
PREFIX = "/apis/topology.volcano.sh/v1alpha1/hypernodes"
GPU = "nvidia.com/gpu"


def hypernodes_api(index: Any, loop: asyncio.AbstractEventLoop) -> Any:
    """HyperNodes as the API server keeps them (create, merge patch of members, delete, get), each write delivered
    to the index as its watch would deliver it (on the loop, whatever thread wrote): the operator's own client, its
    requests answered from a dict."""
    from stormtopo.kube.client import Api

    class HyperNodes(Api):
        def __init__(self) -> None:
            self.stored: dict[str, dict[str, Any]] = {}
            self.writes = 0

        def request(self, method: str, path: str, body: Any = None, content_type: str = "", **_: str) -> Any:
            name = path.removeprefix(PREFIX).strip("/") or body["metadata"]["name"]
            if method == "GET":
                return copy.deepcopy(self.stored[name])
            self.writes += 1
            if method == "POST":
                self.stored[name] = copy.deepcopy(body)
            elif method == "PATCH":
                self.stored[name]["spec"]["members"] = copy.deepcopy(body["spec"]["members"])
            elif method == "DELETE":
                loop.call_soon_threadsafe(index.observe, "HyperNode", "DELETED", self.stored.pop(name))
                return {}
            loop.call_soon_threadsafe(index.observe, "HyperNode", "MODIFIED", copy.deepcopy(self.stored[name]))
            return {}

    return HyperNodes()


def _pod(name: str, node: str, gpus: int) -> dict[str, Any]:
    spec = {"nodeName": node, "containers": [{"resources": {"requests": {GPU: str(gpus)}}}]}
    return {"metadata": {"namespace": "batch", "name": name}, "spec": spec, "status": {"phase": "Running"}}


async def passes(spines: int, rounds: int, seed: int) -> dict[str, Any]:
    """In the child: the fabric and its fragmentation fed to the index and the reading, then `rounds` times a few
    pods ended and bound elsewhere, a pass of the node tier and a read of the tree, the loop watched."""
    from bench import fabric
    from bench.loop_stall import LoopWatch
    from stormtopo.core.admission import admit_pod
    from stormtopo.core.request import ClusterTiers
    from stormtopo.core.topology.fabric import parse_topology
    from stormtopo.core.topology.hypernodes import hypernode_manifests
    from stormtopo.core.topology.node_tier import node_tier_members
    from stormtopo.operator.index import Index
    from stormtopo.operator.loops import Loops
    from stormtopo.operator.node_tier import NodeTier
    from stormtopo.operator.room import NodeRoom

    topology = parse_topology(fabric.fabric_yaml(spines, 32, 32))
    nodes = sorted(topology.nodes)
    used = fabric.fragmentation(nodes, seed)
    index = Index(cast(Any, None))
    api = hypernodes_api(index, asyncio.get_running_loop())
    for manifest in hypernode_manifests(topology):
        api.stored[manifest["metadata"]["name"]] = manifest
        index.observe("HyperNode", "ADDED", copy.deepcopy(manifest))
    room = NodeRoom(cast(Any, None), Loops())
    for node in nodes:
        labels = {"kubernetes.io/hostname": node, "topology.example/rack": node[:8]}
        room._on_node("ADDED", {"metadata": {"name": node, "labels": labels}, "status": {"allocatable": {GPU: "8"}}})
    pods = {node: _pod(f"on-{node}", node, gpus) for node, gpus in used.items()}
    for pod in pods.values():
        room._on_pod("ADDED", pod)
    for kind in ("Node", "Pod"):  # as its watches tell it once listed
        room._listed[kind] = asyncio.Event()
        room._listed[kind].set()
    room._streams = cast(Any, object())  # (followed already: no watch is started)
    gc.collect()
    gc.freeze()  # what the operator had loaded by the time it was ready
    # The labels as the placement path hands them over (a held pod is pinned by hostname): the tree built over them.
    index.set_nodes(room.labels_now(), time.monotonic())
    primed = time.perf_counter()
    if hasattr(index, "build_tree"):  # as the operator does once the HyperNodes are primed and labels read: on a thread
        await index.build_tree()
    primed_tree = time.perf_counter() - primed
    tier = NodeTier(index, cast(Any, api), room)
    probe = {"metadata": {"name": "plain-0", "namespace": "team", "labels": {}}, "spec": {"containers": [{"name": "c"}]}}
    admit = lambda: admit_pod(probe, None, None, ClusterTiers())  # noqa: E731  (what the pod webhook does for a plain pod)
    # A leader's start: the first pass writes every leaf's list, then the first placement check builds the tree whole.
    async with LoopWatch(admit) as start:
        await tier.check()
        await asyncio.sleep(0)  # (the watch events of its writes)
        started = time.perf_counter()
        index.topology()
        first_tree = time.perf_counter() - started
    first_writes = api.writes
    rng = random.Random(seed)
    checks: list[float] = []
    trees: list[float] = []
    async with LoopWatch(admit) as watch:
        for i in range(rounds):
            # Two pods end somewhere; two replicas' pods are bound on nodes the lists name (what they are for):
            # those leaves' lists move.
            for gone in rng.sample(sorted(pods), 2):
                room._on_pod("DELETED", pods.pop(gone))
            listed = sorted(set(node_tier_members(index.hypernodes.values()).values()) - pods.keys())
            for node in rng.sample(listed, min(2, len(listed))):
                pods[node] = _pod(f"on-{node}-{i}", node, 8)
                room._on_pod("ADDED", pods[node])
            started = time.perf_counter()
            await tier.check()
            checks.append(time.perf_counter() - started)
            started = time.perf_counter()
            index.topology()  # a placement check after the HyperNodes it wrote: the tree rebuilt on the loop
            trees.append(time.perf_counter() - started)
            await asyncio.sleep(0.1)
    writes, hypernodes = api.writes, len(api.stored)
    # The node tier turned off: every leaf gets its nodes back and the tier-0 HyperNodes go (plan_off), in one pass.
    tier.enabled = False
    async with LoopWatch(admit) as off:
        await tier.check()
        await asyncio.sleep(0)
        index.topology()
    return {
        "nodes": len(nodes),
        "hypernodes": hypernodes,  # (the node tier's tier-0 ones among them, as the rounds left them)
        "rounds": rounds,
        "first_pass_writes": first_writes,
        "writes_in_rounds": writes - first_writes,
        "off_writes": api.writes - writes,
        "pass_ms_median": round(1000 * statistics.median(checks), 1),
        "tree_on_loop_ms_median": round(1000 * statistics.median(trees), 1),
        "tree_on_loop_ms_max": round(1000 * max(trees), 1),
        "first_tree_ms": round(1000 * first_tree, 1),  # on the loop, at the first placement check
        "primed_tree_ms": round(1000 * primed_tree, 1),  # on a thread, before the webhook serves (none before)
        "start_longest_stall_ms": start.result()["longest_stall_ms"],
        "off_longest_stall_ms": off.result()["longest_stall_ms"],
        **watch.result(),
    }


def run(spines: int, rounds: int, seed: int = 3, before: str = BEFORE) -> dict[str, Any]:
    runs = alternating(__file__, [str(spines), str(rounds), str(seed)], before)
    out: dict[str, Any] = {"spines": spines, "seed": seed, "before_commit": before, "runs": runs}
    for arm in ("before", "after"):
        runs = out["runs"][arm]
        keys = (
            "longest_stall_ms",
            "webhook_p99_ms",
            "tree_on_loop_ms_max",
            "first_tree_ms",
            "start_longest_stall_ms",
            "off_longest_stall_ms",
        )
        out[arm] = {key: max(r[key] for r in runs) for key in keys}
        out[arm]["pass_ms_median"] = statistics.median(r["pass_ms_median"] for r in runs)
        out[arm]["writes_in_rounds"] = statistics.median(r["writes_in_rounds"] for r in runs)
    out["nodes"] = out["runs"]["after"][0]["nodes"]
    out["longest_stall_ratio"] = round(out["after"]["longest_stall_ms"] / out["before"]["longest_stall_ms"], 4)
    out["webhook_p99_ratio"] = round(out["after"]["webhook_p99_ms"] / out["before"]["webhook_p99_ms"], 4)
    for moment in ("start", "off"):
        key = f"{moment}_longest_stall_ms"
        out[f"{moment}_longest_stall_ratio"] = round(out["after"][key] / out["before"][key], 4)
    return out


if __name__ == "__main__":  # the child: the operator of its source tree, as it starts
    import stormtopo.operator.app  # noqa: F401  (kopf, aiohttp and every module the operator imports)
    from stormtopo.operator import collector

    sys.setswitchinterval(0.0005)  # (stormtopo/operator/__main__.py, in both arms' operators)
    collector.install()  # (operator/app.py's run installs it first)
    spines_, rounds_, seed_ = (int(a) for a in sys.argv[1:4])
    print(json.dumps(asyncio.run(passes(spines_, rounds_, seed_))))
