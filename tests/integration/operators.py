"""The dev cluster's operator as the chart runs it beside others: restarted leader-elected under a known
identity, and a follower beside it, each with its own webhook and metrics port."""

from __future__ import annotations

import contextlib
import json
import os
import tempfile
import urllib.error
import urllib.request
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from stormtopo.devenv import cluster as dev
from stormtopo.devenv import processes
from stormtopo.devenv.client import DevCluster


def operator_process(state: Path) -> processes.Tracked:
    return next(p for p in processes.tracked(state) if p.name == "operator")


def metrics_url(state: Path, path: str) -> str:
    port = json.loads((state / "cluster.json").read_text())["ports"]["operator_metrics"]
    return f"http://127.0.0.1:{port}{path}"


def get(url: str) -> tuple[int, str]:
    """(status, body); (0, "") while nothing answers."""
    try:
        with urllib.request.urlopen(url, timeout=3) as resp:
            return int(resp.status), resp.read().decode()
    except urllib.error.HTTPError as exc:
        return int(exc.code), exc.read().decode()
    except OSError:
        return 0, ""


@contextlib.contextmanager
def elected(cluster_dir: Path, lease_seconds: int, *flags: str) -> Iterator[str]:
    """The cluster's operator, restarted with leader election under a known identity (and `flags` after
    its own: the last of a flag wins); put back after. Its log is kept in the temporary directory:
    pytest rotates the cluster's away."""
    operator = operator_process(cluster_dir)
    argv = json.loads(operator.pidfile.read_text())["argv"]
    identity = f"day-two-{uuid.uuid4().hex[:6]}"
    processes.stop(operator)
    log = cluster_dir / "logs" / "operator.log"
    start = log.stat().st_size if log.exists() else 0
    extra = ["--leader-elect", f"--identity={identity}", f"--lease-duration={lease_seconds}", *flags]
    started = processes.start(cluster_dir, "operator", [*argv, *extra], env={**os.environ, "MALLOC_ARENA_MAX": "2"})
    try:
        DevCluster.wait(lambda: get(metrics_url(cluster_dir, "/readyz"))[0] == 200, 60, "the leader-elected operator ready")
        yield identity
    finally:
        processes.stop(started)
        kept = Path(tempfile.gettempdir()) / f"stormtopo-day-two-{identity}.log"
        kept.write_text(log.read_text(errors="replace")[start:])
        print(f"\n  operator log kept in {kept}")
        dev.start_operator(cluster_dir)


@dataclass(frozen=True)
class Follower:
    process: processes.Tracked
    metrics_port: int
    webhook_port: int

    def url(self, path: str) -> str:
        return f"http://127.0.0.1:{self.metrics_port}{path}"


@contextlib.contextmanager
def follower(cluster_dir: Path, identity: str, shared_webhook: bool = False, replica: str = "") -> Iterator[Follower]:
    """A second replica of the leader-elected operator (`elected`), ready, with metrics of its own. Its
    webhook is its own (its own generated CA, not registered: the API server calls only the leader's), or
    with `shared_webhook` the leader's port and certificate (the leader started with --cert-dir): as the
    chart's replicas behind one Service, the API server reaches whichever is there (SO_REUSEPORT).
    `replica` names one of several followers (its process and its Lease identity)."""
    leader_argv = json.loads(operator_process(cluster_dir).pidfile.read_text())["argv"]
    metrics_port = processes.free_port()
    webhook_port = next((a.split("=", 1)[1] for a in leader_argv if a.startswith("--webhook-port=")), "") if shared_webhook else ""
    webhook_port = webhook_port or str(processes.free_port())
    argv = [a for a in leader_argv if not a.startswith(("--metrics-port=", "--identity=", "--webhook-port="))]
    suffix = f"-{replica}" if replica else ""
    argv += [f"--metrics-port={metrics_port}", f"--webhook-port={webhook_port}", "--no-register-webhook"]
    argv.append(f"--identity=follower-{identity}{suffix}")
    started = processes.start(cluster_dir, f"operator-follower{suffix}", argv, env={**os.environ, "MALLOC_ARENA_MAX": "2"})
    try:
        ready = Follower(started, metrics_port, int(webhook_port))
        DevCluster.wait(lambda: get(ready.url("/readyz"))[0] == 200, 60, "the follower ready")
        yield ready
    finally:
        processes.stop(started)
