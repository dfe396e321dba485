"""Background processes of a local cluster, tracked by pid files in the state directory.

A pid file records the pid and the process start time (from /proc), so a recycled pid is never
mistaken for ours and `dev down` ends only processes this project started.
"""

from __future__ import annotations

import contextlib
import json
import os
import random
import signal
import socket
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class Tracked:
    name: str
    pid: int
    start_time: str
    pidfile: Path

    def alive(self) -> bool:
        return _start_time(self.pid) == self.start_time


def _start_time(pid: int) -> str | None:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    # Field 22 (starttime) counts from after the parenthesised command name, which may contain spaces.
    fields = stat[stat.rindex(")") + 2 :].split()
    if fields[0] == "Z":  # a zombie is as good as gone
        return None
    return fields[19]


_handed_out: set[int] = set()


def free_port() -> int:
    """A port on 127.0.0.1 that is free now, for a process started later. Chosen below the kernel's
    ephemeral range: a port from that range (what bind to port 0 gives) can be taken meanwhile by any
    outgoing connection's local end, and a component then fails to start with "address in use"."""
    first, last = _port_range()
    for _ in range(200):
        port = random.randint(first, last)
        if port in _handed_out:
            continue
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
            try:
                s.bind(("127.0.0.1", port))
            except OSError:
                continue
        _handed_out.add(port)
        return port
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:  # a crowded machine: any free port
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _port_range() -> tuple[int, int]:
    """The 12,000 ports below the ephemeral range; STORMTOPO_PORT_SLICE=i/n keeps to the i-th of n slices
    of it, so that n processes starting clusters at once (the test suite's workers) never pick one port
    between the check here and the component's bind."""
    low = _ephemeral_low()
    first, last = max(1024, low - 12_000), low - 1
    index, _, count = os.environ.get("STORMTOPO_PORT_SLICE", "0/1").partition("/")
    try:
        i, n = int(index), int(count)
    except ValueError:
        return first, last
    if not 0 <= i < n:
        return first, last
    width = (last - first + 1) // n
    return first + i * width, first + (i + 1) * width - 1


def _ephemeral_low() -> int:
    try:
        return int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return 32768


def run_dir(state_dir: Path) -> Path:
    return state_dir / "run"


def start(state_dir: Path, name: str, argv: list[str], env: dict[str, str] | None = None) -> Tracked:
    logs = state_dir / "logs"
    logs.mkdir(parents=True, exist_ok=True)
    run_dir(state_dir).mkdir(parents=True, exist_ok=True)
    with open(logs / f"{name}.log", "ab") as log:
        proc = subprocess.Popen(
            argv,
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,  # its own process group: `down` ends it and anything it spawned
            env=env,
            cwd=state_dir,
        )
    started = _start_time(proc.pid) or ""
    pidfile = run_dir(state_dir) / f"{name}.pid"
    pidfile.write_text(json.dumps({"pid": proc.pid, "start_time": started, "argv": argv}))
    return Tracked(name, proc.pid, started, pidfile)


def tracked(state_dir: Path) -> list[Tracked]:
    out = []
    for pidfile in sorted(run_dir(state_dir).glob("*.pid")):
        try:
            data = json.loads(pidfile.read_text())
        except (OSError, ValueError):
            pidfile.unlink(missing_ok=True)
            continue
        out.append(Tracked(pidfile.stem, int(data["pid"]), str(data["start_time"]), pidfile))
    return out


def stop(process: Tracked, grace: float = 10.0, kill: bool = False) -> None:
    """SIGTERM the process group (SIGKILL at once with `kill`, or after `grace` seconds), then forget it."""
    if kill and process.alive():
        _signal_group(process.pid, signal.SIGKILL)
    if process.alive():
        _signal_group(process.pid, signal.SIGTERM)
        deadline = time.monotonic() + grace
        while process.alive() and time.monotonic() < deadline:
            _reap(process.pid)
            time.sleep(0.05)
        if process.alive():
            _signal_group(process.pid, signal.SIGKILL)
            while process.alive():
                _reap(process.pid)
                time.sleep(0.05)
    _reap(process.pid)
    process.pidfile.unlink(missing_ok=True)


def _signal_group(pid: int, sig: signal.Signals) -> None:
    try:
        os.killpg(pid, sig)
    except (ProcessLookupError, PermissionError):
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, sig)


def _reap(pid: int) -> None:
    with contextlib.suppress(ChildProcessError):
        os.waitpid(pid, os.WNOHANG)


def log_tail(state_dir: Path, name: str, lines: int = 15) -> str:
    path = state_dir / "logs" / f"{name}.log"
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    except OSError:
        return "(no log)"
