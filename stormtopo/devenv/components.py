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

KUBERNETES_VERSION = "v1.35.3"
VOLCANO_VERSION = "v1.15.1"
VOLCANO_APIS_BASE = "v1.14.0"  # the newest volcano.sh/apis the module proxy serves; see tools/k8s135
ETCD_VERSION = "v3.6.16"
KWOK_VERSION = "v0.8.0"
HELM_VERSION = "v3.19.0"
# The newest AIBrix the module proxy serves is v0.7.0; add a tools/aibrix/<version> wrapper for others.
AIBRIX_VERSION = os.environ.get("STORMTOPO_AIBRIX_VERSION", "v0.7.0")


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


_K8S = _k8s_version_ldflags(KUBERNETES_VERSION)
_VOLCANO_LDFLAGS = (f"-X volcano.sh/volcano/pkg/version.Version={VOLCANO_VERSION}",)
_VOLCANO_INPUTS = ("apis-compat/scheduling_v1beta1.go",)

COMPONENTS: dict[str, Component] = {
    c.name: c
    for c in (
        Component("etcd", ETCD_VERSION, "etcd", "go.etcd.io/etcd/server/v3"),
        Component(
            "kube-apiserver", KUBERNETES_VERSION, "k8s135", "k8s.io/kubernetes/cmd/kube-apiserver", _K8S, extra_inputs=_VOLCANO_INPUTS
        ),
        Component(
            "kube-controller-manager",
            KUBERNETES_VERSION,
            "k8s135",
            "k8s.io/kubernetes/cmd/kube-controller-manager",
            _K8S,
            extra_inputs=_VOLCANO_INPUTS,
        ),
        Component(
            "kube-scheduler", KUBERNETES_VERSION, "k8s135", "k8s.io/kubernetes/cmd/kube-scheduler", _K8S, extra_inputs=_VOLCANO_INPUTS
        ),
        Component("kubectl", KUBERNETES_VERSION, "k8s135", "k8s.io/kubernetes/cmd/kubectl", _K8S, extra_inputs=_VOLCANO_INPUTS),
        Component(
            "vc-scheduler", VOLCANO_VERSION, "k8s135", "volcano.sh/volcano/cmd/scheduler", _VOLCANO_LDFLAGS, extra_inputs=_VOLCANO_INPUTS
        ),
        Component(
            "vc-controller-manager",
            VOLCANO_VERSION,
            "k8s135",
            "volcano.sh/volcano/cmd/controller-manager",
            _VOLCANO_LDFLAGS,
            extra_inputs=_VOLCANO_INPUTS,
        ),
        Component(
            "aibrix-controller-manager",
            AIBRIX_VERSION,
            f"aibrix/{AIBRIX_VERSION}",
            "github.com/vllm-project/aibrix/cmd/controllers",
            tags=("nozmq",),
        ),
        Component("kwok", KWOK_VERSION, "kwok", "sigs.k8s.io/kwok/cmd/kwok"),
        Component(
            "helm", HELM_VERSION, "helm", "helm.sh/helm/v3/cmd/helm", (f"-X helm.sh/helm/v3/internal/version.version={HELM_VERSION}",)
        ),
    )
}

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
    """Lay out tools/k8s135/_apis: volcano.sh/apis v1.14.0 plus the v1.15 compatibility shim."""
    if component.module != "k8s135":
        return
    target = component.module_dir / "_apis"
    shim = component.module_dir / "apis-compat" / "scheduling_v1beta1.go"
    dest = target / "pkg/apis/scheduling/v1beta1/zz_stormtopo_compat.go"
    if dest.exists() and dest.read_bytes() == shim.read_bytes():
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
    for p in tmp.rglob("*"):
        p.chmod(0o755 if p.is_dir() else 0o644)
    shutil.copyfile(shim, tmp / "pkg/apis/scheduling/v1beta1/zz_stormtopo_compat.go")
    shutil.rmtree(target, ignore_errors=True)
    tmp.rename(target)


def binary_path(component: Component) -> Path:
    return cache_root() / "bin" / component.cache_key() / component.name


def ensure_binary(name: str, log: bool = True) -> Path:
    """Path of the cached binary for component `name`, building it first if it is missing."""
    component = COMPONENTS[name]
    path = binary_path(component)
    if path.exists():
        return path
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
