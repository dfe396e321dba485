"""The compat runner's bookkeeping and the release switch, without a cluster (they run in `make test`)."""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path

import pytest

from stormtopo.devenv import compat, components

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
    before = (components.AIBRIX_VERSION, components.VOLCANO_VERSION)
    for var in ("STORMTOPO_AIBRIX_VERSION", "STORMTOPO_VOLCANO_VERSION"):
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


def test_every_served_pair_is_run_and_dev_up_defaults_to_the_newest() -> None:
    assert len(compat.served_pairs()) == len(components.SERVED_AIBRIX) * len(components.SERVED_VOLCANO) == 6
    assert (components.SERVED_AIBRIX[-1], components.SERVED_VOLCANO[-1]) == ("v0.7.0", "v1.15.1")


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
    chosen = components.VOLCANO_VERSION
    with pytest.raises(components.BuildError, match=r"Volcano v1\.16\.0: tools/ builds v1\.14\.1, v1\.15\.0, v1\.15\.1"):
        components.select_versions(volcano="v1.16.0")
    assert chosen == components.VOLCANO_VERSION  # nothing changed
