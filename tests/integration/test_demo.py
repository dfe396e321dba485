"""`stormtopo demo` (what `make demo` runs) shows both placements and stops what it started (issue 7); each
of its two trees shows its own run from the same busy cluster, not the cluster after both (issue 22)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from stormtopo.demo import BUSY
from stormtopo.devenv import processes
from tests.conftest import stormtopo

GPUS_PER_NODE = 8  # examples/topology/aibrix-1730.yaml's nodeDefaults
TREE_NODE = re.compile(r"(node\d+)\s+(\d+)/\d+ GPUs free((?:\s+[PD] pd-[\w-]+)*)")


def _trees(out: str) -> dict[str, dict[str, tuple[int, list[str]]]]:
    """Each tree's nodes: free GPUs and marks, by the tree's StormService (the trees stacked: 80 columns)."""
    trees: dict[str, dict[str, tuple[int, list[str]]]] = {}
    current = None
    for line in out.splitlines():
        if title := re.match(r"^(pd-[\w-]+): (with|without) stormtopo", line):
            current = trees.setdefault(title.group(1), {})
        elif "Modeled KV-cache transfer" in line:
            current = None
        elif current is not None and (node := TREE_NODE.search(line)):
            current[node.group(1)] = (int(node.group(2)), re.findall(r"[PD] pd-[\w-]+", node.group(3)))
    return trees


@pytest.mark.timeout(300)
def test_demo_prints_and_draws_both_placements_and_cleans_up(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("COLUMNS", "80")  # the trees one below the other, whatever terminal runs the tests
    picture = tmp_path / "placement.png"
    state = tmp_path / "demo-cluster"
    proc = stormtopo("demo", "--state-dir", str(state), "--picture", str(picture))
    out = proc.stdout
    assert "pd-plain" in out and "pd-hard" in out
    summary = r"^(pd-[\w-]+): prefill on (\w+), decode on (\w+), .* \(tier (\d)\)"
    rows = {m.group(1): m.groups()[1:] for m in re.finditer(summary, out, re.M)}
    assert int(rows["pd-hard"][2]) <= 1, out  # hard / tier 1: the pair stays under one leaf switch
    # Each tree shows its own run from the same busy cluster (4 GPUs free, 2 taken): not both replicas at once.
    assert re.findall(r"^pd-[\w-]+: prefill on .*; (\d+) GPUs free in its run", out, re.M) == ["2", "2"], out
    trees = _trees(out)
    assert set(trees) == {"pd-plain", "pd-hard"}, out
    for name, (prefill, decode, _) in rows.items():
        expected = {}
        for node, busy in BUSY.items():
            ours = [*([f"P {name}"] if node == prefill else []), *([f"D {name}"] if node == decode else [])]
            expected[node] = (GPUS_PER_NODE - busy - len(ours), ours)  # one GPU per pod of this run, none of the other's
        assert trees[name] == expected, out
    assert trees["pd-plain"] != trees["pd-hard"]  # "without" crosses a spine, "with" stays in a leaf: two pictures
    assert "KV transfer" in out and "ms" in out
    assert picture.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert not [p for p in processes.tracked(state) if p.alive()]
