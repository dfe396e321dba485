"""The image's locks agree with pyproject.toml (issue 22): every dependency is pinned at a version its specifier
allows, nothing is pinned that no dependency needs, every pin has hashes, they resolve for the image's Python,
and the Dockerfile installs them with --require-hashes. These checks read files only; the last test resolves
again with the pinned uv against PyPI, keeping the locked versions, and must give the same locks."""

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

LOCKS = [pytest.param(lock.OPERATOR, id="operator"), pytest.param(lock.BUILD, id="build")]
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


def _direct(path: Path) -> set[str]:
    return {canonicalize_name(r.name) for r in lock.locked(path) if not r.marker or r.marker.evaluate(IMAGE_MARKERS)}


@pytest.mark.parametrize("path", LOCKS)
def test_every_pin_is_exact_and_hashed(path: Path) -> None:
    pins = lock.read(path.read_text())
    assert pins
    for pin in pins.values():
        assert pin.hashes and all(len(h) == 64 for h in pin.hashes), pin.name
    with pytest.raises(ValueError, match="not a pinned"):  # an unpinned or unhashed line is never taken for one
        lock.read("kopf>=1.37\n")


@pytest.mark.parametrize("path", LOCKS)
def test_every_dependency_is_locked_at_a_version_it_allows(path: Path) -> None:
    pins = lock.read(path.read_text())
    for requirement in lock.locked(path):
        name = canonicalize_name(requirement.name)
        if name not in _direct(path):
            continue  # a marker that excludes the image
        assert name in pins, f"{requirement} is not in {path.name}: run `make lock`"
        assert requirement.specifier.contains(pins[name].version, prereleases=True), (
            f"{path.name} pins {name}=={pins[name].version}, outside {requirement}: run `make lock`"
        )


@pytest.mark.parametrize("path", LOCKS)
def test_nothing_in_the_lock_is_orphaned(path: Path) -> None:
    """Every pin is a direct dependency or required, through pins, by one; by the lock's own `# via` lines."""
    text = path.read_text()
    pins, direct, from_stdin = lock.read(text), _direct(path), "-" in lock.command(text)
    for pin in pins.values():
        assert pin.via <= set(pins) | {lock.PYPROJECT}, f"{pin.name} is needed by {pin.via - set(pins)}, which is not in the lock"
        marked_direct = lock.PYPROJECT in pin.via or (from_stdin and not pin.via)
        assert marked_direct == (pin.name in direct), f"{pin.name}: pyproject.toml and {path.name} disagree whether it is direct"
    reached, todo = set(direct), list(direct)
    while todo:
        parent = todo.pop()
        for child in (p.name for p in pins.values() if parent in p.via and p.name not in reached):
            reached.add(child)
            todo.append(child)
    assert set(pins) - reached == set(), f"pinned in {path.name} but needed by nothing pyproject.toml asks for: run `make lock`"


def _installs(stage: dockerfile.Stage) -> list[list[str]]:
    return [cmd.split() for instruction, args in stage.steps if instruction == "RUN" for cmd in args.split("&&") if " install " in cmd]


def test_the_locks_resolve_for_the_images_python_and_the_dockerfile_installs_them_by_hash() -> None:
    build, final = dockerfile.stages()
    for path in (lock.OPERATOR, lock.BUILD):
        recorded = lock.command(path.read_text())
        assert recorded[recorded.index("--python-version") + 1] == IMAGE_PYTHON, "the Dockerfile's Python changed: run `make lock`"
        assert "--generate-hashes" in recorded
    assert dockerfile.python_version(build.base) == IMAGE_PYTHON
    hashed = {"--require-hashes", "--no-deps", "--only-binary=:all:"}
    [backend] = _installs(build)
    assert hashed <= set(backend) and backend[-2:] == ["-r", "requirements/build.lock"]
    [wheel_build] = [args.split() for instruction, args in build.steps if instruction == "RUN" and "pip wheel" in args]
    assert {"--no-build-isolation", "--no-deps"} <= set(wheel_build)  # built by the locked setuptools, nothing fetched
    copies = [args.split() for instruction, args in final.steps if instruction == "COPY"]
    assert ["requirements/operator.lock", "/tmp/operator.lock"] in copies
    from_lock, wheel = _installs(final)
    assert hashed <= set(from_lock) and from_lock[-2:] == ["-r", "/tmp/operator.lock"]
    assert "--no-deps" in wheel and wheel[-1].endswith(".whl")  # stormtopo itself brings nothing beyond the lock


@pytest.mark.parametrize("path", LOCKS)
def test_resolving_again_with_the_pinned_uv_gives_the_lock(path: Path, tmp_path: Path) -> None:
    """The lock's recorded command, run again with the lock as the starting point (uv keeps versions that
    still satisfy pyproject.toml), changes no pin and knows every hash: what `make lock` would do."""
    uv = shutil.which("uv", path=str(Path(sys.executable).parent))
    assert uv, "uv is in the dev extra"
    text = path.read_text()
    out = tmp_path / path.name
    shutil.copy(path, out)
    argv = lock.command(text)
    argv[argv.index("-o") + 1] = str(out)
    stdin = "\n".join(str(r) for r in lock.locked(path)) if "-" in argv else None
    done = subprocess.run([uv, *argv[1:], "--quiet"], input=stdin, cwd=REPO, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    pins, again = lock.read(text), lock.read(out.read_text())
    assert {p.name: p.version for p in again.values()} == {p.name: p.version for p in pins.values()}, "run `make lock`"
    assert {p.name: p.via for p in again.values()} == {p.name: p.via for p in pins.values()}
    for pin in pins.values():  # PyPI may add a file to a release later; a hash it does not know is wrong
        assert pin.hashes <= again[pin.name].hashes, f"{pin.name}: hashes PyPI does not have"
