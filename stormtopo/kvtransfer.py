"""Modeled KV-cache transfer time of a prefill/decode pair, by the network tier it crosses."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from stormtopo.core.tier import tier_number
from stormtopo.core.topology.tree import Span


class KVConfigError(ValueError):
    """A KV-transfer model file is invalid; the message names the field."""


@dataclass(frozen=True)
class Link:
    bandwidth_gbps: float  # GB/s, one direction
    latency_us: float


@dataclass(frozen=True)
class KVModel:
    tiers: Mapping[int, Link]
    kv_bytes_per_token: int
    prompt_tokens: int

    @property
    def request_bytes(self) -> int:
        return self.kv_bytes_per_token * self.prompt_tokens

    def link(self, tier: int) -> Link:
        # A tier beyond the table (a deeper tree) costs as much as the widest one listed.
        return self.tiers[min(tier, max(self.tiers))]

    def seconds(self, tier: int) -> float:
        link = self.link(tier)
        return link.latency_us * 1e-6 + self.request_bytes / (link.bandwidth_gbps * 1e9)


def parse_kv_model(data: Mapping[str, Any]) -> KVModel:
    tiers = data.get("tiers")
    if not isinstance(tiers, Mapping) or not tiers:
        raise KVConfigError("'tiers' must map tier numbers (0 = same node) to {bandwidth_gbps, latency_us}")
    links = {}
    for key, value in tiers.items():
        tier = tier_number(key, lowest=0)
        if tier is None:
            raise KVConfigError(f"tiers: {key!r} is not a tier number (0 = same node, 1 = one leaf switch, ...)")
        try:
            link = Link(float(value["bandwidth_gbps"]), float(value["latency_us"]))
        except (KeyError, TypeError, ValueError) as exc:
            raise KVConfigError(f"tiers.{key}: needs numbers bandwidth_gbps and latency_us ({exc})") from exc
        if link.bandwidth_gbps <= 0 or link.latency_us < 0:
            raise KVConfigError(f"tiers.{key}: bandwidth_gbps must be > 0 and latency_us >= 0")
        links[tier] = link
    try:
        per_token, tokens = int(data["kv_bytes_per_token"]), int(data["prompt_tokens"])
    except (KeyError, TypeError, ValueError) as exc:
        raise KVConfigError(f"kv_bytes_per_token and prompt_tokens must be whole numbers ({exc})") from exc
    return KVModel(links, per_token, tokens)


def crossed_tier(span: Span, deepest: int) -> int:
    """The tier whose links a pair's KV cache crosses: the tier the pair spans (0 on one node), or one
    above the deepest tier when the nodes share no switch (or one is not in the tree)."""
    return span.tier if span.tier is not None else deepest + 1
