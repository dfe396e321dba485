"""`stormtopo demo` (what `make demo` runs) shows both placements and stops what it started (issue 7)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from stormtopo.devenv import processes
from tests.conftest import stormtopo


@pytest.mark.timeout(300)
def test_demo_prints_and_draws_both_placements_and_cleans_up(tmp_path: Path) -> None:
    picture = tmp_path / "placement.png"
    state = tmp_path / "demo-cluster"
    proc = stormtopo("demo", "--state-dir", str(state), "--picture", str(picture))
    out = proc.stdout
    assert "pd-plain" in out and "pd-hard" in out
    rows = {m.group(1): int(m.group(2)) for m in re.finditer(r"^(pd-[\w-]+): prefill on .* \(tier (\d)\)", out, re.M)}
    assert rows["pd-hard"] <= 1, out  # hard / tier 1: the pair stays under one leaf switch
    # Each tree shows its own run from the same busy cluster (4 GPUs free, 2 taken): not both replicas at once.
    assert re.findall(r"^pd-[\w-]+: prefill on .*; (\d+) GPUs free in its run", out, re.M) == ["2", "2"], out
    assert "KV transfer" in out and "ms" in out
    assert picture.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert not [p for p in processes.tracked(state) if p.alive()]
