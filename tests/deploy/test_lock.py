"""The image's lock agrees with pyproject.toml (issue 22): every runtime dependency is pinned at a version its
specifier allows, nothing is pinned that no dependency needs, every pin has hashes, it resolves for the image's
Python, and the Dockerfile installs it with --require-hashes. The first checks read files only; the last
resolves again with the pinned uv against PyPI, keeping the lock's versions, and must give the same lock."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from packaging.markers import default_environment
from packaging.utils import canonicalize_name

from tests.conftest import REPO
from tests.deploy import dockerfile, lock

# The image's interpreter as markers see it: Linux, CPython at the base image's version.
IMAGE_PYTHON = dockerfile.python_version(dockerfile.stages()[-1].base)
IMAGE_MARKERS = {
    **default_environment(),
    "python_version": IMAGE_PYTHON.rsplit(".", 1)[0],
    "python_full_version": IMAGE_PYTHON,
    "sys_platform": "linux",
    "platform_system": "Linux",
    "platform_machine": "x86_64",
    "implementation_name": "cpython",
    "platform_python_implementation": "CPython",
}


@pytest.fixture(scope="module")
def pins() -> dict[str, lock.Pin]:
    return lock.read(lock.LOCK.read_text())


def test_every_pin_is_exact_and_hashed(pins: dict[str, lock.Pin]) -> None:
    assert pins
    for pin in pins.values():
        assert pin.hashes and all(len(h) == 64 for h in pin.hashes), pin.name
    with pytest.raises(ValueError, match="not a pinned"):  # an unpinned or unhashed line is never taken for one
        lock.read("kopf>=1.37\n")


def test_every_runtime_dependency_is_locked_at_a_version_it_allows(pins: dict[str, lock.Pin]) -> None:
    for requirement in lock.runtime_dependencies():
        if requirement.marker and not requirement.marker.evaluate(IMAGE_MARKERS):
            continue
        name = canonicalize_name(requirement.name)
        assert name in pins, f"{requirement} is not in {lock.LOCK.name}: run `make lock`"
        assert requirement.specifier.contains(pins[name].version, prereleases=True), (
            f"{lock.LOCK.name} pins {name}=={pins[name].version}, outside {requirement}: run `make lock`"
        )


def test_nothing_in_the_lock_is_orphaned(pins: dict[str, lock.Pin]) -> None:
    """Every pin is a runtime dependency or required, through pins, by one; by the lock's own `# via` lines."""
    direct = {canonicalize_name(r.name) for r in lock.runtime_dependencies()}
    for pin in pins.values():
        assert pin.via, f"{pin.name} says nothing needs it"
        assert pin.via <= set(pins) | {lock.PYPROJECT}, f"{pin.name} is needed by {pin.via - set(pins)}, which is not in the lock"
        assert (lock.PYPROJECT in pin.via) == (pin.name in direct), f"{pin.name}: pyproject.toml and the lock disagree whether it is direct"
    reached, todo = set(direct), list(direct)
    while todo:
        parent = todo.pop()
        for child in (p.name for p in pins.values() if parent in p.via and p.name not in reached):
            reached.add(child)
            todo.append(child)
    assert set(pins) - reached == set(), "pinned but needed by nothing pyproject.toml asks for: run `make lock`"


def test_the_lock_resolves_for_the_images_python_and_the_dockerfile_installs_it_by_hash() -> None:
    recorded = lock.command(lock.LOCK.read_text())
    assert recorded[recorded.index("--python-version") + 1] == IMAGE_PYTHON, "the Dockerfile's Python changed: run `make lock`"
    assert "--generate-hashes" in recorded and "pyproject.toml" in recorded
    final = dockerfile.stages()[-1]
    copied = [args.split() for instruction, args in final.steps if instruction == "COPY"]
    assert ["requirements/operator.lock", "/tmp/operator.lock"] in copied
    installs = [cmd.split() for instruction, args in final.steps if instruction == "RUN" for cmd in args.split("&&") if " install " in cmd]
    from_lock, wheel = installs
    assert {"--require-hashes", "--no-deps", "--only-binary=:all:"} <= set(from_lock) and from_lock[-2:] == ["-r", "/tmp/operator.lock"]
    assert "--no-deps" in wheel and wheel[-1].endswith(".whl")  # stormtopo itself brings nothing beyond the lock


def test_resolving_again_with_the_pinned_uv_gives_the_lock(tmp_path: Path, pins: dict[str, lock.Pin]) -> None:
    """The lock's recorded command, run again with the lock as the starting point (uv keeps versions that
    still satisfy pyproject.toml), changes no pin and knows every hash; this is what `make lock` would do."""
    uv = shutil.which("uv", path=str(Path(sys.executable).parent))
    assert uv, "uv is in the dev extra"
    out = tmp_path / "operator.lock"
    shutil.copy(lock.LOCK, out)
    argv = lock.command(lock.LOCK.read_text())
    argv[argv.index("-o") + 1] = str(out)
    done = subprocess.run([uv, *argv[1:], "--quiet"], cwd=REPO, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    again = lock.read(out.read_text())
    assert {p.name: p.version for p in again.values()} == {p.name: p.version for p in pins.values()}, "run `make lock`"
    assert {p.name: p.via for p in again.values()} == {p.name: p.via for p in pins.values()}
    for pin in pins.values():  # PyPI may add a file to a release later; a hash it does not know is wrong
        assert pin.hashes <= again[pin.name].hashes, f"{pin.name}: hashes PyPI does not have"
