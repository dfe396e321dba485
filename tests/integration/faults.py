"""Faults of the control plane that integration tests inflict, shared by the day-two tests and the soaks."""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path

from stormtopo.devenv import processes


def apiserver_brownout(cluster_dir: Path, seconds: float) -> None:
    """kube-apiserver stopped (SIGSTOP) for `seconds`: connections accepted by the kernel, nothing answered,
    what a wedged or overloaded API server looks like to a client. Continued even if the wait is interrupted."""
    apiserver = next(p for p in processes.tracked(cluster_dir) if p.name == "kube-apiserver")
    os.kill(apiserver.pid, signal.SIGSTOP)
    try:
        time.sleep(seconds)  # the fault itself, not a wait for a condition
    finally:
        os.kill(apiserver.pid, signal.SIGCONT)
