"""The stream of xPyD StormServices the placement benchmark creates (seeded)."""

from __future__ import annotations

import random
from collections.abc import Sequence
from dataclasses import dataclass

from stormtopo.devenv.workloads import Role

SHAPES: dict[str, tuple[Role, ...]] = {
    "1P1D": (Role("prefill", 1, 4), Role("decode", 1, 4)),
    "2P2D": (Role("prefill", 2, 2), Role("decode", 2, 2)),
    "1P3D": (Role("prefill", 1, 2), Role("decode", 3, 2)),
    "mnP1D": (Role("prefill", 1, 4, pod_group_size=2), Role("decode", 1, 4)),  # multi-node prefill
}


@dataclass(frozen=True)
class Request:
    name: str
    shape: str

    @property
    def roles(self) -> tuple[Role, ...]:
        return SHAPES[self.shape]

    @property
    def pod_gpus(self) -> list[int]:
        return pod_gpus(self.roles)


def pod_gpus(roles: Sequence[Role]) -> list[int]:
    """GPUs of every pod of one replica of these roles."""
    return [r.gpus for r in roles for _ in range(r.replicas * r.pod_group_size)]


def stream(count: int, seed: int) -> list[Request]:
    rng = random.Random(seed)
    shapes = list(SHAPES)
    return [Request(f"svc-{i:03d}", rng.choice(shapes)) for i in range(count)]
