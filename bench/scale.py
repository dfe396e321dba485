"""Scale: many StormServices on a large fabric. The operator's peak memory and CPU, its writes per
StormService, how long until every PodGroup is correct, and the errors it logged."""

from __future__ import annotations

import json
import os
import re
import tempfile
import time
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from bench.fabric import fabric_yaml
from stormtopo.core.vocabulary import HIGHEST_TIER, MODE
from stormtopo.devenv import cluster, processes
from stormtopo.devenv.client import DevCluster
from stormtopo.devenv.workloads import stormservice

HARD = {MODE: "hard", HIGHEST_TIER: "1"}


def _proc(pid: int) -> tuple[float, float]:
    """(peak RSS in MB, CPU seconds) of a process, from /proc."""
    status = Path(f"/proc/{pid}/status").read_text()
    hwm = int(re.search(r"VmHWM:\s+(\d+)", status).group(1)) / 1024  # type: ignore[union-attr]
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    cpu = (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
    return hwm, cpu


def _metric(text: str, name: str) -> float:
    return sum(float(line.rsplit(" ", 1)[1]) for line in text.splitlines() if line.startswith(name + "{") or line.startswith(name + " "))


def _audited_requests(audit_log: Path) -> dict[str, int]:
    """The operator's API requests by verb, from the API server's audit log (user agents
    stormtopo-operator and kopf/...): the server's count, not the client's."""
    counts: dict[str, int] = {}
    with audit_log.open() as f:
        for line in f:
            entry = json.loads(line)
            agent = entry.get("userAgent", "")
            if agent.startswith(("stormtopo-operator", "kopf/")):
                counts[entry["verb"]] = counts.get(entry["verb"], 0) + 1
    return counts


def run(services: int, shape: tuple[int, int, int] = (8, 8, 16)) -> dict[str, Any]:
    state = Path(tempfile.mkdtemp(prefix="stormtopo-scale-"))
    (state / "fabric.yaml").write_text(fabric_yaml(*shape))
    cluster.up(state, state / "fabric.yaml", timeout=300, audit=True)
    try:
        client = DevCluster(state)
        operator = next(p for p in processes.tracked(state) if p.name == "operator")
        ports = json.loads((state / "cluster.json").read_text())["ports"]
        client.create_namespace("scale")
        started = time.monotonic()
        with ThreadPoolExecutor(max_workers=8) as pool:
            list(
                pool.map(
                    lambda i: client.create(stormservice(f"s{i:04d}", "scale", annotations=HARD, volcano_strategy=i % 2 == 0)),
                    range(services),
                )
            )
        created = time.monotonic() - started

        def correct() -> bool:
            groups = client.podgroups("scale")
            return len(groups) >= services and all("networkTopology" in g["spec"] for g in groups)

        client.wait(correct, 1800, f"{services} correct PodGroups", interval=2.0)
        podgroups_correct = time.monotonic() - started
        client.wait(
            lambda: len([p for p in client.pods("scale") if p["spec"].get("nodeName")]) >= 2 * services,
            1800,
            "every pod bound",
            interval=3.0,
        )
        all_bound = time.monotonic() - started
        time.sleep(35)  # one resync period in steady state
        metrics = urllib.request.urlopen(f"http://127.0.0.1:{ports['operator_metrics']}/metrics").read().decode()
        peak_mb, cpu_s = _proc(operator.pid)
        log = (state / "logs" / "operator.log").read_text(errors="replace")
        writes = _metric(metrics, "stormtopo_podgroup_writes_total")
        requests = _audited_requests(state / "logs" / "audit.log")
        return {
            "services": services,
            "nodes": shape[0] * shape[1] * shape[2],
            "pods": 2 * services,
            "create_s": round(created, 1),
            "podgroups_correct_s": round(podgroups_correct, 1),
            "all_bound_s": round(all_bound, 1),
            "operator_peak_rss_mb": round(peak_mb, 1),
            "operator_cpu_s": round(cpu_s, 1),
            "operator_podgroup_writes": writes,
            "operator_podgroup_writes_per_service": round(writes / services, 2),
            "operator_api_requests_per_service": {verb: round(n / services, 2) for verb, n in sorted(requests.items())},
            "operator_log_errors": len(re.findall(r" ERROR ", log)),
            "operator_409": log.count("(409)"),
            "operator_429": log.count("(429)"),
        }
    finally:
        cluster.down(state)
