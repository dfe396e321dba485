"""What every results file of `python -m bench` starts with: the command that produced it, the commit, the
machine and the pinned versions, and where results files go (bench/results/)."""

from __future__ import annotations

import json
import platform
import subprocess
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from stormtopo.devenv import components

RESULTS = Path(__file__).resolve().parent / "results"
REPO = Path(__file__).resolve().parents[1]


def machine() -> dict[str, Any]:
    """The CPU model, cores and memory (Linux's /proc)."""
    cpuinfo = Path("/proc/cpuinfo").read_text().splitlines()
    meminfo = Path("/proc/meminfo").read_text().splitlines()
    cpu = next((line.split(":", 1)[1].strip() for line in cpuinfo if line.startswith("model name")), "?")
    memory_kib = next((line.split()[1] for line in meminfo if line.startswith("MemTotal")), "0")
    return {
        "cpu": cpu,
        "cores": sum(1 for line in cpuinfo if line.startswith("processor")),
        "memory_gib": round(int(memory_kib) / 1024 / 1024, 1),
    }


def versions() -> dict[str, Any]:
    """The pins of stormtopo/devenv/components.py the local control plane runs (STORMTOPO_*_VERSION
    override them), each binary's version, and the toolchains."""
    try:
        go = subprocess.run(["go", "version"], capture_output=True, text=True, check=False).stdout.strip()
    except OSError:
        go = ""
    return {
        "kubernetes": components.KUBERNETES_VERSION,
        "volcano": components.VOLCANO_VERSION,
        "aibrix": components.AIBRIX_VERSION,
        "kwok": components.KWOK_VERSION,
        "etcd": components.ETCD_VERSION,
        "python": platform.python_version(),
        "go": go,
        "components": {name: components.COMPONENTS[name].version for name in components.CONTROL_PLANE},
    }


def commit() -> dict[str, Any]:
    """HEAD of the checkout the bench ran from, and whether tracked files differed from it."""

    def git(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(["git", "-C", str(REPO), *args], capture_output=True, text=True, check=False)

    try:
        head = git("rev-parse", "HEAD").stdout.strip()
        dirty = git("diff", "--quiet", "HEAD", "--").returncode == 1
    except OSError:
        head, dirty = "", False
    return {"commit": head or None, "dirty": dirty}


def provenance(command: str) -> dict[str, Any]:
    return {"command": command, **commit(), "machine": machine(), "versions": versions()}


def stamped(command: str, result: Mapping[str, Any]) -> dict[str, Any]:
    """The result with its provenance first (the result's own keys win)."""
    return {**provenance(command), **result}


def write(name: str, command: str, result: Mapping[str, Any], *, indent: int | None = 2) -> Path:
    """bench/results/NAME.json: the result with its provenance."""
    RESULTS.mkdir(exist_ok=True)
    path = RESULTS / f"{name}.json"
    path.write_text(json.dumps(stamped(command, result), indent=indent, default=str) + "\n")
    return path
