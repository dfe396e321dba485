"""The idle cost of a large local control plane (issue 21): a cluster of 4,096 kwok nodes brought up, left
30 s to settle, then each component's CPU read from /proc over 60 s; once per setting, one cluster after
the other. A setting is `LEASE_SECONDS,SCHEDULE_PERIOD`: kwok's node Lease duration (kwok renews each
every quarter of it) and Volcano's schedule period.

    python -m bench idle 40,200ms 3600,200ms 3600,1s      # about 10 minutes; bench/results/idle-4096.json
"""

from __future__ import annotations

import tempfile
import time
from pathlib import Path
from typing import Any

from bench import scale_nodes
from bench.fabric import fabric_yaml
from stormtopo.devenv import cluster, processes

SHAPE = (16, 16, 16)
SETTLE, WATCHED = 30.0, 60.0  # seconds; an idle cluster: there is no condition to wait for


def idle(lease: int, period: str) -> dict[str, Any]:
    cluster.NODE_LEASE_SECONDS = lease  # read when kwok starts
    state = Path(tempfile.mkdtemp(prefix="stormtopo-idle-"))
    (state / "fabric.yaml").write_text(fabric_yaml(*SHAPE))
    started = time.monotonic()
    cluster.up(state, state / "fabric.yaml", timeout=900, schedule_period=period)
    up = time.monotonic() - started
    try:
        pids = {p.name: p.pid for p in processes.tracked(state)}
        time.sleep(SETTLE)
        cpu, t0 = scale_nodes._cpu_all(pids), time.monotonic()
        time.sleep(WATCHED)
        cores = scale_nodes._cores(cpu, scale_nodes._cpu_all(pids), time.monotonic() - t0)
    finally:
        cluster.down(state)
    return {"lease_s": lease, "schedule_period": period, "up_s": round(up, 1), "idle_cores": cores, "total": round(sum(cores.values()), 3)}
