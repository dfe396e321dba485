"""The compat runner's bookkeeping and the release switch, without a cluster (they run in `make test`)."""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path

import pytest

from stormtopo import cli
from stormtopo.devenv import cluster, compat, components

TABLE = """# Compatibility

## Release pairs on the real control plane

| AIBrix | Volcano | Kubernetes | what ran | result | date |
|---|---|---|---|---|---|
| v0.7.0 | v1.15.1 | v1.35.3 | `make test`: every integration test | passed | 2026-11-30 |
| v0.6.0 | v1.14.1 | v1.35.3 | `make compat`: old | failed: bad input | 2026-11-29 |

## PodGroup CRDs

| Volcano | networkTopology |
|---|---|
| v1.12.4 | yes |
"""


@pytest.fixture
def restored(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """The releases (and their environment variables) as they were: later tests start clusters from them."""
    before = (components.AIBRIX_VERSION, components.VOLCANO_VERSION, components.KUBERNETES_VERSION)
    for var in ("STORMTOPO_AIBRIX_VERSION", "STORMTOPO_VOLCANO_VERSION", "STORMTOPO_KUBERNETES_VERSION"):
        monkeypatch.setenv(var, "recorded")  # monkeypatch restores (or removes) the variable afterwards
    yield
    components.select_versions(*before)


def test_a_rerun_replaces_its_pairs_compat_row_and_keeps_every_other_row_and_section(tmp_path: Path) -> None:
    path = tmp_path / "COMPATIBILITY.md"
    path.write_text(TABLE)
    outcomes = [
        compat.Outcome(compat.Pair("v0.6.0", "v1.14.1"), "passed", up_s=20, scenario_s=100, tests=12),
        compat.Outcome(compat.Pair("v0.7.0", "v1.15.1"), "failed: dev up (vc-scheduler exited 1)"),
    ]
    compat.record(outcomes, "2026-11-30", path)
    text = path.read_text()
    rows = [line for line in text.splitlines() if line.startswith("| v")]
    assert "failed: bad input" not in text  # the old v0.6.0 x v1.14.1 row is gone
    assert rows[0].startswith("| v0.7.0 | v1.15.1 | v1.35.3 | `make test`")  # not a compat row: kept
    assert rows[1] == (f"| v0.6.0 | v1.14.1 | v1.35.3 | {compat.WHAT_RAN} | passed (12 tests in 100 s, cluster up in 20 s) | 2026-11-30 |")
    assert rows[2].endswith("| failed: dev up (vc-scheduler exited 1) | 2026-11-30 |")
    assert rows[3] == "| v1.12.4 | yes |"
    assert text.endswith("## PodGroup CRDs\n\n| Volcano | networkTopology |\n|---|---|\n| v1.12.4 | yes |\n")


def test_a_kubernetes_release_gets_its_own_row_beside_the_same_pair_on_v1_35_3(tmp_path: Path) -> None:
    path = tmp_path / "COMPATIBILITY.md"
    path.write_text(TABLE)
    newest = ("v0.7.0", "v1.15.1")
    compat.record([compat.Outcome(compat.Pair(*newest, "v1.30.14"), "failed: dev up (kube-apiserver exited 1)")], "2026-12-01", path)
    compat.record([compat.Outcome(compat.Pair(*newest, "v1.30.14"), "passed", up_s=12, scenario_s=15, tests=12)], "2026-12-02", path)
    rows = [line for line in path.read_text().splitlines() if line.startswith("| v0.7.0 | v1.15.1 |")]
    assert rows[0].startswith("| v0.7.0 | v1.15.1 | v1.35.3 | `make test`")  # the same pair on another release: kept
    assert rows[1:] == [f"| v0.7.0 | v1.15.1 | v1.30.14 | {compat.WHAT_RAN} | passed (12 tests in 15 s, cluster up in 12 s) | 2026-12-02 |"]


def test_every_served_pair_is_run_and_dev_up_defaults_to_the_newest() -> None:
    assert len(compat.served_pairs()) == len(components.SERVED_AIBRIX) * len(components.SERVED_VOLCANO) == 6
    assert (components.SERVED_AIBRIX[-1], components.SERVED_VOLCANO[-1]) == ("v0.7.0", "v1.15.1")
    assert {p.kubernetes for p in compat.served_pairs()} == {components.DEFAULT_KUBERNETES} == {"v1.35.3"}


def test_the_kubernetes_axis_runs_the_newest_pair_on_every_other_served_release() -> None:
    axis = compat.kubernetes_axis()
    assert [p.kubernetes for p in axis] == [k for k in components.SERVED_KUBERNETES if k != "v1.35.3"]
    assert {(p.aibrix, p.volcano) for p in axis} == {("v0.7.0", "v1.15.1")}
    assert len({p.slug for p in [*compat.served_pairs(), *axis]}) == 6 + len(axis)  # each run keeps its own logs


@pytest.mark.parametrize("kubernetes", [k for k in components.SERVED_KUBERNETES if k != "v1.35.3"])
def test_a_kubernetes_release_builds_its_control_plane_from_its_own_wrapper_and_keeps_kubectl(kubernetes: str, restored: None) -> None:
    kubectl = components.binary_path(components.COMPONENTS["kubectl"])
    volcano = components.binary_path(components.COMPONENTS["vc-scheduler"])
    components.select_versions(kubernetes=kubernetes)
    for name in ("kube-apiserver", "kube-controller-manager", "kube-scheduler"):
        component = components.COMPONENTS[name]
        assert component.version == kubernetes and component.module == f"kubernetes/{kubernetes}"
        assert f"-X k8s.io/component-base/version.gitVersion={kubernetes}" in component.ldflags
        go_mod = (component.module_dir / "go.mod").read_text()
        assert re.search(rf"^require k8s\.io/kubernetes {re.escape(kubernetes)}$", go_mod, re.MULTILINE)
        staging = "v0." + kubernetes.removeprefix("v1.")  # k8s.io/api etc. of the same release, never another's
        assert set(re.findall(r"^\tk8s\.io/\S+ => k8s\.io/\S+ (\S+)$", go_mod, re.MULTILINE)) == {staging}
    assert components.binary_path(components.COMPONENTS["kubectl"]) == kubectl
    assert components.binary_path(components.COMPONENTS["vc-scheduler"]) == volcano


@pytest.mark.parametrize(("aibrix", "volcano"), [("v0.6.0", "v1.14.1"), ("v0.7.0", "v1.15.0")])
def test_a_selected_pair_builds_from_its_own_wrappers_and_leaves_kubernetes_alone(aibrix: str, volcano: str, restored: None) -> None:
    apiserver = components.binary_path(components.COMPONENTS["kube-apiserver"])
    components.select_versions(aibrix, volcano)
    for name, version in (("vc-scheduler", volcano), ("vc-controller-manager", volcano), ("aibrix-controller-manager", aibrix)):
        component = components.COMPONENTS[name]
        assert component.version == version and version in component.cache_key()
        assert re.search(rf"^require \S+ {re.escape(version)}$", (component.module_dir / "go.mod").read_text(), re.MULTILINE)
    assert components.binary_path(components.COMPONENTS["kube-apiserver"]) == apiserver


def test_an_unserved_release_is_refused_naming_the_served_ones(restored: None) -> None:
    chosen = (components.VOLCANO_VERSION, components.KUBERNETES_VERSION)
    with pytest.raises(components.BuildError, match=r"Volcano v1\.16\.0: tools/ builds v1\.14\.1, v1\.15\.0, v1\.15\.1"):
        components.select_versions(volcano="v1.16.0")
    with pytest.raises(components.BuildError, match=r"Kubernetes v1\.29\.0: tools/ builds v1\.30\.14, "):
        components.select_versions(kubernetes="v1.29.0")
    assert chosen == (components.VOLCANO_VERSION, components.KUBERNETES_VERSION)  # nothing changed


@pytest.mark.parametrize(
    ("kubernetes", "path"),
    [("v1.30.14", "/healthz"), ("v1.31.0", "/readyz"), ("v1.35.3", "/readyz"), ("v1.37.2", "/readyz"), ("v2.0.0", "/readyz")],
)
def test_kube_scheduler_readiness_is_readyz_where_the_release_serves_it(kubernetes: str, path: str) -> None:
    assert cluster.kube_scheduler_ready_path(kubernetes) == path


def test_dev_build_takes_a_kubernetes_release_and_refuses_an_unserved_one(restored: None, capsys: pytest.CaptureFixture[str]) -> None:
    chosen = components.KUBERNETES_VERSION
    assert cli.main(["dev", "build", "--kubernetes-version", "v1.29.0", "kube-apiserver"]) == 2
    assert "no wrapper for Kubernetes v1.29.0: tools/ builds v1.30.14, v1.33.13, v1.35.3, v1.37.2" in capsys.readouterr().err
    assert chosen == components.KUBERNETES_VERSION
    args = cli.build_parser().parse_args(["dev", "up", "--state-dir", "d", "--kubernetes-version", "v1.30.14"])
    assert cli._select_versions(args)
    assert components.COMPONENTS["kube-apiserver"].version == "v1.30.14"
    assert components.COMPONENTS["kubectl"].version == "v1.35.3"
