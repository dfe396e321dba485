"""Tier numbers as users write them: in annotations, topology files and the KV-transfer config."""

from __future__ import annotations

import re
from collections.abc import Iterable

# ASCII digits only: str.isdigit() also accepts '¹' or '٣', which int() then refuses.
_WHOLE_NUMBER = re.compile(r"[0-9]+")


def tier_number(text: object, lowest: int = 1) -> int | None:
    """The tier a text names (1 = the switches closest to the nodes), or None when it names none."""
    value = str(text).strip()
    if not _WHOLE_NUMBER.fullmatch(value):
        return None
    tier = int(value)
    return tier if tier >= lowest else None


def tier_of_name(name: str | None, named: Iterable[tuple[str, int]]) -> int | None:
    """The tier a HyperNode tierName names, given each (tierName, tier) the cluster's HyperNodes carry: the highest
    where several tiers carry it; None if none is named so. The one resolver of tier
    names (a request's limit through the cluster's tiers, an explanation through the tree)."""
    return max((tier for each, tier in named if each == name), default=None) if name else None
