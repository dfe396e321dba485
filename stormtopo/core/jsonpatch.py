"""JSON patch operations on Kubernetes objects (RFC 6902), the few shapes stormtopo writes."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any


def pointer(*keys: str) -> str:
    """A JSON pointer to nested keys; '~' and '/' inside a key are escaped (RFC 6901)."""
    return "".join("/" + key.replace("~", "~0").replace("/", "~1") for key in keys)


def set_metadata(obj: Mapping[str, Any], field: str, values: Mapping[str, str]) -> list[dict[str, Any]]:
    """Operations that set these labels or annotations (`field`), leaving the others; empty when set already."""
    current = dict((obj.get("metadata") or {}).get(field) or {})
    changes = {k: v for k, v in values.items() if current.get(k) != v}
    if not changes:
        return []
    if not (obj.get("metadata") or {}).get(field):
        return [{"op": "add", "path": pointer("metadata", field), "value": {**current, **changes}}]
    return [{"op": "add", "path": pointer("metadata", field, k), "value": v} for k, v in changes.items()]


def set_annotations(obj: Mapping[str, Any], values: Mapping[str, str]) -> list[dict[str, Any]]:
    return set_metadata(obj, "annotations", values)


def set_labels(obj: Mapping[str, Any], values: Mapping[str, str]) -> list[dict[str, Any]]:
    return set_metadata(obj, "labels", values)


def remove_annotation(key: str) -> dict[str, Any]:
    return {"op": "remove", "path": pointer("metadata", "annotations", key)}


def set_spec_fields(current_spec: Mapping[str, Any] | None, desired: Mapping[str, Any]) -> list[dict[str, Any]]:
    """Operations that set `desired` fields of a spec, leaving the others; empty when it already matches."""
    if current_spec is None:
        return [{"op": "add", "path": "/spec", "value": dict(desired)}]
    return [
        {"op": "replace" if key in current_spec else "add", "path": pointer("spec", key), "value": value}
        for key, value in desired.items()
        if current_spec.get(key) != value
    ]
