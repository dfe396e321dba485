"""The operator's Dockerfile, read and replayed without a container engine (the machine has none).

Each stage gets a directory that stands for its filesystem and a clean virtualenv of the machine's Python that
stands for the base image's: COPY copies into that directory, WORKDIR moves within it, and the `pip` commands of
RUN run with that virtualenv's pip, absolute paths mapped into the stage's directory. So a test installs exactly
what `docker build` would, by the same commands. Anything else in a RUN must be named in NOT_REPLAYED, so that
a new step in the Dockerfile fails here until someone decides how to replay it.
"""

from __future__ import annotations

import glob
import json
import os
import re
import shlex
import shutil
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path

from tests.conftest import REPO

DOCKERFILE = REPO / "Dockerfile"
# Commands of RUN with nothing to replay outside a container: the image's user, and removing what is done with.
NOT_REPLAYED = {"useradd", "rm"}


@dataclass
class Stage:
    name: str
    base: str  # the FROM image, e.g. python:3.11.11-slim-bookworm
    steps: list[tuple[str, str]] = field(default_factory=list)  # (INSTRUCTION, its arguments) in order


@dataclass(frozen=True)
class Image:
    """What a replay leaves: the final stage's virtualenv, its ENV and its ENTRYPOINT."""

    venv: Path
    env: dict[str, str]
    entrypoint: list[str]

    @property
    def python(self) -> Path:
        return self.venv / "bin" / "python"


def stages(text: str | None = None) -> list[Stage]:
    text = DOCKERFILE.read_text() if text is None else text
    joined = re.sub(r"\\\n", " ", "\n".join(line for line in text.splitlines() if not line.lstrip().startswith("#")))
    out: list[Stage] = []
    for line in joined.splitlines():
        if not line.strip():
            continue
        instruction, _, rest = line.strip().partition(" ")
        instruction, rest = instruction.upper(), rest.strip()
        if instruction == "FROM":
            base, _, name = rest.partition(" AS ")
            out.append(Stage(name.strip() or str(len(out)), base.strip()))
        else:
            out[-1].steps.append((instruction, rest))
    return out


def python_version(base: str) -> str:
    """python:3.11.11-slim-bookworm -> 3.11.11"""
    match = re.fullmatch(r"python:(\d+\.\d+\.\d+)-.*", base)
    assert match, f"not an official python image with a full version: {base}"
    return match.group(1)


def replay(work: Path, pip_cache: Path, context: Path = REPO) -> Image:
    """Replay every stage in `work`, downloads cached in `pip_cache`; returns the final stage."""
    roots: dict[str, Path] = {}
    image: Image | None = None
    for i, stage in enumerate(stages()):
        image_minor = tuple(int(p) for p in python_version(stage.base).split(".")[:2])
        assert sys.version_info[:2] == image_minor, "the machine's Python is not the image's"
        root, venv = work / f"stage-{i}", work / f"venv-{i}"
        root.mkdir(parents=True)
        subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True, cwd=work)
        cwd, env, entrypoint = root, {}, []
        for instruction, args in stage.steps:
            if instruction == "WORKDIR":
                cwd = root / args.lstrip("/")
                cwd.mkdir(parents=True, exist_ok=True)
            elif instruction == "COPY":
                _copy(shlex.split(args), context, roots, root, cwd)
            elif instruction == "RUN":
                for command in args.split("&&"):
                    _run(shlex.split(command), venv, root, cwd, pip_cache)
            elif instruction == "ENV":
                env.update(dict(pair.split("=", 1) for pair in shlex.split(args)))
            elif instruction == "ENTRYPOINT":
                entrypoint = json.loads(args)
            else:
                assert instruction in {"USER", "EXPOSE"}, f"no replay for {instruction} {args}"
        roots[stage.name] = root
        image = Image(venv, env, entrypoint)
    assert image is not None
    return image


def clean_env(**extra: str) -> dict[str, str]:
    """The machine's environment without what would point Python or pip at the repository or another venv."""
    return {**{k: v for k, v in os.environ.items() if not k.startswith(("PYTHON", "PIP_", "VIRTUAL_ENV"))}, **extra}


def _inside(root: Path, cwd: Path, path: str) -> Path:
    return root / path.lstrip("/") if path.startswith("/") else cwd / path


def _copy(args: list[str], context: Path, roots: dict[str, Path], root: Path, cwd: Path) -> None:
    source_root = context
    if args[0].startswith("--from="):
        source_root = roots[args.pop(0).removeprefix("--from=")]
    *sources, dest = args
    target = _inside(root, cwd, dest)
    for source in sources:
        src = source_root / source.lstrip("/")
        # Docker's rules: a directory's contents go into the destination; files go into it when it ends in "/".
        if src.is_dir():
            shutil.copytree(src, target, dirs_exist_ok=True)
        else:
            into = target / src.name if dest.endswith("/") else target
            into.parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(src, into)


def _run(argv: list[str], venv: Path, root: Path, cwd: Path, pip_cache: Path) -> None:
    if argv[0] in NOT_REPLAYED:
        return
    assert argv[0] == "pip", f"no replay for RUN {shlex.join(argv)}"
    command = [str(venv / "bin" / "pip"), "--disable-pip-version-check"]
    for arg in argv[1:]:
        if arg == "--no-cache-dir":  # the image keeps no cache; a test run reuses its downloads
            command.append(f"--cache-dir={pip_cache}")
        elif arg.startswith("/"):
            command += sorted(glob.glob(str(_inside(root, cwd, arg)))) or [str(_inside(root, cwd, arg))]
        else:
            command.append(arg)
    done = subprocess.run(command, cwd=cwd, env=clean_env(), capture_output=True, text=True)
    assert done.returncode == 0, f"{shlex.join(argv)} failed:\n{done.stdout}\n{done.stderr}"
