"""The on/off annotations of a StormService (stormtopo.io/heal, stormtopo.io/lend-room,
stormtopo.io/prefer-same-node): one rule for all three. "true" or "false", any case, spaces around; any
other value is off, and said (a typo must not pass for "off" in silence)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from stormtopo.core.vocabulary import HEAL_ANNOTATION, LEND_ROOM_ANNOTATION, PREFER_SAME_NODE

SWITCHES = (HEAL_ANNOTATION, LEND_ROOM_ANNOTATION, PREFER_SAME_NODE)
WHAT_OFF_MEANS = {
    HEAL_ANNOTATION: "healing stays off",
    LEND_ROOM_ANNOTATION: "it lends no room",
    PREFER_SAME_NODE: "a replica's pods get no preference for one node",
}


def _value(obj: Mapping[str, Any] | None, key: str) -> object:
    return (((obj or {}).get("metadata") or {}).get("annotations") or {}).get(key)


def switched_on(obj: Mapping[str, Any] | None, key: str) -> bool:
    """`key: "true"` on the object (any case, spaces around)."""
    return str(_value(obj, key) or "").strip().lower() == "true"


def switch_problem(obj: Mapping[str, Any] | None, key: str) -> str | None:
    """What is wrong with one on/off annotation, if it is there and neither "true" nor "false"."""
    given = _value(obj, key)
    if given is None or str(given).strip().lower() in ("true", "false"):
        return None
    return f'annotation {key}: {given!r} is not understood, {WHAT_OFF_MEANS[key]}; accepted: "true" or "false"'
