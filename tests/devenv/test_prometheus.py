"""Fetching prometheus and promtool from Debian's package (devenv/prometheus.py) with a stand-in apt-get
on PATH: the system's lists are used when they can serve the package; when they are stale (the pool file
is gone), a private copy of the lists in the cache is refreshed and the download retried with it. The
system's lists are never updated. (By hand, with the real apt-get: a download with an empty private copy
of the lists failed with "Unable to locate package"; after the private update it succeeded.)"""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

from stormtopo.devenv import prometheus

# Fails a download from the system's lists when STALE is set (as a 404 from the pool does); a download
# or update with Dir::State::Lists=... (the private copy) works. Every call is logged.
FAKE_APT_GET = """#!/bin/sh
echo "$*" >> "$APT_LOG"
case "$*" in
  *Dir::State::Lists=*) ;;
  *update*) echo "E: the system's lists must not be updated" >&2; exit 100 ;;
  *) if [ -n "$STALE" ]; then echo "E: Failed to fetch .../prometheus_2.42.0+ds-5+deb12u1_amd64.deb  404  Not Found" >&2; exit 100; fi ;;
esac
case "$*" in *download*) cp "$FAKE_DEB" . ;; esac
"""


@pytest.fixture
def fake_apt(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    root = tmp_path / "pkg"
    for name in ("prometheus", "promtool"):
        tool = root / "usr" / "bin" / name
        tool.parent.mkdir(parents=True, exist_ok=True)
        tool.write_text(f"#!/bin/sh\necho {name} {prometheus.PROMETHEUS_VERSION}\n")
        tool.chmod(0o755)
    (root / "DEBIAN").mkdir()
    (root / "DEBIAN" / "control").write_text(
        f"Package: prometheus\nVersion: {prometheus.PROMETHEUS_VERSION}+ds-5+deb12u9\nArchitecture: amd64\n"
        "Maintainer: test <test@example.com>\nDescription: stand-in\n"
    )
    deb = tmp_path / f"prometheus_{prometheus.PROMETHEUS_VERSION}+ds-5+deb12u9_amd64.deb"
    subprocess.run(["dpkg-deb", "--build", "--root-owner-group", str(root), str(deb)], check=True, capture_output=True)
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "apt-get").write_text(FAKE_APT_GET)
    (bin_dir / "apt-get").chmod(0o755)
    monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}{os.environ['PATH']}")
    monkeypatch.setenv("FAKE_DEB", str(deb))
    monkeypatch.setenv("APT_LOG", str(tmp_path / "apt.log"))
    monkeypatch.setenv("STORMTOPO_CACHE_DIR", str(tmp_path / "cache"))
    return tmp_path / "apt.log"


def unpacked_and_runs() -> str:
    promtool = prometheus.binary("promtool")
    assert promtool.parent == prometheus.install_dir() and (promtool.parent / "prometheus").is_file()
    return subprocess.run([str(promtool)], capture_output=True, text=True, check=True).stdout


def test_fresh_system_lists_are_used_as_they_are_and_the_result_is_cached(fake_apt: Path) -> None:
    assert unpacked_and_runs() == f"promtool {prometheus.PROMETHEUS_VERSION}\n"
    assert fake_apt.read_text().splitlines() == ["-q download prometheus"]
    unpacked_and_runs()  # cached: apt-get is not asked again
    assert len(fake_apt.read_text().splitlines()) == 1


def test_stale_system_lists_refresh_a_private_copy_not_the_systems(fake_apt: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("STALE", "1")
    assert unpacked_and_runs() == f"promtool {prometheus.PROMETHEUS_VERSION}\n"
    first, update, retry = fake_apt.read_text().splitlines()
    private = prometheus.cache_root() / "apt" / "lists"
    assert first == "-q download prometheus"
    assert update.endswith(" update") and f"Dir::State::Lists={private}" in update
    assert retry.endswith(" download prometheus") and f"Dir::State::Lists={private}" in retry
