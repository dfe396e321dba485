"""Which StormService and RoleSet an object belongs to: AIBrix's labels first, owner references second."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from stormtopo.core.vocabulary import ROLESET_LABEL, STORMSERVICE_API, STORMSERVICE_LABEL


def _owner(obj: Mapping[str, Any], label: str, kind: str) -> str | None:
    meta = obj.get("metadata") or {}
    labelled = (meta.get("labels") or {}).get(label)
    if labelled:
        return str(labelled)
    return next((str(o["name"]) for o in meta.get("ownerReferences") or [] if o.get("kind") == kind and o.get("name")), None)


def stormservice_name(obj: Mapping[str, Any]) -> str | None:
    """The StormService of a RoleSet, a pod or a PodGroup, if it names one."""
    return _owner(obj, STORMSERVICE_LABEL, "StormService")


def roleset_name(obj: Mapping[str, Any]) -> str | None:
    """The RoleSet (replica) of a pod or a PodGroup, if it names one."""
    return _owner(obj, ROLESET_LABEL, "RoleSet")


def owner_reference(owner: Mapping[str, Any], kind: str) -> dict[str, Any]:
    """A non-controller owner reference to a StormService or RoleSet: deleting the owner deletes the
    object, and AIBrix stays the controller of what it made."""
    meta = owner["metadata"]
    return {
        "apiVersion": owner.get("apiVersion", STORMSERVICE_API),
        "kind": kind,
        "name": meta["name"],
        "uid": meta["uid"],
        "blockOwnerDeletion": True,
        "controller": False,
    }
