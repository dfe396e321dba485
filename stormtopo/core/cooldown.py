"""How long healing waits before it tries again: a replica after its move (the cool-down, doubled after
a move that did not land within its tier), after moves in a row that did not land (it gives up), after
a refused eviction (the back-off); and a service whose wide replicas had nowhere to go (the no-room
recheck). A replica's cool-down and misses are kept in its move record (core/moves.py), so that a
restarted operator keeps them.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

COOLDOWN = 900.0  # seconds: a replica is not moved again within this of its last move
COOLDOWN_MAX = 4 * 3600.0  # the cool-down doubles after each move that did not land within the tier, up to this
# Moves in a row that did not land within the tier, after which a replica is not moved again (one Event says
# so): what keeps a replica from landing is not what its move can change. A rollout's
# new replicas start afresh.
GIVE_UP_AFTER = 3
BACKOFF = 30.0  # seconds after a refused eviction before the replica is tried again; doubled per refusal
BACKOFF_MAX = 1800.0
NO_ROOM_RECHECKS = 3  # healing passes skipped for a service whose wide replicas had nowhere to go
NO_ROOM_RECHECK = 30.0  # seconds: NO_ROOM_RECHECKS passes at the default --heal-interval


def _misses(move: Mapping[str, Any]) -> int:
    value = move.get("misses")
    return value if isinstance(value, int) and not isinstance(value, bool) and value > 0 else 0


def _cooldown(move: Mapping[str, Any], default: float) -> float:
    value = move.get("cooldown")
    return float(value) if isinstance(value, int | float) and not isinstance(value, bool) and value > 0 else default
