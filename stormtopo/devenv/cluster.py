"""`stormtopo dev up/down`: a local control plane from real upstream components.

etcd -> kube-apiserver -> (kube-controller-manager, kube-scheduler, Volcano scheduler, AIBrix controller
manager, kwok, and this project's operator) all on 127.0.0.1 with free ports. The admin identity is a
static token in group system:masters; the API server authorizes with RBAC, so the operator can run under
its own role, and kube-scheduler runs as system:kube-scheduler, as kubeadm sets it up.
"""

from __future__ import annotations

import base64
import json
import os
import secrets
import shlex
import shutil
import ssl
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from stormtopo import certificates
from stormtopo.core.topology.fabric import parse_topology
from stormtopo.core.topology.hypernodes import hypernode_manifests
from stormtopo.core.topology.tree import Topology
from stormtopo.core.volcano_conf import SCHEDULER_CONFIG_KEY, SCHEDULER_CONFIGMAP, VOLCANO_NAMESPACE
from stormtopo.devenv import components, processes, webhook_auth
from stormtopo.devenv.crds import crd_files
from stormtopo.devenv.nodes import node_manifests

ADMIN_TOKEN_USER = "stormtopo-admin"
KUBE_SCHEDULER_USER = "system:kube-scheduler"  # bound by Kubernetes' bootstrap RBAC to what it needs
SCHEDULER_CONF = """\
# gangpreempt: a replica with a network topology preempts lower-priority work within one domain of its
# tier (Volcano's preempt skips every job with a topology); preempt keeps its behaviour for every other job.
# gangreclaim: a starving job takes back its queue's share from queues over theirs, within one domain.
actions: "enqueue, allocate, preempt, gangpreempt, gangreclaim, backfill"
tiers:
- plugins:
  - name: priority
  - name: gang
    enablePreemptable: false
  - name: conformance
- plugins:
  - name: drf
    enablePreemptable: false
  - name: predicates
  - name: proportion
  # Within the domain Volcano chose, a replica's pods share a node where they fit: stormtopo gives them a
  # preferred pod affinity to each other, and GPUs are packed rather than spread (docs/install.md, "Volcano").
  - name: nodeorder
    arguments:
      podaffinity.weight: 10
      leastrequested.weight: 0
      balancedresource.weight: 0
  - name: binpack
    arguments:
      binpack.weight: 10
      binpack.resources: nvidia.com/gpu
      binpack.resources.nvidia.com/gpu: 5
  # Not in Volcano's default configuration; without it a hard networkTopology is not enforced.
  - name: network-topology-aware
    arguments:
      weight: 10
      hypernode.binpack.resources: nvidia.com/gpu
      hypernode.binpack.resources.nvidia.com/gpu: 2
"""
KCM_CONTROLLERS = ",".join(
    [
        "garbage-collector-controller",  # owner references: deleting a StormService deletes its PodGroups
        "namespace-controller",
        "serviceaccount-controller",
        "clusterrole-aggregation-controller",
        "root-ca-certificate-publisher-controller",
        "replicaset-controller",
        "deployment-controller",
        "pod-garbage-collector-controller",
        "disruption-controller",  # PodDisruptionBudgets' status, which the Eviction API (and healing) read
    ]
)


# kwok renews each node's Lease every quarter of this. Nothing here reads node Leases (kube-controller-
# manager runs no node-lifecycle controller), and at 40 s 4,096 nodes renewed 410 Leases a second, most
# of an idle 2-core machine (BENCHMARKS.md, "Quiet node heartbeats"). kwok holds a node through its Lease:
# a kwok restarted against the same etcd waits for them, so restart_component deletes them first.
NODE_LEASE_SECONDS = 3600
# Volcano opens a session (a snapshot of every node) this often; its own default is 1s. Shorter here so
# that tests wait less; scale runs take Volcano's default (at 4,096 idle nodes, 0.44 of a core at 200ms
# and 0.13 at 1s: BENCHMARKS.md, "Quiet node heartbeats").
SCHEDULE_PERIOD = "200ms"


class ClusterError(RuntimeError):
    """dev up/down could not do what was asked; the message says which component and why."""


class AlreadyRunning(ClusterError):
    pass


@dataclass
class Ports:
    etcd: int
    etcd_peer: int
    apiserver: int
    kcm: int
    kube_scheduler: int
    scheduler_metrics: int
    scheduler_healthz: int
    vc_controller_healthz: int
    vc_controller_metrics: int
    aibrix_metrics: int
    aibrix_probe: int
    kwok: int
    operator_webhook: int
    operator_metrics: int

    @classmethod
    def pick(cls) -> Ports:
        return cls(**{name: processes.free_port() for name in cls.__dataclass_fields__})


def _say(message: str) -> None:
    print(f"stormtopo: {message}", flush=True)


def down(state_dir: Path) -> int:
    """Stop every process a previous `up` started in `state_dir`; return how many were running."""
    running = processes.tracked(state_dir)
    # Reverse start order: clients first, etcd last, so nothing logs a storm of connection errors.
    order = [
        "operator",
        "kwok",
        "aibrix-controller-manager",
        "vc-controller-manager",
        "vc-scheduler",
        "kube-scheduler",
        "kube-controller-manager",
    ]
    rank = {name: i for i, name in enumerate(order)}
    running.sort(key=lambda p: (rank.get(p.name, len(order)), p.name == "etcd"))
    count = sum(1 for p in running if p.alive())
    for process in running:
        processes.stop(process)
    return count


def up(
    state_dir: Path,
    topology_file: Path | None = None,
    with_operator: bool = True,
    timeout: float = 120.0,
    vc_controllers: tuple[str, ...] = ("queue-controller", "pg-controller"),
    audit: bool = False,
    operator_args: tuple[str, ...] = (),
    schedule_period: str = SCHEDULE_PERIOD,
) -> Path:
    """Start the control plane; return the kubeconfig path. Raises AlreadyRunning or ClusterError.

    `vc_controllers` are the Volcano controllers to run. Volcano's own install runs pg-controller: it
    gives a pod that asks for Volcano and names no PodGroup one of its own, so that such a pod (a
    StormService without a scheduling strategy, and no stormtopo request or an invalid one) is placed.
    `audit` writes the API server's audit log (request metadata, with user agents) to
    DIR/logs/audit.log, for counting requests per client. `operator_args` are added to the operator's
    command line (e.g. a shorter --heal-interval and --heal-cooldown for a time-compressed benchmark).
    `schedule_period`: how often Volcano opens a session (a scale run takes Volcano's own 1s).
    """
    state_dir = state_dir.resolve()
    topology = parse_topology(topology_file.read_text()) if topology_file else None
    existing = processes.tracked(state_dir)
    if existing and all(p.alive() for p in existing):
        pids = ", ".join(f"{p.name}={p.pid}" for p in existing)
        raise AlreadyRunning(
            f"a cluster is already running in {state_dir} ({pids}); run `stormtopo dev down --state-dir {state_dir}` first"
        )
    if existing:
        _say(f"cleaning up a crashed cluster in {state_dir}")
        down(state_dir)
    started = time.monotonic()
    binaries = components.ensure_binaries()
    built = time.monotonic()
    for stale in ("etcd-data", "pki", "run"):
        shutil.rmtree(state_dir / stale, ignore_errors=True)
    state_dir.mkdir(parents=True, exist_ok=True)
    ports = Ports.pick()
    try:
        cluster = _Starter(state_dir, binaries, ports, vc_controllers, audit, operator_args, schedule_period)
        cluster.start_all(topology, with_operator, timeout)
    except BaseException:
        down(state_dir)
        raise
    _say(f"cluster ready in {time.monotonic() - built:.1f}s (binaries {built - started:.1f}s); kubeconfig: {state_dir / 'kubeconfig'}")
    return state_dir / "kubeconfig"


def scheduler_conf_objects(text: str) -> list[dict[str, Any]]:
    """Where Volcano's chart keeps vc-scheduler's configuration (and stormtopo reads it): a ConfigMap in
    volcano-system. The local vc-scheduler runs the same text from its file (DIR/volcano-scheduler.conf)."""
    return [
        {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": VOLCANO_NAMESPACE}},
        {
            "apiVersion": "v1",
            "kind": "ConfigMap",
            "metadata": {"name": SCHEDULER_CONFIGMAP, "namespace": VOLCANO_NAMESPACE},
            "data": {SCHEDULER_CONFIG_KEY: text},
        },
    ]


def set_scheduler_conf(state_dir: Path, text: str) -> None:
    """Change vc-scheduler's configuration as a Volcano install changes it: the file it runs and the ConfigMap
    it is kept in. vc-scheduler reloads the file on any write in its directory: the text is written whole
    elsewhere (DIR/run) and renamed into place, so that the one reload reads all of it."""
    state_dir = state_dir.resolve()
    staged = state_dir / "run" / "volcano-scheduler.conf.new"
    staged.write_text(text)
    staged.replace(state_dir / "volcano-scheduler.conf")
    proc = subprocess.run(
        [
            str(state_dir / "bin" / "kubectl"),
            f"--kubeconfig={state_dir / 'kubeconfig'}",
            "apply",
            "--server-side",
            "--field-manager=stormtopo-dev",
            "-f",
            "-",
        ],
        input=yaml.safe_dump_all(scheduler_conf_objects(text)),
        capture_output=True,
        text=True,
    )
    if proc.returncode != 0:
        raise ClusterError(f"kubectl apply of the scheduler's ConfigMap failed: {proc.stderr.strip()}")


OPERATOR_ARGS_ENV = "STORMTOPO_OPERATOR_ARGS"  # more operator flags, e.g. shorter periods for tests


def operator_args() -> tuple[str, ...]:
    """Flags added to every operator this cluster starts ($STORMTOPO_OPERATOR_ARGS, split as a shell would):
    the test suite runs the operator with short periods (tests/conftest.py), the demo with the defaults."""
    return tuple(shlex.split(os.environ.get(OPERATOR_ARGS_ENV, "")))


def start_operator(state_dir: Path, timeout: float = 60.0, extra: tuple[str, ...] = ()) -> processes.Tracked:
    """Start stormtopo's operator and webhook for the cluster in `state_dir` (also used to restart it)."""
    ports = json.loads((state_dir / "cluster.json").read_text())["ports"]
    operator = processes.start(
        state_dir,
        "operator",
        [
            sys.executable,
            "-m",
            "stormtopo.operator",
            f"--kubeconfig={state_dir / 'kubeconfig'}",
            f"--webhook-port={ports['operator_webhook']}",
            f"--metrics-port={ports['operator_metrics']}",
            "--webhook-host=127.0.0.1",
            *operator_args(),
            *extra,
        ],
        env=operator_env(state_dir),
    )
    _wait_ready(state_dir, operator, lambda: _http_ok(f"http://127.0.0.1:{ports['operator_metrics']}/readyz"), timeout)
    return operator


def operator_env(state_dir: Path) -> dict[str, str]:
    env = dict(os.environ)
    # Few malloc arenas: the operator's API calls run on worker threads, and one arena per thread
    # fragments memory into a much larger resident set.
    env["MALLOC_ARENA_MAX"] = "2"
    ca = webhook_auth.client_ca(state_dir)
    if ca is not None:
        # webhook.CLIENT_CA_ENV (the operator is a sibling layer): the gate answers only the API server.
        env["STORMTOPO_WEBHOOK_CLIENT_CA"] = str(ca)
    return env


def stop_component(state_dir: Path, name: str, kill: bool = False) -> None:
    """Stop one component of a running cluster (SIGKILL with `kill`): for fault-injection tests."""
    for process in processes.tracked(state_dir):
        if process.name == name:
            processes.stop(process, kill=kill)


def restart_component(state_dir: Path, name: str, kill: bool = False, down_for: float = 0.0) -> processes.Tracked:
    """Stop one component and start it again with the same command line (fault-injection tests)."""
    [process] = [p for p in processes.tracked(state_dir) if p.name == name]
    argv = json.loads(process.pidfile.read_text())["argv"]
    processes.stop(process, kill=kill)
    time.sleep(down_for)
    if name == "kwok":  # a new kwok manages a node only once its Lease is free: up to NODE_LEASE_SECONDS
        kubectl = [str(state_dir / "bin" / "kubectl"), f"--kubeconfig={state_dir / 'kubeconfig'}"]
        subprocess.run([*kubectl, "delete", "leases", "--all", "-n", "kube-node-lease"], check=True, capture_output=True)
    return processes.start(state_dir, name, argv, env=operator_env(state_dir) if name == "operator" else None)


def _wait_ready(state_dir: Path, process: processes.Tracked, ready: Callable[[], bool], timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if not process.alive():
            raise ClusterError(f"{process.name} exited during start-up; last log lines:\n{processes.log_tail(state_dir, process.name)}")
        if ready():
            return
        time.sleep(0.1)
    raise ClusterError(
        f"{process.name} was not ready within {timeout:.0f}s; last log lines:\n{processes.log_tail(state_dir, process.name)}"
    )


@dataclass(frozen=True)
class _Launched:
    """A started process and how to tell that it is ready."""

    process: processes.Tracked
    ready: Callable[[], bool]


class _Starter:
    def __init__(
        self,
        state_dir: Path,
        binaries: dict[str, Path],
        ports: Ports,
        vc_controllers: tuple[str, ...],
        audit: bool,
        operator_args: tuple[str, ...] = (),
        schedule_period: str = SCHEDULE_PERIOD,
    ) -> None:
        self.schedule_period = schedule_period
        self.vc_controllers = vc_controllers
        self.operator_args = operator_args
        self.audit = audit
        self.dir = state_dir
        self.bin = binaries
        self.ports = ports
        self.pki = state_dir / "pki"
        self.kubeconfig = state_dir / "kubeconfig"
        self.token = ""
        self.scheduler_token = ""
        self.scheduler_kubeconfig = self.pki / "kube-scheduler.kubeconfig"
        self.admission_config = self.pki / webhook_auth.ADMISSION_CONFIG

    # -- set-up -------------------------------------------------------------------------------
    def _write_pki(self) -> None:
        self.pki.mkdir(parents=True)
        ca = certificates.new_ca("stormtopo-local-ca")
        serving = certificates.new_serving_cert(ca, "kube-apiserver", ["127.0.0.1", "localhost", "kubernetes.default.svc"])
        sa_key, sa_pub = certificates.new_signing_key()
        files = {"ca.crt": ca.cert_pem, "ca.key": ca.key_pem, "apiserver.crt": serving.cert_pem, "apiserver.key": serving.key_pem}
        files |= {"sa.key": sa_key, "sa.pub": sa_pub}
        for name, data in files.items():
            (self.pki / name).write_bytes(data)
            (self.pki / name).chmod(0o600)
        self.token = secrets.token_hex(24)
        self.scheduler_token = secrets.token_hex(24)
        (self.pki / "tokens.csv").write_text(
            f'{self.token},{ADMIN_TOKEN_USER},{ADMIN_TOKEN_USER},"system:masters"\n'
            f"{self.scheduler_token},{KUBE_SCHEDULER_USER},{KUBE_SCHEDULER_USER}\n"
        )
        (self.pki / "tokens.csv").chmod(0o600)
        self.admission_config = webhook_auth.write(self.pki)

    def _write_kubeconfig(self) -> None:
        _write_private(self.kubeconfig, self._kubeconfig_for(ADMIN_TOKEN_USER, self.token))
        _write_private(self.scheduler_kubeconfig, self._kubeconfig_for(KUBE_SCHEDULER_USER, self.scheduler_token))
        bindir = self.dir / "bin"
        bindir.mkdir(exist_ok=True)
        wrapper = bindir / "kubectl"
        wrapper.write_text(f'#!/bin/sh\nexec "{self.bin["kubectl"]}" --kubeconfig "{self.kubeconfig}" "$@"\n')
        wrapper.chmod(0o755)
        (self.dir / "cluster.json").write_text(json.dumps({"ports": self.ports.__dict__, "versions": _versions()}, indent=2))

    def _kubeconfig_for(self, user: str, token: str) -> str:
        config = {
            "apiVersion": "v1",
            "kind": "Config",
            "clusters": [
                {
                    "name": "stormtopo",
                    "cluster": {
                        "server": f"https://127.0.0.1:{self.ports.apiserver}",
                        "certificate-authority-data": base64.b64encode((self.pki / "ca.crt").read_bytes()).decode(),
                    },
                }
            ],
            "users": [{"name": user, "user": {"token": token}}],
            "contexts": [{"name": "stormtopo", "context": {"cluster": "stormtopo", "user": user}}],
            "current-context": "stormtopo",
        }
        return yaml.safe_dump(config)

    def _audit_flags(self) -> list[str]:
        if not self.audit:
            return []
        policy = self.dir / "audit-policy.yaml"
        # Metadata of every request that changes or reads objects, once (at ResponseComplete).
        policy.write_text(
            "apiVersion: audit.k8s.io/v1\nkind: Policy\nomitStages: [RequestReceived, ResponseStarted]\nrules:\n- level: Metadata\n"
        )
        (self.dir / "logs").mkdir(exist_ok=True)
        return [f"--audit-policy-file={policy}", f"--audit-log-path={self.dir / 'logs' / 'audit.log'}", "--audit-log-format=json"]

    # -- processes ----------------------------------------------------------------------------
    def _start(self, name: str, args: list[str]) -> processes.Tracked:
        return processes.start(self.dir, name, [str(self.bin.get(name, name)), *args])

    def start_all(self, topology: Topology | None, with_operator: bool, timeout: float) -> None:
        self._write_pki()
        self._await(timeout, self._start_etcd())
        self._await(timeout, self._start_apiserver())
        self._write_kubeconfig()
        self._install_crds()
        self.apply(scheduler_conf_objects(SCHEDULER_CONF))
        # The controllers and schedulers only need the API server: start them all, then wait, so
        # their start-ups overlap.
        self._await(
            timeout,
            self._start_kube_controller_manager(),
            self._start_kube_scheduler(),
            self._start_volcano_scheduler(),
            self._start_volcano_controllers(),
            self._start_aibrix(),
            self._start_kwok(),
        )
        if with_operator:
            self._start_operator(timeout)
        if topology is not None:
            self._create_topology(topology, timeout)

    def _await(self, timeout: float, *launched: _Launched) -> None:
        for each in launched:
            self._wait(each.process, each.ready, timeout)

    def _start_etcd(self) -> _Launched:
        p = self.ports
        etcd = self._start(
            "etcd",
            [
                "--name=stormtopo",
                f"--data-dir={self.dir / 'etcd-data'}",
                f"--listen-client-urls=http://127.0.0.1:{p.etcd}",
                f"--advertise-client-urls=http://127.0.0.1:{p.etcd}",
                f"--listen-peer-urls=http://127.0.0.1:{p.etcd_peer}",
                f"--initial-advertise-peer-urls=http://127.0.0.1:{p.etcd_peer}",
                f"--initial-cluster=stormtopo=http://127.0.0.1:{p.etcd_peer}",
                "--unsafe-no-fsync",  # a throw-away dev cluster: durability is not worth the latency
                "--log-level=warn",
            ],
        )
        return _Launched(etcd, lambda: _http_ok(f"http://127.0.0.1:{p.etcd}/health"))

    def _start_apiserver(self) -> _Launched:
        apiserver = self._start(
            "kube-apiserver",
            [
                f"--etcd-servers=http://127.0.0.1:{self.ports.etcd}",
                "--bind-address=127.0.0.1",
                "--advertise-address=127.0.0.1",
                f"--secure-port={self.ports.apiserver}",
                f"--tls-cert-file={self.pki / 'apiserver.crt'}",
                f"--tls-private-key-file={self.pki / 'apiserver.key'}",
                f"--client-ca-file={self.pki / 'ca.crt'}",
                f"--token-auth-file={self.pki / 'tokens.csv'}",
                f"--service-account-key-file={self.pki / 'sa.pub'}",
                f"--service-account-signing-key-file={self.pki / 'sa.key'}",
                "--service-account-issuer=https://kubernetes.default.svc",
                "--authorization-mode=RBAC",
                "--service-cluster-ip-range=10.96.0.0/16",
                # The `kubernetes` Service's endpoint would be 127.0.0.1, which Endpoints refuse: older releases
                # log that every 10 s, v1.37 exits. Nothing here reaches the API server through that Service.
                "--endpoint-reconciler-type=none",
                # Fake nodes run no kubelet: pods need no service-account token volume, and with no
                # node-lifecycle controller nothing would lift the not-ready taint set at registration.
                "--disable-admission-plugins=ServiceAccount,TaintNodesByCondition",
                # As OpenShift and hardened clusters do: setting blockOwnerDeletion on an owner reference
                # needs `update` on the owner's finalizers subresource.
                "--enable-admission-plugins=OwnerReferencesPermissionEnforcement",
                # It presents a client certificate to webhooks: the operator's gate answers only it.
                f"--admission-control-config-file={self.admission_config}",
                "--allow-privileged=true",
                "--profiling=false",
                *mutating_policy_flags(components.COMPONENTS["kube-apiserver"].version),
                *self._audit_flags(),
                "--v=1",
            ],
        )
        return _Launched(apiserver, self._apiserver_ready)

    def _start_kube_controller_manager(self) -> _Launched:
        port = self.ports.kcm
        kcm = self._start(
            "kube-controller-manager",
            [
                f"--kubeconfig={self.kubeconfig}",
                f"--controllers={KCM_CONTROLLERS}",
                "--leader-elect=false",
                "--bind-address=127.0.0.1",
                f"--secure-port={port}",
                f"--cert-dir={self.pki / 'kcm'}",
                f"--root-ca-file={self.pki / 'ca.crt'}",
                "--concurrent-gc-syncs=10",
                "--v=1",
            ],
        )
        return _Launched(kcm, lambda: _http_ok(f"https://127.0.0.1:{port}/healthz", insecure=True))

    def _start_kube_scheduler(self) -> _Launched:
        """The default scheduler, as in every real cluster: it binds the pods that do not ask for Volcano."""
        port = self.ports.kube_scheduler
        scheduler = self._start(
            "kube-scheduler",
            [
                f"--kubeconfig={self.scheduler_kubeconfig}",
                "--leader-elect=false",
                "--bind-address=127.0.0.1",
                f"--secure-port={port}",
                f"--cert-dir={self.pki / 'kube-scheduler'}",
                "--v=1",
            ],
        )
        path = kube_scheduler_ready_path(components.COMPONENTS["kube-scheduler"].version)
        return _Launched(scheduler, lambda: _http_ok(f"https://127.0.0.1:{port}{path}", insecure=True))

    def _start_volcano_scheduler(self) -> _Launched:
        p = self.ports
        conf = self.dir / "volcano-scheduler.conf"
        conf.write_text(SCHEDULER_CONF)
        scheduler = self._start(
            "vc-scheduler",
            [
                f"--kubeconfig={self.kubeconfig}",
                f"--scheduler-conf={conf}",
                "--leader-elect=false",
                "--enable-healthz",
                f"--healthz-address=127.0.0.1:{p.scheduler_healthz}",
                "--enable-metrics",
                f"--listen-address=127.0.0.1:{p.scheduler_metrics}",
                f"--schedule-period={self.schedule_period}",
                f"--cache-dump-dir={self.dir}",
                f"-v={os.environ.get('STORMTOPO_VOLCANO_VERBOSITY', '2')}",  # 4 or 5: every predicate and decision
            ],
        )
        return _Launched(scheduler, lambda: _http_ok(f"http://127.0.0.1:{p.scheduler_healthz}/healthz"))

    def _start_volcano_controllers(self) -> _Launched:
        p = self.ports
        # By default only the queue controller: it opens Volcano queues, without which nothing is allocated.
        controllers = self._start(
            "vc-controller-manager",
            [
                f"--kubeconfig={self.kubeconfig}",
                f"--controllers={','.join(self.vc_controllers)}",
                "--leader-elect=false",
                "--enable-healthz",
                f"--healthz-address=127.0.0.1:{p.vc_controller_healthz}",
                f"--listen-address=127.0.0.1:{p.vc_controller_metrics}",
            ],
        )
        return _Launched(controllers, lambda: _http_ok(f"http://127.0.0.1:{p.vc_controller_healthz}/healthz"))

    def _start_aibrix(self) -> _Launched:
        p = self.ports
        aibrix = self._start(
            "aibrix-controller-manager",
            [
                f"--kubeconfig={self.kubeconfig}",
                "--controllers=stormservice-controller",
                "--disable-webhook",
                "--leader-elect=false",
                f"--metrics-bind-address=127.0.0.1:{p.aibrix_metrics}",
                f"--health-probe-bind-address=127.0.0.1:{p.aibrix_probe}",
            ],
        )
        return _Launched(aibrix, lambda: _http_ok(f"http://127.0.0.1:{p.aibrix_probe}/readyz"))

    def _start_kwok(self) -> _Launched:
        port = self.ports.kwok
        kwok_config = self.dir / "kwok.yaml"
        kwok_config.write_text(kwok_stages())
        kwok = self._start(
            "kwok",
            [
                f"--config={kwok_config}",
                f"--kubeconfig={self.kubeconfig}",
                "--manage-all-nodes=true",
                f"--server-address=127.0.0.1:{port}",
                f"--node-lease-duration-seconds={NODE_LEASE_SECONDS}",
            ],
        )
        return _Launched(kwok, lambda: _http_ok(f"http://127.0.0.1:{port}/healthz"))

    def _start_operator(self, timeout: float) -> None:
        start_operator(self.dir, timeout, self.operator_args)

    def _install_crds(self) -> None:
        files = crd_files()
        self.kubectl(["apply", "--server-side", "--force-conflicts", *[f"-f={f}" for f in files]])
        self.kubectl(["wait", "--for=condition=Established", "--timeout=60s", "crd", "--all"])

    def _create_topology(self, topology: Topology, timeout: float) -> None:
        self.apply(node_manifests(topology) + hypernode_manifests(topology))
        # One list per poll: `kubectl wait node --all` checks nodes one at a time (8 min for 4,096 nodes).
        ready = '{range .items[*]}{.status.conditions[?(@.type=="Ready")].status}{"\\n"}{end}'
        deadline = time.monotonic() + timeout
        while (count := self.kubectl(["get", "nodes", "-o", f"jsonpath={ready}"]).split().count("True")) < len(topology.nodes):
            if time.monotonic() > deadline:
                raise ClusterError(f"{count} of {len(topology.nodes)} nodes Ready after {timeout:.0f} s: see logs/kwok.log")
            time.sleep(1.0)

    def apply(self, objects: list[dict[str, Any]]) -> None:
        self.kubectl(["apply", "--server-side", "--field-manager=stormtopo-dev", "-f", "-"], stdin=yaml.safe_dump_all(objects))

    def kubectl(self, args: list[str], stdin: str | None = None) -> str:
        proc = subprocess.run(
            [str(self.bin["kubectl"]), f"--kubeconfig={self.kubeconfig}", *args], input=stdin, capture_output=True, text=True
        )
        if proc.returncode != 0:
            raise ClusterError(f"kubectl {' '.join(args[:3])} failed: {proc.stderr.strip()}")
        return proc.stdout

    def _apiserver_ready(self) -> bool:
        ctx = ssl.create_default_context(cafile=str(self.pki / "ca.crt"))
        req = urllib.request.Request(f"https://127.0.0.1:{self.ports.apiserver}/readyz", headers={"Authorization": f"Bearer {self.token}"})
        try:
            with urllib.request.urlopen(req, context=ctx, timeout=2) as resp:
                return bool(resp.status == 200)
        except (urllib.error.URLError, OSError):
            return False

    def _wait(self, process: processes.Tracked, ready: Callable[[], bool], timeout: float) -> None:
        _wait_ready(self.dir, process, ready, timeout)


def _write_private(path: Path, text: str) -> None:
    path.write_text(text)
    path.chmod(0o600)


def _http_ok(url: str, insecure: bool = False) -> bool:
    ctx = None
    if insecure:
        ctx = ssl.create_default_context()
        ctx.check_hostname = False
        ctx.verify_mode = ssl.CERT_NONE
    try:
        with urllib.request.urlopen(url, context=ctx, timeout=2) as resp:
            return bool(resp.status == 200)
    except (urllib.error.URLError, OSError):
        return False


# kwok's own stage definitions: nodes become Ready and keep a lease; pods become Running and Ready.
KWOK_STAGES = (
    "kustomize/stage/node/fast/node-initialize.yaml",
    "kustomize/stage/node/heartbeat-with-lease/node-heartbeat-with-lease.yaml",
    "kustomize/stage/pod/fast/pod-ready.yaml",
    "kustomize/stage/pod/fast/pod-complete.yaml",
    "kustomize/stage/pod/fast/pod-delete.yaml",
)


def kwok_stages() -> str:
    root = components.module_dir_of("kwok", "sigs.k8s.io/kwok", components.KWOK_VERSION)
    return "\n---\n".join((root / stage).read_text() for stage in KWOK_STAGES)


def mutating_policy_flags(version: str) -> list[str]:
    """MutatingAdmissionPolicy, which labels a new opted-in StormService's role templates inside the API server
    (core/optin.py): beta and off by default in v1.34 and v1.35, on from v1.36; before v1.34 the webhook does it."""
    major, minor = (int(part) for part in version.lstrip("v").split(".")[:2])
    if (major, minor) in ((1, 34), (1, 35)):
        return ["--feature-gates=MutatingAdmissionPolicy=true", "--runtime-config=admissionregistration.k8s.io/v1beta1=true"]
    return []


def kube_scheduler_ready_path(version: str) -> str:
    """How to tell kube-scheduler `version` is ready.

    /readyz, unlike /healthz, waits for its informers to sync: ready means it schedules. kube-scheduler
    serves it since v1.31 (kubernetes#118148); v1.30 answers 404 there, so only /healthz is left.
    """
    major, minor = (int(part) for part in version.lstrip("v").split(".")[:2])
    return "/readyz" if (major, minor) >= (1, 31) else "/healthz"


def _versions() -> dict[str, str]:
    return {name: components.COMPONENTS[name].version for name in components.CONTROL_PLANE}
