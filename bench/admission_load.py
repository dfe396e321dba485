"""Admission under explanation load: do pending hard gangs slow the webhook?

The operator explains every pending hard gang (free GPUs of every node, then a bounded packing
search per domain) in its worker process, while the operator's own process answers admissions. On
1,024 fragmented nodes, rounds alternate: A with no gang pending, B with 20 hard tier-1 gangs of 12
pods that no leaf can hold. Each round sends, at a fixed rate, server-side dry-run creates of an
opted-in pod (through the webhook) and of a plain pod (not through it: the machine's noise), and the
opted-in pod's AdmissionReview straight to the webhook. p99 of B against A, same run, same cluster."""

from __future__ import annotations

import json
import multiprocessing
import os
import statistics
import tempfile
import time
import urllib.request
import uuid
from collections import Counter
from collections.abc import Callable
from concurrent.futures import ProcessPoolExecutor, ThreadPoolExecutor
from pathlib import Path
from typing import Any

import urllib3

from bench.fabric import fabric_yaml, fragmentation
from stormtopo.core.explanation import plan_pending
from stormtopo.core.request import Mode, parse_request
from stormtopo.core.topology.fabric import parse_topology
from stormtopo.core.topology.tree import Topology
from stormtopo.core.vocabulary import ADMITTED_LABEL, HIGHEST_TIER, MODE
from stormtopo.devenv import cluster, processes
from stormtopo.devenv.client import DevCluster
from stormtopo.devenv.workloads import Role, filler_pod, stormservice
from stormtopo.kube.client import Api

HARD = {MODE: "hard", HIGHEST_TIER: "1"}

# 12-pod gangs of mixed GPU sizes that no leaf of the fragmented LARGE fabric (seed 7) can hold,
# though most leaves have the GPUs in sum: each needs the packing search. Found offline: the
# costliest to explain of ~17,000 random shapes (10-40 ms each); checked again against the live cluster.
GANGS: tuple[tuple[int, ...], ...] = (
    (7, 7, 7, 6, 6, 6, 6, 5, 5, 4, 2, 2),
    (6, 6, 6, 6, 6, 6, 6, 6, 3, 3, 3, 2),
    (7, 7, 7, 7, 7, 5, 5, 5, 5, 5, 5, 5),
    (6, 6, 6, 5, 5, 5, 5, 5, 5, 2, 2, 2),
    (7, 7, 7, 6, 6, 6, 6, 6, 5, 5, 4, 2),
    (7, 5, 5, 5, 5, 5, 5, 5, 4, 4, 4, 1),
    (6, 5, 5, 5, 5, 5, 5, 5, 5, 5, 4, 2),
    (7, 7, 5, 5, 5, 5, 5, 5, 5, 5, 5, 3),
    (7, 7, 7, 7, 7, 7, 5, 5, 5, 5, 5, 5),
    (7, 7, 6, 6, 6, 6, 6, 5, 5, 1, 1, 1),
    (6, 6, 6, 6, 5, 5, 5, 5, 5, 2, 2, 2),
    (6, 6, 6, 6, 5, 5, 5, 5, 5, 5, 5, 2),
    (7, 7, 7, 7, 6, 6, 6, 6, 5, 4, 2, 1),
    (7, 6, 6, 6, 6, 6, 6, 6, 6, 3, 2, 1),
    (7, 7, 7, 7, 5, 5, 5, 5, 5, 3, 2, 1),
    (7, 7, 5, 5, 5, 5, 5, 5, 5, 3, 1, 1),
    (5, 5, 5, 5, 5, 5, 5, 5, 4, 4, 4, 4),
    (6, 6, 5, 5, 5, 5, 5, 5, 5, 5, 4, 2),
    (6, 6, 6, 6, 6, 5, 5, 5, 5, 2, 1, 1),
    (7, 7, 7, 7, 7, 6, 6, 6, 6, 5, 5, 5),
)


def gang_roles(pods: tuple[int, ...]) -> tuple[Role, ...]:
    """One role per GPU size, with as many replicas as pods of that size."""
    return tuple(Role(f"gpu{gpus}", replicas=count, gpus=gpus) for gpus, count in sorted(Counter(pods).items(), reverse=True))


def _quantile(values: list[float], q: float) -> float:
    return statistics.quantiles(values, n=1000, method="inclusive")[round(q * 1000) - 1]


def _ms(values: list[float]) -> dict[str, float]:
    return {
        "p50": round(_quantile(values, 0.5) * 1000, 2),
        "p99": round(_quantile(values, 0.99) * 1000, 2),
        "max": round(max(values) * 1000, 2),
    }


class Probe:
    """Reads the operator from outside: its metrics port and its CPU time."""

    def __init__(self, state: Path) -> None:
        self.state = state
        ports = json.loads((state / "cluster.json").read_text())["ports"]
        self.url = f"http://127.0.0.1:{ports['operator_metrics']}/metrics"
        self.pids = {p.name: p.pid for p in processes.tracked(state)}

    def metrics(self) -> str:
        with urllib.request.urlopen(self.url, timeout=10) as response:
            return str(response.read().decode())

    def value(self, sample: str, default: float) -> float:
        """A sample without labels, e.g. a gauge or a histogram's _count."""
        return next((float(line.split()[-1]) for line in self.metrics().splitlines() if line.startswith(sample + " ")), default)

    def pending_gangs(self) -> float:
        return self.value("stormtopo_pending_gangs", -1.0)

    def admission_buckets(self, kind: str = "pod") -> dict[str, float]:
        """The webhook's own admission histogram for `kind` (cumulative counts by upper bound)."""
        return self._by_label(f'stormtopo_admission_seconds_bucket{{kind="{kind}",le="')

    def _by_label(self, prefix: str) -> dict[str, float]:
        """The samples whose line starts with `prefix`, by the label value that follows it."""
        return {
            line[len(prefix) :].split('"')[0]: float(line.split()[-1]) for line in self.metrics().splitlines() if line.startswith(prefix)
        }

    def queue_depth(self) -> float:
        """Keys waiting in the operator's work queues now, all queues together."""
        return sum(self._by_label('stormtopo_workqueue_depth{queue="').values())

    def observed(self) -> dict[str, float]:
        """Objects the operator's index has recorded so far (watch events), by kind."""
        return self._by_label('stormtopo_observed_objects_total{kind="')

    def explanations(self) -> float:
        """Explanations the worker has answered so far."""
        return self.value("stormtopo_explanation_seconds_count", 0.0)

    def cpu_seconds(self) -> dict[str, float]:
        """CPU seconds of every component so far, and of the operator's explanation worker (a child
        process: its CPU counts once it has exited and been reaped; it lives as long as the operator)."""
        seconds = {name: _cpu(pid) for name, pid in self.pids.items()}
        seconds["explanation-worker"] = sum(_cpu(child) for child in _children(self.pids["operator"]))
        return seconds


def _stat(pid: int) -> list[str]:
    return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()


def _cpu(pid: int) -> float:
    try:
        fields = _stat(pid)
    except FileNotFoundError:
        return 0.0
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _children(pid: int) -> list[int]:
    """Processes whose parent is `pid` (the explanation worker, and multiprocessing's resource tracker)."""
    out = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                if int(_stat(int(entry.name))[1]) == pid:
                    out.append(int(entry.name))
            except (FileNotFoundError, ProcessLookupError):
                continue
    return out


def _pin(pid: int, cpus: set[int]) -> None:
    """Every thread of `pid` (a Go process has many) onto `cpus`; threads it creates later inherit it."""
    for task in Path(f"/proc/{pid}/task").iterdir():
        try:
            os.sched_setaffinity(int(task.name), cpus)
        except (ProcessLookupError, FileNotFoundError):
            continue


def pin_stormtopo_apart(probe: Probe) -> dict[str, list[int]]:
    """stormtopo on a core of its own, the rest of the cluster on the other, as on a real cluster
    where the webhook's pod does not share a node's CPUs with the API server and Volcano's scheduler.
    The bench's client goes with stormtopo: it is light (30 requests a second), and on the cluster's
    core it would time the cluster's queue rather than the webhook. The explanation worker shares
    stormtopo's core, as it shares its pod. Without two cores, nothing is pinned."""
    if len(os.sched_getaffinity(0)) < 2:
        return {}
    cluster_cpu, stormtopo_cpu = sorted(os.sched_getaffinity(0))[:2]
    for name, pid in probe.pids.items():
        _pin(pid, {stormtopo_cpu} if name == "operator" else {cluster_cpu})
    _pin(os.getpid(), {stormtopo_cpu})
    return {"cluster": [cluster_cpu], "operator, its worker and the bench client": [stormtopo_cpu]}


RATE = 10.0  # pairs of admissions per second (an opted-in pod and a plain one): see measure()
# AdmissionReviews per second straight to the webhook: 3,000 a round, so that a phase's p99 is its
# 90th-worst answer, not its 18th (at 10 a second one stall of the machine moved it by half).
DIRECT_RATE = 50.0


def _dry_run(api: Api, namespace: str, pod: dict[str, Any]) -> dict[str, Any]:
    return dict(api.request("POST", f"/api/v1/namespaces/{namespace}/pods", pod, dryRun="All"))


class Webhook:
    """Posts AdmissionReviews straight to the operator's pod webhook, as the API server does: the
    webhook's own answer time, without the API server's."""

    def __init__(self, state: Path) -> None:
        port = json.loads((state / "cluster.json").read_text())["ports"]["operator_webhook"]
        self.url = f"https://127.0.0.1:{port}/mutate/pods"
        # the bench's own connection to 127.0.0.1: the API server verifies the webhook's certificate
        urllib3.disable_warnings(urllib3.exceptions.InsecureRequestWarning)
        self.http = urllib3.PoolManager(maxsize=32, cert_reqs="CERT_NONE", timeout=urllib3.Timeout(connect=5, read=30))

    def review(self, pod: dict[str, Any]) -> dict[str, Any]:
        body = {
            "apiVersion": "admission.k8s.io/v1",
            "kind": "AdmissionReview",
            "request": {
                "uid": str(uuid.uuid4()),
                "kind": {"group": "", "version": "v1", "kind": "Pod"},
                "resource": {"group": "", "version": "v1", "resource": "pods"},
                "namespace": pod["metadata"]["namespace"],
                "operation": "CREATE",
                "userInfo": {"username": "system:serviceaccount:aibrix-system:aibrix-controller-manager"},
                "object": pod,
                "dryRun": True,
            },
        }
        response = self.http.request("POST", self.url, body=json.dumps(body).encode(), headers={"Content-Type": "application/json"})
        if response.status != 200:
            raise RuntimeError(f"webhook answered {response.status}: {response.data[:200]!r}")
        return dict(json.loads(response.data)["response"])


def _pod(i: int, namespace: str, labels: dict[str, str]) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": f"adm-{i}", "namespace": namespace, "labels": labels},
        "spec": {"containers": [{"name": "c", "image": "x"}]},
    }


def open_loop(send: Callable[[int, str], None], paths: tuple[str, ...], seconds: float, rate: float) -> dict[str, list[float]]:
    """Every 1/`rate` s, `send(i, path)` for each path, on a pool of threads: requests go out on a fixed
    schedule whatever the answers, and each is timed from when it was due, so a stall delays (and
    counts against) every request behind it."""
    times: dict[str, list[float]] = {path: [] for path in paths}

    def timed(i: int, path: str, due: float) -> None:
        send(i, path)
        times[path].append(time.monotonic() - due)

    started = time.monotonic()
    with ThreadPoolExecutor(max_workers=32) as pool:
        i = 0
        while (due := started + i / rate) < started + seconds:
            time.sleep(max(0.0, due - time.monotonic()))
            for k in range(len(paths)):  # rotate the order, so that no path is always last
                pool.submit(timed, i, paths[(i + k) % len(paths)], due)
            i += 1
    return times


def probe_webhook(state: Path, namespace: str, labels: dict[str, str], seconds: float, rate: float) -> tuple[list[float], int]:
    """In a process of its own (the bench's API-server requests would otherwise share its GIL): the
    opted-in pod's AdmissionReview straight to the webhook. Its times, and how many were patched."""
    webhook, patched = Webhook(state), [0]
    webhook.review(_pod(-1, namespace, labels))  # untimed: the bench's TLS handshake is not the webhook's answer

    def send(i: int, _: str) -> None:
        patched[0] += bool(webhook.review(_pod(i, namespace, labels)).get("patch"))

    return open_loop(send, ("direct",), seconds, rate)["direct"], patched[0]


def measure(
    api: Api,
    prober: ProcessPoolExecutor,
    probe: Probe,
    namespace: str,
    service: str,
    roleset: str,
    seconds: float,
    rate: float = RATE,
    direct_rate: float = DIRECT_RATE,
) -> dict[str, Any]:
    """For `seconds`, every 1/`rate` s: a dry-run create of an opted-in pod (the webhook answers it) and
    of a plain one (no webhook: the machine's noise); every 1/`direct_rate` s, from another process,
    the opted-in pod's AdmissionReview straight to the webhook; and what the operator did meanwhile.

    Open loop, as pods arrive in a cluster (see open_loop). A closed loop (the next request when the
    last is answered) keeps the API server busy all the time instead: on 2 cores it then measures how
    saturated the machine is (BENCHMARKS.md).
    """
    opted_in = {"storm-service-name": service, "roleset-name": roleset, "role-name": "decode"}
    admitted = [0]
    buckets, podgroups = probe.admission_buckets(), probe.admission_buckets("podgroup").get("+Inf", 0.0)
    explanations, observed = probe.explanations(), probe.observed()
    cpu, started = probe.cpu_seconds(), time.monotonic()
    direct = prober.submit(probe_webhook, probe.state, namespace, opted_in, seconds, direct_rate)

    def send(i: int, path: str) -> None:
        created = _dry_run(api, namespace, _pod(i, namespace, opted_in if path == "webhook" else {}))
        admitted[0] += path == "webhook" and (created["metadata"].get("labels") or {}).get(ADMITTED_LABEL) == "true"

    times = open_loop(send, ("webhook", "plain"), seconds, rate)
    times["direct"], patched = direct.result(timeout=seconds + 120)
    wall = time.monotonic() - started
    after = probe.admission_buckets()
    return {
        "seconds": round(wall, 1),
        **times,
        "admitted_by_webhook": admitted[0],  # failurePolicy Ignore: a timed-out answer would pass unmutated
        "patched_by_direct_review": patched,
        "cpu_share": {name: round((seconds - cpu[name]) / wall, 3) for name, seconds in probe.cpu_seconds().items()},
        "operator_admission_buckets": {le: after[le] - buckets.get(le, 0.0) for le in after},
        # AIBrix rewrites a pending replica's PodGroup about twice a second: the webhook answers each
        "podgroup_admissions_per_s": round((probe.admission_buckets("podgroup").get("+Inf", 0.0) - podgroups) / wall, 1),
        "pending_gangs_after": probe.pending_gangs(),
        # what the operator's process followed meanwhile: in B, pending pods and PodGroups keep changing
        "observed_per_s": {kind: round((n - observed.get(kind, 0.0)) / wall, 1) for kind, n in probe.observed().items()},
        "explanations": probe.explanations() - explanations,
    }


def _wait_pending(client: DevCluster, probe: Probe, namespace: str, names: list[str], timeout: float) -> float:
    """Until the operator reports every gang unsatisfiable (gauge and Events); returns seconds waited."""
    started = time.monotonic()

    def explained() -> bool:
        events = client.core.list_namespaced_event(namespace, field_selector="reason=TopologyUnsatisfiable").items
        said = {e.involved_object.name for e in events}
        return said >= set(names) and probe.pending_gangs() == len(names)

    client.wait(explained, timeout, f"{len(names)} TopologyUnsatisfiable gangs", interval=2.0)
    return time.monotonic() - started


def explanation_cost(state: Path, topology: Topology, gangs: tuple[tuple[int, ...], ...]) -> dict[str, Any]:
    """What one explanation costs the operator, outside it: its free-GPU read (the same call), and the
    packing search for each gang on that reading. Every gang must be unsatisfiable at tier 1."""
    api = Api(str(state / "kubeconfig"))
    reads = []
    for _ in range(3):
        start = time.perf_counter()
        free = api.free_gpus()
        reads.append(time.perf_counter() - start)
    request = parse_request(HARD)
    assert request is not None and request.mode is Mode.HARD
    searches = []
    for pods in gangs:
        start = time.perf_counter()
        pending = plan_pending(request, pods, len(pods), topology, free)
        searches.append(time.perf_counter() - start)
        if pending is None or pending.explanation.fits:
            raise AssertionError(f"gang {pods} fits a leaf of this cluster: it would not stay Pending")
    return {
        "free_gpus_read_s_median": round(statistics.median(reads), 3),
        "search_ms": {"median": round(statistics.median(searches) * 1000, 1), "max": round(max(searches) * 1000, 1)},
        "search_s_all_gangs": round(sum(searches), 2),
    }


def _in_parallel(work: Callable[[dict[str, Any]], object], objects: list[dict[str, Any]]) -> None:
    with ThreadPoolExecutor(max_workers=8) as pool:
        list(pool.map(work, objects))


def run(shape: tuple[int, int, int], rounds: int = 3, seconds: float = 60.0, pinned: bool = True) -> dict[str, Any]:
    """`rounds` pairs of rounds A, B on a fresh cluster of `shape` (spines, leaves per spine, nodes
    per leaf), `seconds` each: longer than a resync (30 s) and than the first re-check of a gang
    (10 s), so gangs are re-explained during every B round. `pinned`: see pin_stormtopo_apart."""
    description = fabric_yaml(*shape)
    topology = parse_topology(description)
    affinity = os.sched_getaffinity(0)
    state = Path(tempfile.mkdtemp(prefix="stormtopo-admission-"))
    (state / "fabric.yaml").write_text(description)
    started = time.monotonic()
    cluster.up(state, state / "fabric.yaml", timeout=300)
    out: dict[str, Any] = {"nodes": len(topology.nodes), "gangs": len(GANGS), "pods_per_gang": len(GANGS[0]), "seconds_per_round": seconds}
    try:
        client = DevCluster(state)
        probe = Probe(state)
        api = Api(str(state / "kubeconfig"))
        client.create_namespace("bench-fill")
        used = fragmentation(sorted(topology.nodes), seed=7)
        _in_parallel(client.create, [filler_pod(f"busy-{node}", "bench-fill", node, gpus) for node, gpus in used.items()])
        client.bound_pods("bench-fill", "stormtopo.io/filler=true", len(used), timeout=300)
        client.create_namespace("bench-adm")
        client.create(stormservice("lat-svc", "bench-adm", annotations=HARD))
        client.bound_pods("bench-adm", "app=lat-svc", 2, timeout=120)
        roleset = client.only(lambda: client.rolesets("bench-adm", "lat-svc"), "RoleSet of lat-svc")["metadata"]["name"]
        out["explanation_cost"] = explanation_cost(state, topology, GANGS)
        out["pinned_cpus"] = pin_stormtopo_apart(probe) if pinned else {}
        # started after pin_stormtopo_apart: the prober inherits the bench's core
        prober = ProcessPoolExecutor(max_workers=1, mp_context=multiprocessing.get_context("spawn"))
        prober.submit(os.getpid).result(timeout=120)  # started and imported before the first round

        phases: dict[str, list[dict[str, Any]]] = {"A": [], "B": []}
        for r in range(rounds):
            phases["A"].append(measure(api, prober, probe, "bench-adm", "lat-svc", roleset, seconds))
            namespace = f"bench-gangs-{r}"
            client.create_namespace(namespace)
            names = [f"gang-{i:02d}" for i in range(len(GANGS))]
            _in_parallel(
                client.create,
                [stormservice(name, namespace, roles=gang_roles(pods), annotations=HARD) for name, pods in zip(names, GANGS, strict=True)],
            )
            explained_after = _wait_pending(client, probe, namespace, names, timeout=600)
            phases["B"].append(
                {**measure(api, prober, probe, "bench-adm", "lat-svc", roleset, seconds), "explained_after_s": round(explained_after, 1)}
            )
            if r < rounds - 1:
                client.delete_namespace(namespace, wait=300)
                client.wait(lambda: probe.pending_gangs() == 0, 300, "the pending-gang gauge to drop to 0", interval=1.0)
        prober.shutdown()
        out.update(summarize(phases))
    finally:
        cluster.down(state)
        _pin(os.getpid(), affinity)
        out["seconds"] = round(time.monotonic() - started, 1)
    return out


PATHS = ("webhook", "plain", "direct")


def summarize(phases: dict[str, list[dict[str, Any]]]) -> dict[str, Any]:
    """Percentiles over every sample of a phase, the B/A ratios, and each round without its raw samples."""
    ms = {path: {p: _ms([t for r in rounds for t in r[path]]) for p, rounds in phases.items()} for path in PATHS}
    a, b = ms["webhook"]["A"], ms["webhook"]["B"]
    pa, pb = ms["plain"]["A"], ms["plain"]["B"]
    da, db = ms["direct"]["A"], ms["direct"]["B"]
    return {
        "samples_per_phase": {path: {p: sum(len(r[path]) for r in rounds) for p, rounds in phases.items()} for path in PATHS},
        "webhook_ms": ms["webhook"],
        "plain_ms": ms["plain"],
        "direct_ms": ms["direct"],
        "p99_ratio": round(b["p99"] / a["p99"], 3),
        "p50_ratio": round(b["p50"] / a["p50"], 3),
        "plain_p99_ratio": round(pb["p99"] / pa["p99"], 3),
        "plain_p50_ratio": round(pb["p50"] / pa["p50"], 3),
        "direct_p99_ratio": round(db["p99"] / da["p99"], 3),
        "direct_p50_ratio": round(db["p50"] / da["p50"], 3),
        # the webhook's share once the cluster's own slowdown (the plain path) is divided out
        "p99_ratio_over_plain": round((b["p99"] / pb["p99"]) / (a["p99"] / pa["p99"]), 3),
        "p50_ratio_over_plain": round((b["p50"] / pb["p50"]) / (a["p50"] / pa["p50"]), 3),
        "rounds": [
            {
                "phase": p,
                **{k: v for k, v in r.items() if k not in PATHS},
                **{f"{path}_ms": _ms(r[path]) for path in PATHS},
            }
            for i in range(max(len(v) for v in phases.values()))
            for p in ("A", "B")
            if i < len(phases[p])
            for r in [phases[p][i]]
        ],
    }
