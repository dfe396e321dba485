"""The soak of issue 14: kube-apiserver, etcd, the Volcano scheduler, AIBrix and the operator's leader are
each SIGKILLed 20 times, in a random order and at random moments, while StormServices come, scale and go.
Nothing may be lost or misplaced.

About 20 minutes on 2 cores, so it runs only with STORMTOPO_SOAK=1 (`make soak`), never in `make test`.
STORMTOPO_SOAK_SEED picks the seed (printed either way) and STORMTOPO_SOAK_KILLS the kills per component.

Two operator replicas run with leader election, as the chart runs them: they share the webhook port
(SO_REUSEPORT, like endpoints behind one Service), a certificate, and a Lease of the chart's default
duration (15 s). A killed replica comes back as a new pod would, under a new identity, so every leader
kill is a real takeover by a follower.
"""

from __future__ import annotations

import contextlib
import json
import os
import random
import shutil
import sys
import tempfile
import threading
import time
import urllib.error
import urllib.request
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from kubernetes import client
from kubernetes.client.exceptions import ApiException

from stormtopo import certificates
from stormtopo.core.topology.tree import Topology
from stormtopo.core.vocabulary import AIBRIX, HIGHEST_TIER, MODE
from stormtopo.devenv import cluster as dev
from stormtopo.devenv import processes
from stormtopo.devenv.client import DevCluster
from stormtopo.devenv.workloads import Role, stormservice
from tests.conftest import TOPOLOGY_FILE, stormtopo

pytestmark = pytest.mark.skipif(os.environ.get("STORMTOPO_SOAK") != "1", reason="the soak runs with STORMTOPO_SOAK=1 (make soak)")

HARD_LEAF = {MODE: "hard", HIGHEST_TIER: "1"}
CONSTRAINT = {"mode": "hard", "highestTierAllowed": 1}
COMPONENTS = ("kube-apiserver", "etcd", "vc-scheduler", "aibrix-controller-manager", "leader")
NAMESPACE = "soak"
LEASE_SECONDS = 15  # the chart's leaderElection.leaseDurationSeconds
LEASE_NAMESPACE = "default"  # the operator's default: the Lease and the opted-in ConfigMap live here
GPU_BUDGET = 40  # of 64 (8 nodes x 8): a 4-GPU hard gang always finds a leaf, even with deleted pods lingering
MAX_REPLICAS = 3


# -- the cluster: control plane without the devenv's operator, then two leader-elected replicas ----------


@dataclass
class Operators:
    """Two operator replicas, slots "a" and "b"; each restart is a new identity (a new pod)."""

    state: Path
    certs: Path
    metrics_ports: dict[str, int]
    generation: Counter[str] = field(default_factory=Counter)

    def identity(self, slot: str) -> str:
        return f"op-{slot}-{self.generation[slot]}"

    def start(self, slot: str) -> processes.Tracked:
        self.generation[slot] += 1
        ports = json.loads((self.state / "cluster.json").read_text())["ports"]
        argv = [
            sys.executable,
            "-m",
            "stormtopo.operator",
            f"--kubeconfig={self.state / 'kubeconfig'}",
            "--webhook-host=127.0.0.1",
            f"--webhook-port={ports['operator_webhook']}",
            f"--metrics-port={self.metrics_ports[slot]}",
            f"--cert-dir={self.certs}",
            "--leader-elect",
            f"--lease-duration={LEASE_SECONDS}",
            f"--identity={self.identity(slot)}",
        ]
        return processes.start(self.state, f"operator-{slot}", argv, env={**os.environ, "MALLOC_ARENA_MAX": "2"})

    def ready(self, slot: str) -> bool:
        return _http_ok(f"http://127.0.0.1:{self.metrics_ports[slot]}/readyz")

    def slot_of(self, identity: str) -> str | None:
        return next((s for s in self.metrics_ports if self.identity(s) == identity), None)

    def process(self, slot: str) -> processes.Tracked | None:
        return next((p for p in processes.tracked(self.state) if p.name == f"operator-{slot}"), None)


@pytest.fixture(scope="module")
def soak_cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Path, DevCluster, Operators]]:
    state = tmp_path_factory.mktemp("soak")
    stormtopo("dev", "up", "--state-dir", str(state), "--topology", str(TOPOLOGY_FILE), "--without-operator")
    try:
        certs = state / "webhook-tls"
        certs.mkdir()
        ca = certificates.new_ca("stormtopo-soak-ca")
        serving = certificates.new_serving_cert(ca, "stormtopo-webhook", ["127.0.0.1", "localhost"])
        for name, data in {"tls.crt": serving.cert_pem, "tls.key": serving.key_pem, "ca.crt": ca.cert_pem}.items():
            (certs / name).write_bytes(data)
        ports = json.loads((state / "cluster.json").read_text())["ports"]
        operators = Operators(state, certs, {"a": ports["operator_metrics"], "b": processes.free_port()})
        cluster = DevCluster(state)
        for slot in ("a", "b"):
            operators.start(slot)
        cluster.wait(lambda: all(operators.ready(s) for s in ("a", "b")), 120, "both operator replicas ready", interval=0.5)
        print(f"\n  soak cluster in {state} (logs in {state / 'logs'})")
        yield state, cluster, operators
    finally:
        # The replicas first, with SIGTERM, so the leader releases the Lease while the API server is still
        # up (`dev down` stops only a replica named "operator" before the API server).
        for p in processes.tracked(state):
            if p.name.startswith("operator-"):
                processes.stop(p)
        stormtopo("dev", "down", "--state-dir", str(state), check=False)
        # pytest keeps only its last three temporary directories; other test runs would rotate these away.
        kept = Path(tempfile.gettempdir()) / f"stormtopo-soak-logs-{time.strftime('%Y%m%dT%H%M%S')}"
        shutil.copytree(state / "logs", kept)
        print(f"\n  soak logs kept in {kept}")


def _http_ok(url: str) -> bool:
    try:
        with urllib.request.urlopen(url, timeout=2) as resp:
            return bool(resp.status == 200)
    except (urllib.error.URLError, OSError):
        return False


def _lease_holder(cluster: DevCluster) -> str:
    try:
        lease = client.CoordinationV1Api(cluster.api_client).read_namespaced_lease(
            "stormtopo-operator", LEASE_NAMESPACE, _request_timeout=3
        )
        return str(lease.spec.holder_identity or "")
    except Exception:
        return ""


# -- the workload: what the churn asked for, as the test's own record -------------------------------------


@dataclass
class Service:
    name: str
    opted_in: bool
    strategy: bool  # AIBrix's volcanoSchedulingStrategy: AIBrix makes the PodGroup, else stormtopo does
    scheduler: str | None  # "volcano", or None for kube-scheduler (never opted in)
    gpus_per_pod: int
    replicas: int = 1

    @property
    def gpus(self) -> int:
        return 2 * self.gpus_per_pod * self.replicas  # prefill + decode

    def manifest(self) -> dict[str, Any]:
        roles = (Role("prefill", gpus=self.gpus_per_pod), Role("decode", gpus=self.gpus_per_pod))
        return stormservice(
            self.name,
            NAMESPACE,
            roles=roles,
            replicas=self.replicas,
            annotations=HARD_LEAF if self.opted_in else None,
            volcano_strategy=self.strategy,
            scheduler_name=self.scheduler,
        )


@dataclass
class Churn:
    cluster: DevCluster
    rng: random.Random
    live: dict[str, Service] = field(default_factory=dict)
    deleted: set[str] = field(default_factory=set)
    counts: Counter[str] = field(default_factory=Counter)
    lock: threading.Lock = field(default_factory=threading.Lock)
    serial: int = 0
    error: str = ""  # why the churn stopped early, if it did

    def run(self, stop: threading.Event) -> None:
        try:
            while not stop.is_set():
                self.step()
                stop.wait(self.rng.uniform(0.5, 2.5))
        except Exception as exc:  # an API call failed for 3 minutes: the test reports it
            self.error = f"{time.strftime('%T')} {type(exc).__name__}: {exc}"

    def step(self) -> None:
        used = sum(s.gpus for s in self.live.values())
        choice = self.rng.choices(["create", "scale", "delete"], weights=[5, 3, 2])[0]
        if choice == "create" or len(self.live) < 3:
            self.create(used)
        elif choice == "scale":
            self.scale(used)
        else:
            self.delete()

    def create(self, used: int) -> None:
        self.serial += 1
        kind = self.rng.random()
        if kind < 0.8:  # opted in, hard, tier 1; half with AIBrix's Volcano strategy, half without
            service = Service(f"hard-{self.serial}", True, kind < 0.4, "volcano", self.rng.choice([1, 2]))
        else:  # never opted in: on Volcano through AIBrix, or on kube-scheduler
            on_volcano = kind < 0.9
            service = Service(f"plain-{self.serial}", False, on_volcano, "volcano" if on_volcano else None, 1)
        if used + service.gpus > GPU_BUDGET:
            self.delete()
            return
        _eventually(lambda: self.cluster.create(service.manifest()), ok={409})
        with self.lock:
            self.live[service.name] = service
        self.counts["created"] += 1
        self.counts["created opted-in" if service.opted_in else "created never opted in"] += 1

    def scale(self, used: int) -> None:
        service = self.rng.choice(list(self.live.values()))
        replicas = self.rng.choice([r for r in range(1, MAX_REPLICAS + 1) if r != service.replicas])
        if used + (replicas - service.replicas) * 2 * service.gpus_per_pod > GPU_BUDGET:
            replicas = 1
        if replicas == service.replicas:
            return
        _eventually(lambda: self.cluster.patch_stormservice(NAMESPACE, service.name, {"spec": {"replicas": replicas}}))
        with self.lock:
            service.replicas = replicas
        self.counts["scaled"] += 1

    def delete(self) -> None:
        if not self.live:
            return
        service = self.rng.choice(list(self.live.values()))
        _eventually(lambda: self.cluster.delete_stormservice(NAMESPACE, service.name), ok={404})
        with self.lock:
            del self.live[service.name]
            self.deleted.add(service.name)
        self.counts["deleted"] += 1


def _eventually(call: Callable[[], object], ok: frozenset[int] | set[int] = frozenset(), within: float = 180.0) -> None:
    """An API call while components die: retried until it succeeds; `ok` statuses count as success (a create
    or delete that went through although its answer was lost)."""
    deadline = time.monotonic() + within
    while True:
        try:
            call()
            return
        except ApiException as exc:
            if exc.status in ok:
                return
            if time.monotonic() > deadline:
                raise
        except Exception:
            if time.monotonic() > deadline:
                raise
        time.sleep(0.5)


# -- the watchman: every few seconds, is any opted-in replica bound outside its leaf or unconstrained? ----


@dataclass
class Watchman:
    cluster: DevCluster
    topology: Topology
    samples: int = 0
    violations: list[str] = field(default_factory=list)

    def run(self, stop: threading.Event) -> None:
        while not stop.is_set():
            with contextlib.suppress(Exception):  # the API server is down: next time
                self.sample()
            stop.wait(3.0)

    def sample(self) -> None:
        pods = self.cluster.pods(NAMESPACE)
        groups = {g["metadata"]["name"]: g for g in self.cluster.podgroups(NAMESPACE)}
        self.violations.extend(misplaced(pods, groups, self.topology))
        self.samples += 1


def misplaced(pods: list[dict[str, Any]], groups: dict[str, dict[str, Any]], topology: Topology) -> list[str]:
    """Opted-in replicas bound across more than a leaf, and bound pods whose PodGroup lacks the constraint."""
    out = []
    nodes_of: dict[str, set[str]] = {}
    for pod in pods:
        labels = pod["metadata"].get("labels") or {}
        node = pod["spec"].get("nodeName")
        if not labels.get("storm-service-name", "").startswith("hard-") or not node:
            continue
        nodes_of.setdefault(labels["roleset-name"], set()).add(node)
        group = groups.get((pod["metadata"].get("annotations") or {}).get("scheduling.k8s.io/group-name", ""))
        if group is not None and group["spec"].get("networkTopology") != CONSTRAINT:
            out.append(f"{time.strftime('%T')} pod {pod['metadata']['name']} bound on {node} in unconstrained PodGroup")
    for roleset, nodes in nodes_of.items():
        tier = topology.span(nodes).tier
        if tier is None or tier > 1:
            out.append(f"{time.strftime('%T')} replica {roleset} bound across tier {tier}: {sorted(nodes)}")
    return out


# -- the chaos monkey: SIGKILL, restart, wait until healthy -----------------------------------------------


@dataclass
class Monkey:
    state: Path
    cluster: DevCluster
    operators: Operators
    rng: random.Random
    recovery: dict[str, list[float]] = field(default_factory=dict)

    def kill(self, component: str) -> None:
        started = time.monotonic()
        if component == "leader":
            self.kill_leader()
        else:
            dev.restart_component(self.state, component, kill=True, down_for=self.rng.uniform(0.0, 2.0))
            ready = self.readiness(component)
            self.cluster.wait(lambda: ready() and self.cluster.api_ready(), 180, f"{component} healthy after its SIGKILL", interval=0.25)
        self.recovery.setdefault(component, []).append(time.monotonic() - started)

    def kill_leader(self) -> None:
        holder = self.cluster.wait(lambda: self.live_holder(), 120, "a live Lease holder to kill", interval=0.25)
        slot = self.operators.slot_of(holder)
        assert slot is not None
        process = self.operators.process(slot)
        assert process is not None
        processes.stop(process, kill=True)
        time.sleep(self.rng.uniform(0.0, 2.0))
        self.operators.start(slot)
        # Healthy: the replaced replica serves again, and a live replica holds the Lease (the dead holder's
        # identity is never reused, so this is a takeover).
        self.cluster.wait(
            lambda: self.operators.ready(slot) and self.live_holder() not in ("", holder),
            180,
            f"a new leader after {holder} was SIGKILLed",
            interval=0.25,
        )

    def live_holder(self) -> str:
        holder = _lease_holder(self.cluster)
        slot = self.operators.slot_of(holder)
        if slot is None:
            return ""
        process = self.operators.process(slot)
        return holder if process is not None and process.alive() else ""

    def readiness(self, component: str) -> Callable[[], bool]:
        ports = json.loads((self.state / "cluster.json").read_text())["ports"]
        return {
            "kube-apiserver": lambda: True,  # the API server's readiness is checked for every component
            "etcd": lambda: _http_ok(f"http://127.0.0.1:{ports['etcd']}/health"),
            "vc-scheduler": lambda: _http_ok(f"http://127.0.0.1:{ports['scheduler_healthz']}/healthz"),
            "aibrix-controller-manager": lambda: _http_ok(f"http://127.0.0.1:{ports['aibrix_probe']}/readyz"),
        }[component]


def operator_log_summary(state: Path) -> str:
    """What the operator replicas logged: leadership changes, errors and tracebacks, for the report."""
    text = "".join(log.read_text(errors="replace") for log in sorted((state / "logs").glob("operator-*.log")))
    errors = Counter(line.split(": ", 1)[-1][:100] for line in text.splitlines() if " ERROR " in line)
    return (
        f"operator logs: leadership taken {text.count(' took leadership')} times, lost {text.count(' lost leadership')} times, "
        f"{text.count('Traceback')} tracebacks, {sum(errors.values())} ERROR lines; most frequent: {errors.most_common(5)}"
    )


# -- the end state -----------------------------------------------------------------------------------------


def problems(cluster: DevCluster, churn: Churn, topology: Topology) -> list[str]:
    """Everything that differs from what the churn asked for; empty once converged."""
    out: list[str] = []
    rolesets = cluster.rolesets(NAMESPACE)
    groups = cluster.podgroups(NAMESPACE)
    pods = [p for p in cluster.pods(NAMESPACE) if not p["metadata"].get("deletionTimestamp")]
    services = {
        s["metadata"]["name"]: s for s in cluster.custom.list_namespaced_custom_object(*AIBRIX, NAMESPACE, "stormservices")["items"]
    }
    live = dict(churn.live)
    for name in set(services) - set(live):
        out.append(f"StormService {name} exists but was deleted")
    by_service: dict[str, list[dict[str, Any]]] = {}
    for rs in rolesets:
        by_service.setdefault(rs["metadata"]["labels"].get("storm-service-name", ""), []).append(rs)
    owners = {o["metadata"]["uid"] for o in rolesets} | {s["metadata"]["uid"] for s in services.values()}
    group_by_name = {g["metadata"]["name"]: g for g in groups}
    for group in groups:
        refs = group["metadata"].get("ownerReferences") or []
        if not any(r["uid"] in owners for r in refs):
            out.append(f"orphan PodGroup {group['metadata']['name']} (owners {[r['name'] for r in refs]})")
    for name, service in live.items():
        mine = by_service.get(name, [])
        if len(mine) != service.replicas:
            out.append(f"{name}: {len(mine)} RoleSets, want {service.replicas}")
        for rs in mine:
            rs_name = rs["metadata"]["name"]
            replica_pods = [p for p in pods if (p["metadata"].get("labels") or {}).get("roleset-name") == rs_name]
            out += [f"{name}: replica {rs_name} {p}" for p in replica_problems(service, group_by_name.get(rs_name), replica_pods, topology)]
    wanted_groups = {rs["metadata"]["name"] for n, s in live.items() if s.opted_in or s.strategy for rs in by_service.get(n, [])}
    for extra in sorted(set(group_by_name) - wanted_groups):
        out.append(f"PodGroup {extra} belongs to no live replica that should have one")
    stale = {(p["metadata"].get("labels") or {}).get("storm-service-name") for p in pods} - set(live)
    if stale:
        out.append(f"pods of deleted StormServices remain: {sorted(n or '?' for n in stale)}")
    return out


def replica_problems(service: Service, podgroup: dict[str, Any] | None, pods: list[dict[str, Any]], topology: Topology) -> list[str]:
    out = []
    if service.opted_in or service.strategy:
        topology_field = podgroup["spec"].get("networkTopology") if podgroup else None
        if podgroup is None:
            out.append("has no PodGroup")
        elif service.opted_in and topology_field != CONSTRAINT:
            out.append(f"has a PodGroup with networkTopology {topology_field}")
        elif not service.opted_in and topology_field is not None:
            out.append(f"never opted in but its PodGroup has networkTopology {topology_field}")
    running = [p for p in pods if p["spec"].get("nodeName") and p["status"].get("phase") == "Running"]
    if len(running) != 2 or len(pods) != 2:
        out.append(f"has {len(running)} running of {len(pods)} pods, want 2")
    elif service.opted_in and (tier := topology.span(p["spec"]["nodeName"] for p in running).tier) not in (0, 1):
        out.append(f"spans tier {tier}")
    return out


@pytest.mark.timeout(3600)
def test_soak_twenty_kills_of_each_component_during_churn(soak_cluster: tuple[Path, DevCluster, Operators], topology: Topology) -> None:
    """Proves: after 20 SIGKILLs each of kube-apiserver, etcd, vc-scheduler, AIBrix and the operator's
    leader, at random moments while StormServices are created, scaled and deleted, everything converges
    (one constrained PodGroup per opted-in replica, no orphan, every pod bound, opted-in replicas within
    one leaf, services that never opted in all bound), and no sample during the run saw an opted-in
    replica bound outside its leaf or in an unconstrained PodGroup."""
    state, cluster, operators = soak_cluster
    seed = int(os.environ.get("STORMTOPO_SOAK_SEED", str(random.SystemRandom().randrange(1 << 32))))
    per_component = int(os.environ.get("STORMTOPO_SOAK_KILLS", "20"))
    print(f"\n  soak seed {seed} (STORMTOPO_SOAK_SEED={seed} repeats it), {per_component} kills per component")
    rng = random.Random(seed)
    cluster.create_namespace(NAMESPACE)
    churn = Churn(cluster, random.Random(rng.random()))
    watchman = Watchman(cluster, topology)
    monkey = Monkey(state, cluster, operators, random.Random(rng.random()))
    plan = [c for c in COMPONENTS for _ in range(per_component)]
    rng.shuffle(plan)

    stop = threading.Event()
    threads = [
        threading.Thread(target=churn.run, args=(stop,), daemon=True),
        threading.Thread(target=watchman.run, args=(stop,), daemon=True),
    ]
    started = time.monotonic()
    for t in threads:
        t.start()
    try:
        for i, component in enumerate(plan):
            time.sleep(rng.uniform(0.5, 4.0))  # a random moment of the churn
            monkey.kill(component)
            if (i + 1) % 10 == 0:
                print(f"  {i + 1}/{len(plan)} kills, {time.monotonic() - started:.0f}s, {dict(churn.counts)}", flush=True)
    finally:
        stop.set()
        for t in threads:
            t.join(240)
    chaos = time.monotonic() - started

    converging = time.monotonic()
    last: list[str] = []

    def converged() -> bool:
        try:
            last[:] = problems(cluster, churn, topology)
        except Exception as exc:
            last[:] = [f"listing failed: {exc}"]
        return not last

    try:
        cluster.wait(converged, 180, "convergence after the soak", interval=2.0)
    except AssertionError:
        pytest.fail("not converged within 180 s after the last kill:\n  " + "\n  ".join(last[:40]))
    converge = time.monotonic() - converging
    watchman.sample()  # once more, converged
    events = cluster.core.list_namespaced_event(NAMESPACE, field_selector="reason=TopologyViolated").items
    live = churn.live.values()
    replicas = sum(s.replicas for s in live)
    opted = sum(s.replicas for s in live if s.opted_in)
    recovery = {c: f"median {sorted(v)[len(v) // 2]:.1f}s max {max(v):.1f}s" for c, v in monkey.recovery.items()}
    print(
        f"\n  soak seed {seed}: {len(plan)} kills in {chaos:.0f}s ({Counter(plan)}), recovery {recovery}\n"
        f"  churn {dict(churn.counts)}; at the end {len(churn.live)} StormServices, {replicas} replicas ({opted} opted in)\n"
        f"  converged {converge:.1f}s after the last kill; {watchman.samples} samples, {len(watchman.violations)} violations, "
        f"{len(events)} TopologyViolated Events"
    )
    print(f"  {operator_log_summary(state)}")
    assert not watchman.violations, watchman.violations[:20]
    assert not events, [e.message for e in events[:5]]
    assert not churn.error, churn.error
