"""A replica's gang: every pod of every role (replicas x podGroupSize), counted per role, with GPUs.

Volcano admits a gang only when minMember pods can run together; minTaskMember holds each role to
its count, keyed by the role name pods carry in volcano.sh/task-spec.
"""

from __future__ import annotations

import math
import re
from collections.abc import Collection, Mapping
from dataclasses import dataclass
from fractions import Fraction
from typing import Any

from stormtopo.core.vocabulary import GPU

_QUANTITY = re.compile(r"([+-]?(?:\d+\.?\d*|\.\d+))(?:[eE]([+-]?\d+)|(m|k|M|G|T|P|E|Ki|Mi|Gi|Ti|Pi|Ei))?")
_SUFFIXES: dict[str, Fraction] = {"m": Fraction(1, 1000), **{s: Fraction(10 ** (3 * i)) for i, s in enumerate("kMGTPE", 1)}}
_SUFFIXES.update({f"{s}i": Fraction(2 ** (10 * i)) for i, s in enumerate("KMGTPE", 1)})


def quantity(value: object) -> Fraction:
    """A resource quantity as Kubernetes may write it (8, "8", "8.0", "8000m", "1e1", "1Gi"); "" is 0.
    ValueError for anything that is not a quantity."""
    if isinstance(value, bool):
        raise ValueError(f"not a quantity: {value!r}")
    if isinstance(value, int):
        return Fraction(value)
    if isinstance(value, float):
        return Fraction(value)
    text = str(value).strip()
    if not text:
        return Fraction(0)
    match = _QUANTITY.fullmatch(text)
    if match is None:
        raise ValueError(f"not a quantity: {value!r}")
    number, exponent, suffix = match.groups()
    scale = Fraction(10) ** int(exponent) if exponent else _SUFFIXES.get(suffix or "", Fraction(1))
    return Fraction(number) * Fraction(scale)


def gpu_count(value: object) -> int:
    """A GPU quantity as Kubernetes may write it (8, "8", "8.0", "8000m", "1e1"), rounded up; "" is 0.
    ValueError for anything that is not a quantity."""
    return math.ceil(quantity(value))


@dataclass(frozen=True)
class Gang:
    min_member: int
    min_task_member: Mapping[str, int]


def container_gpus(pod_spec: Mapping[str, Any], resource: str = GPU) -> int:
    """GPUs a pod's containers request (as the free-room reading counts them); an unreadable request counts
    as none (the API server admits only quantities)."""
    gpus = 0
    for container in pod_spec.get("containers") or []:
        try:
            gpus += gpu_count(((container.get("resources") or {}).get("requests") or {}).get(resource, "0"))
        except ValueError:
            continue
    return gpus


def template_spec(stormservice: Mapping[str, Any]) -> Mapping[str, Any]:
    """The RoleSet spec every replica of a StormService is made from."""
    return ((stormservice.get("spec") or {}).get("template") or {}).get("spec") or {}


def role_pod_count(role: Mapping[str, Any]) -> int:
    replicas = role.get("replicas")
    group_size = role.get("podGroupSize")
    return int(1 if replicas is None else replicas) * max(1, int(group_size or 1))


def requests_resources(pod_spec: Mapping[str, Any]) -> bool:
    """Whether a pod asks for any resource. Volcano places a pod that asks for none in its backfill
    action, which ignores HyperNodes."""
    return any(
        (c.get("resources") or {}).get("requests") or (c.get("resources") or {}).get("limits") for c in pod_spec.get("containers") or []
    )


def followers(roleset_spec: Mapping[str, Any]) -> frozenset[str]:
    """Roles whose pods ask for no resources, in a replica where another role does (its anchor).
    stormtopo holds them back until the anchor is placed, then keeps them within its domain; they
    are not part of the gang Volcano places."""
    roles = roleset_spec.get("roles") or []
    idle = {str(r.get("name", "")) for r in roles if not requests_resources((r.get("template") or {}).get("spec") or {})}
    return frozenset(idle) if len(idle) < len(roles) else frozenset()


def gang_of(roleset_spec: Mapping[str, Any], without: Collection[str] = ()) -> Gang:
    """The gang of one replica: all of its pods (but roles in `without`), and per role."""
    roles = [role for role in roleset_spec.get("roles") or [] if str(role.get("name", "")) not in without]
    per_role = {str(role.get("name", "")): role_pod_count(role) for role in roles}
    per_role = {name: count for name, count in per_role.items() if count > 0}
    return Gang(sum(per_role.values()), per_role)


def gpus_per_pod(roleset_spec: Mapping[str, Any], resource: str = GPU) -> dict[str, int]:
    """GPUs one pod of each role requests (requests, else limits, summed over containers)."""
    out = {}
    for role in roleset_spec.get("roles") or []:
        containers = ((role.get("template") or {}).get("spec") or {}).get("containers") or []
        total = 0
        for c in containers:
            res = c.get("resources") or {}
            value = (res.get("requests") or {}).get(resource, (res.get("limits") or {}).get(resource, 0))
            total += gpu_count(value)
        out[str(role.get("name", ""))] = total
    return out


def replica_pods(roleset_spec: Mapping[str, Any]) -> list[int]:
    """GPU requests of every pod of one replica."""
    gpus = gpus_per_pod(roleset_spec)
    return [gpus.get(role, 0) for role, count in gang_of(roleset_spec).min_task_member.items() for _ in range(count)]
