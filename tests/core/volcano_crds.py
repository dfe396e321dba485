"""Volcano's PodGroup CRD as each release ships it (tests/data/upstream-crds)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml

CRDS = Path(__file__).resolve().parents[2] / "tests" / "data" / "upstream-crds"


def podgroup_schema(release: str) -> dict[str, Any]:
    """The PodGroup's OpenAPI schema in Volcano `release` (its newest version's)."""
    crd = yaml.safe_load((CRDS / f"volcano-{release}" / "scheduling.volcano.sh_podgroups.yaml").read_text())
    return dict(crd["spec"]["versions"][-1]["schema"]["openAPIV3Schema"])
