"""docs/values.md names every value of the chart's schema, and only those (issue 45, item 3)."""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[2]
SCHEMA = REPO / "deploy" / "helm" / "stormtopo" / "values.schema.json"
PAGE = REPO / "docs" / "values.md"
WHOLE = {"resources"}  # documented as one value: Kubernetes' own ResourceRequirements


def leaves(node: dict[str, Any], path: tuple[str, ...] = ()) -> Iterator[str]:
    props = node.get("properties")
    if props and node.get("type") == "object" and ".".join(path) not in WHOLE:
        for key, child in props.items():
            yield from leaves(child, (*path, key))
    else:
        yield ".".join(path)


def test_every_value_of_the_schema_is_on_the_page_and_no_other() -> None:
    schema = set(leaves(json.loads(SCHEMA.read_text())))
    documented = set(re.findall(r"^\| `([A-Za-z0-9_.]+)` \|", PAGE.read_text(), re.M))
    assert schema - documented == set(), f"values missing from docs/values.md: {sorted(schema - documented)}"
    assert documented - schema == set(), f"docs/values.md names values the chart does not have: {sorted(documented - schema)}"
