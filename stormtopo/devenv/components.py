"""The pinned upstream components of the local control plane, and how each binary is built.

Every binary is built with `go build` from a small wrapper module under tools/ (one go.mod per
Kubernetes version family, so versions never mix) and cached outside the checkout, keyed by
component, version and a digest of the wrapper, so a fresh clone reuses what an earlier one built.
"""

from __future__ import annotations

import fcntl
import hashlib
import json
import os
import shutil
import subprocess
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[2]
TOOLS_DIR = REPO_ROOT / "tools"

VOLCANO_APIS_BASE = "v1.14.0"  # the newest volcano.sh/apis the module proxy serves; see tools/k8s135
ETCD_VERSION = "v3.6.16"
KWOK_VERSION = "v0.8.0"
HELM_VERSION = "v3.19.0"

# The releases the Go module proxy served on 2026-11-30, oldest first (COMPATIBILITY.md), each with its
# wrapper under tools/. Volcano v1.15.1 shares the Kubernetes 1.35 family's module; older releases pin
# their own k8s.io modules. `make compat` runs every pair; `dev up` runs the newest unless told otherwise.
AIBRIX_WRAPPERS = {"v0.6.0": "aibrix/v0.6.0", "v0.7.0": "aibrix/v0.7.0"}
VOLCANO_WRAPPERS = {"v1.14.1": "volcano/v1.14.1", "v1.15.0": "volcano/v1.15.0", "v1.15.1": "k8s135"}
# The Kubernetes axis: kube-apiserver, kube-controller-manager and kube-scheduler of each release, oldest
# first. kubectl stays v1.35.3 (tools/k8s135) whatever runs: `dev up` only applies manifests and waits with it.
KUBERNETES_WRAPPERS = {
    "v1.30.14": "kubernetes/v1.30.14",
    "v1.33.13": "kubernetes/v1.33.13",
    "v1.35.3": "k8s135",
    "v1.37.2": "kubernetes/v1.37.2",
}
DEFAULT_KUBERNETES = "v1.35.3"
SERVED_AIBRIX = tuple(AIBRIX_WRAPPERS)
SERVED_VOLCANO = tuple(VOLCANO_WRAPPERS)
SERVED_KUBERNETES = tuple(KUBERNETES_WRAPPERS)
AIBRIX_VERSION = os.environ.get("STORMTOPO_AIBRIX_VERSION", SERVED_AIBRIX[-1])
VOLCANO_VERSION = os.environ.get("STORMTOPO_VOLCANO_VERSION", SERVED_VOLCANO[-1])
KUBERNETES_VERSION = os.environ.get("STORMTOPO_KUBERNETES_VERSION", DEFAULT_KUBERNETES)


class BuildError(RuntimeError):
    """A component could not be built; the message names it and quotes the compiler."""


def _k8s_version_ldflags(version: str) -> tuple[str, ...]:
    major, minor = version.lstrip("v").split(".")[:2]
    flags = []
    for pkg in ("k8s.io/component-base/version", "k8s.io/client-go/pkg/version"):
        flags += [
            f"-X {pkg}.gitVersion={version}",
            f"-X {pkg}.gitMajor={major}",
            f"-X {pkg}.gitMinor={minor}",
            f"-X {pkg}.gitTreeState=clean",
        ]
    return tuple(flags)


@dataclass(frozen=True)
class Component:
    name: str
    version: str
    module: str  # wrapper module directory, relative to tools/
    package: str
    ldflags: tuple[str, ...] = ()
    tags: tuple[str, ...] = ()
    # Files besides go.mod/go.sum whose content changes the binary (part of the cache key).
    extra_inputs: tuple[str, ...] = field(default=())

    @property
    def module_dir(self) -> Path:
        return TOOLS_DIR / self.module

    def cache_key(self) -> str:
        digest = hashlib.sha256()
        for rel in ("go.mod", "go.sum", *self.extra_inputs):
            path = self.module_dir / rel
            if path.exists():
                digest.update(rel.encode() + b"\0" + path.read_bytes())
        digest.update(repr((self.package, self.ldflags, self.tags)).encode())
        return f"{self.name}-{self.version}-{digest.hexdigest()[:12]}"


_K8S135_INPUTS = ("apis-compat/scheduling_v1beta1.go",)  # kube-* share the module with Volcano v1.15.1


def _kubernetes(name: str, version: str) -> Component:
    """A Kubernetes binary of `version`, built from that release's wrapper (tools/k8s135 for v1.35.3)."""
    module = KUBERNETES_WRAPPERS.get(version, f"kubernetes/{version}")
    return Component(
        name,
        version,
        module,
        f"k8s.io/kubernetes/cmd/{name}",
        _k8s_version_ldflags(version),
        extra_inputs=_K8S135_INPUTS if module == "k8s135" else (),
    )


def _volcano_inputs(module: str) -> tuple[str, ...]:
    """The wrapper's volcano.sh/apis shims (tools/<module>/apis-compat), part of the cache key."""
    shims = (TOOLS_DIR / module / "apis-compat").glob("*.go")
    return tuple(sorted(f"apis-compat/{shim.name}" for shim in shims))


def _components(aibrix: str, volcano: str, kubernetes: str) -> dict[str, Component]:
    volcano_module = VOLCANO_WRAPPERS.get(volcano, f"volcano/{volcano}")
    volcano_ldflags = (f"-X volcano.sh/volcano/pkg/version.Version={volcano}",)
    volcano_inputs = _volcano_inputs(volcano_module)
    return {
        c.name: c
        for c in (
            Component("etcd", ETCD_VERSION, "etcd", "go.etcd.io/etcd/server/v3"),
            _kubernetes("kube-apiserver", kubernetes),
            _kubernetes("kube-controller-manager", kubernetes),
            _kubernetes("kube-scheduler", kubernetes),
            _kubernetes("kubectl", DEFAULT_KUBERNETES),
            Component(
                "vc-scheduler", volcano, volcano_module, "volcano.sh/volcano/cmd/scheduler", volcano_ldflags, extra_inputs=volcano_inputs
            ),
            Component(
                "vc-controller-manager",
                volcano,
                volcano_module,
                "volcano.sh/volcano/cmd/controller-manager",
                volcano_ldflags,
                extra_inputs=volcano_inputs,
            ),
            Component(
                "aibrix-controller-manager",
                aibrix,
                AIBRIX_WRAPPERS.get(aibrix, f"aibrix/{aibrix}"),
                "github.com/vllm-project/aibrix/cmd/controllers",
                tags=("nozmq",),
            ),
            Component("kwok", KWOK_VERSION, "kwok", "sigs.k8s.io/kwok/cmd/kwok"),
            Component(
                "helm", HELM_VERSION, "helm", "helm.sh/helm/v3/cmd/helm", (f"-X helm.sh/helm/v3/internal/version.version={HELM_VERSION}",)
            ),
        )
    }


COMPONENTS: dict[str, Component] = _components(AIBRIX_VERSION, VOLCANO_VERSION, KUBERNETES_VERSION)


def select_versions(aibrix: str | None = None, volcano: str | None = None, kubernetes: str | None = None) -> None:
    """Build and run these AIBrix, Volcano and Kubernetes releases in this process and the processes it starts.

    `None` keeps the current choice (STORMTOPO_AIBRIX_VERSION, STORMTOPO_VOLCANO_VERSION and
    STORMTOPO_KUBERNETES_VERSION; else the newest AIBrix and Volcano, and Kubernetes v1.35.3).
    """
    global AIBRIX_VERSION, VOLCANO_VERSION, KUBERNETES_VERSION
    aibrix, volcano, kubernetes = aibrix or AIBRIX_VERSION, volcano or VOLCANO_VERSION, kubernetes or KUBERNETES_VERSION
    chosen = (("AIBrix", aibrix, SERVED_AIBRIX), ("Volcano", volcano, SERVED_VOLCANO), ("Kubernetes", kubernetes, SERVED_KUBERNETES))
    for what, version, served in chosen:
        if version not in served:
            raise BuildError(f"no wrapper for {what} {version}: tools/ builds {', '.join(served)}")
    AIBRIX_VERSION, VOLCANO_VERSION, KUBERNETES_VERSION = aibrix, volcano, kubernetes
    os.environ.update(
        STORMTOPO_AIBRIX_VERSION=AIBRIX_VERSION, STORMTOPO_VOLCANO_VERSION=VOLCANO_VERSION, STORMTOPO_KUBERNETES_VERSION=KUBERNETES_VERSION
    )
    COMPONENTS.clear()  # in place: callers hold the dict
    COMPONENTS.update(_components(AIBRIX_VERSION, VOLCANO_VERSION, KUBERNETES_VERSION))


# What `dev up` runs; helm is only built for the chart tests.
CONTROL_PLANE = (
    "etcd",
    "kube-apiserver",
    "kube-controller-manager",
    "kube-scheduler",
    "kubectl",
    "vc-scheduler",
    "vc-controller-manager",
    "aibrix-controller-manager",
    "kwok",
)


def cache_root() -> Path:
    return Path(os.environ.get("STORMTOPO_CACHE_DIR", Path.home() / ".cache" / "stormtopo"))


def go_env() -> dict[str, str]:
    env = dict(os.environ)
    # Wrappers pin every module in go.mod; -mod=mod lets go.sum be completed on a cold module cache.
    env.update(GOFLAGS="-mod=mod", CGO_ENABLED="0", GOTOOLCHAIN=env.get("GOTOOLCHAIN", "local"))
    return env


def module_dir_of(module: str, path: str, version: str) -> Path:
    """Directory of an upstream module in the Go module cache (downloaded if missing)."""
    out = _go(["mod", "download", "-json", f"{path}@{version}"], cwd=TOOLS_DIR / module, what=path)
    return Path(json.loads(out)["Dir"])


def _go(args: list[str], cwd: Path, what: str) -> str:
    proc = subprocess.run(["go", *args], cwd=cwd, env=go_env(), capture_output=True, text=True)
    if proc.returncode != 0:
        tail = "\n".join((proc.stderr or proc.stdout).strip().splitlines()[-25:])
        raise BuildError(f"building {what}: `go {' '.join(args)}` failed in {cwd}:\n{tail}")
    return proc.stdout


def _prepare_volcano_apis(component: Component) -> None:
    """Lay out tools/<module>/_apis: volcano.sh/apis v1.14.0 plus the wrapper's shims (apis-compat).

    Volcano pins volcano.sh/apis to its own staging directory, which its module zip leaves out; every
    Volcano wrapper replaces it with ./_apis. A shim apis-compat/<group>_<version>.go is copied into
    pkg/apis/<group>/<version>/.
    """
    go_mod = component.module_dir / "go.mod"
    if "=> ./_apis" not in go_mod.read_text():
        return
    target = component.module_dir / "_apis"
    shims = {
        Path("pkg/apis", *shim.stem.split("_", 1), "zz_stormtopo_compat.go"): shim.read_bytes()
        for shim in (component.module_dir / "apis-compat").glob("*.go")
    }
    if (target / "go.mod").exists() and all((target / rel).exists() and (target / rel).read_bytes() == b for rel, b in shims.items()):
        return
    proc = subprocess.run(
        ["go", "mod", "download", "-json", f"volcano.sh/apis@{VOLCANO_APIS_BASE}"],
        cwd=tempfile.gettempdir(),
        env=go_env(),
        capture_output=True,
        text=True,
    )
    if proc.returncode != 0:
        raise BuildError(f"building {component.name}: cannot download volcano.sh/apis {VOLCANO_APIS_BASE}: {proc.stdout}{proc.stderr}")
    source = Path(json.loads(proc.stdout)["Dir"])
    tmp = target.with_name("_apis.tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    shutil.copytree(source, tmp)
    for p in [tmp, *tmp.rglob("*")]:
        p.chmod(0o755 if p.is_dir() else 0o644)
    for rel, content in shims.items():
        (tmp / rel).write_bytes(content)
    shutil.rmtree(target, ignore_errors=True)
    tmp.rename(target)


def prepare_volcano_module(volcano: str) -> Path:
    """The wrapper module of Volcano `volcano`, with its volcano.sh/apis (_apis) laid out for `go` to use.

    For Go code other than the binaries that builds against the same Volcano (the scale simulator,
    tools/volcano-sim, replaces volcano.sh/apis with tools/k8s135/_apis).
    """
    component = _components(AIBRIX_VERSION, volcano, KUBERNETES_VERSION)["vc-scheduler"]
    _prepare_volcano_apis(component)
    return component.module_dir


def binary_path(component: Component) -> Path:
    return cache_root() / "bin" / component.cache_key() / component.name


def ensure_binary(name: str, log: bool = True) -> Path:
    """Path of the cached binary for component `name`, building it first if it is missing."""
    component = COMPONENTS[name]
    path = binary_path(component)
    if path.exists():
        return path
    if not component.module_dir.is_dir():
        raise BuildError(f"no wrapper for {component.name} {component.version}: tools/{component.module} is missing")
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path.parent / ".lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # two clusters starting at once build each binary once
        if path.exists():
            return path
        if log:
            print(f"stormtopo: building {component.name} {component.version} (cached in {path.parent})", flush=True)
        _prepare_volcano_apis(component)
        args = ["build", "-trimpath", "-o", str(path) + ".tmp"]
        if component.tags:
            args += ["-tags", ",".join(component.tags)]
        if component.ldflags:
            args += ["-ldflags", " ".join(component.ldflags)]
        _go([*args, component.package], cwd=component.module_dir, what=f"{component.name} {component.version}")
        os.replace(str(path) + ".tmp", path)
    return path


def ensure_binaries(names: tuple[str, ...] = CONTROL_PLANE) -> dict[str, Path]:
    return {name: ensure_binary(name) for name in names}
