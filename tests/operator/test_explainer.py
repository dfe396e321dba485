"""The explanation worker is a process of its own, at a lower priority than the operator's, and it
never outlives the operator that started it, however the operator ends (the soak SIGKILLs the leader
20 times)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

from stormtopo.operator.explainer import WORKER_NICENESS

OPERATOR = """
import os, sys, time
from stormtopo.operator.explainer import Explainer
explainer = Explainer()
print(explainer._executor().submit(os.getpid).result(timeout=60), flush=True)
print(explainer._executor().submit(os.nice, 0).result(timeout=60) - os.nice(0), flush=True)
time.sleep(600)
"""


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    # a zombie is gone for our purpose: it holds no memory and does no work
    try:
        with open(f"/proc/{pid}/stat") as stat:
            return stat.read().rsplit(")", 1)[1].split()[0] != "Z"
    except FileNotFoundError:
        return False


def test_worker_exits_when_the_operator_is_killed() -> None:
    operator = subprocess.Popen([sys.executable, "-c", OPERATOR], stdout=subprocess.PIPE, text=True)
    try:
        assert operator.stdout is not None
        worker = int(operator.stdout.readline())
        assert worker != operator.pid and _alive(worker)
        assert int(operator.stdout.readline()) == WORKER_NICENESS  # background work: admissions come first
        operator.send_signal(signal.SIGKILL)
        operator.wait(timeout=30)
        deadline = time.monotonic() + 30
        while _alive(worker) and time.monotonic() < deadline:
            time.sleep(0.2)
        assert not _alive(worker), f"explanation worker {worker} outlived its operator"
    finally:
        if operator.poll() is None:
            operator.kill()
