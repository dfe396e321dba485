"""Prometheus and promtool for the chart's monitoring tests, from Debian's `prometheus` package.

Unpacked (`dpkg-deb -x`, no root, nothing installed on the system) into ~/.cache/stormtopo/
prometheus-VERSION and reused from there, as the Go binaries are. `apt-get download` reads the
system's package lists; when they are stale (the pool file is gone) or lack the package, a private
copy of the lists is refreshed in the cache and the download retried with it, so the system's apt
state is never changed. `make test` runs `python -m stormtopo.devenv.prometheus` before the tests.
"""

from __future__ import annotations

import fcntl
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

from stormtopo.devenv.components import BuildError, cache_root

PROMETHEUS_VERSION = "2.42.0"  # Debian 12's; any Debian revision of it (+ds-5+deb12u1, ...) will do
PACKAGE = "prometheus"


def install_dir() -> Path:
    return cache_root() / f"prometheus-{PROMETHEUS_VERSION}"


def binary(name: str) -> Path:
    """The cached `prometheus` or `promtool`, unpacked first if missing."""
    return ensure() / name


def ensure(log: bool = True) -> Path:
    """The directory holding `prometheus` and `promtool`, downloading and unpacking them once."""
    target = install_dir()
    if _complete(target):
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    with open(target.parent / ".prometheus.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # two test runs at once unpack it once
        if _complete(target):
            return target
        if log:
            print(f"stormtopo: fetching Debian's {PACKAGE} {PROMETHEUS_VERSION} (cached in {target})", flush=True)
        with tempfile.TemporaryDirectory(prefix="stormtopo-prometheus-") as tmp:
            deb = _download(Path(tmp))
            unpacked = Path(tmp) / "root"
            _run(["dpkg-deb", "-x", str(deb), str(unpacked)], "unpacking " + deb.name)
            staged = target.with_name(target.name + ".tmp")
            shutil.rmtree(staged, ignore_errors=True)
            staged.mkdir()
            for name in ("prometheus", "promtool"):
                shutil.copy2(unpacked / "usr" / "bin" / name, staged / name)
            shutil.rmtree(target, ignore_errors=True)
            staged.rename(target)
    return target


def _complete(target: Path) -> bool:
    return (target / "prometheus").is_file() and (target / "promtool").is_file()


def _download(directory: Path) -> Path:
    """The .deb of PROMETHEUS_VERSION in `directory`: with the system's lists, else with fresh private ones."""
    first = _apt_download(directory, [])
    if first is not None:
        return first
    private = cache_root() / "apt"
    for sub in ("lists/partial", "cache/archives/partial"):
        (private / sub).mkdir(parents=True, exist_ok=True)
    options = ["-o", f"Dir::State::Lists={private / 'lists'}", "-o", f"Dir::Cache={private / 'cache'}", "-o", "Debug::NoLocking=1"]
    _run(["apt-get", "-q", *options, "update"], "refreshing a private copy of the apt lists")
    second = _apt_download(directory, options)
    if second is None:
        raise BuildError(f"apt-get download {PACKAGE} found no {PACKAGE} {PROMETHEUS_VERSION}, even with fresh lists")
    return second


def _apt_download(directory: Path, options: list[str]) -> Path | None:
    """`apt-get download` of the candidate; None if it failed (stale lists) or is another version."""
    for old in directory.glob("*.deb"):
        old.unlink()
    if shutil.which("apt-get") is None:
        raise BuildError(f"fetching {PACKAGE} {PROMETHEUS_VERSION} needs apt-get (Debian 12, as CI runs)")
    done = subprocess.run(["apt-get", "-q", *options, "download", PACKAGE], cwd=directory, capture_output=True, text=True)
    debs = sorted(directory.glob(f"{PACKAGE}_{PROMETHEUS_VERSION}+*.deb")) + sorted(directory.glob(f"{PACKAGE}_{PROMETHEUS_VERSION}-*.deb"))
    if done.returncode != 0 or not debs:
        print(f"stormtopo: apt-get download {PACKAGE}: {(done.stderr or done.stdout).strip()[-300:]}", flush=True)
        return None
    return debs[0]


def _run(args: list[str], what: str) -> None:
    done = subprocess.run(args, capture_output=True, text=True)
    if done.returncode != 0:
        raise BuildError(f"{what}: `{' '.join(args)}` failed:\n{(done.stderr or done.stdout)[-2000:]}")


if __name__ == "__main__":
    where = ensure()
    print(f"prometheus and promtool {PROMETHEUS_VERSION} in {where}")
    sys.exit(0)
