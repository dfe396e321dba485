"""A replica's gang and the GPUs of its pods, as StormService templates state them."""

from __future__ import annotations

from typing import Any

import pytest

from stormtopo.core.gang import gpu_count, replica_pods, template_spec


@pytest.mark.parametrize(
    ("value", "gpus"),
    [(8, 8), ("8", 8), ("8.0", 8), ("8000m", 8), ("7500m", 8), ("1e1", 10), ("1Ki", 1024), ("", 0), (0.5, 1)],
)
def test_a_gpu_quantity_as_kubernetes_writes_it_rounded_up(value: object, gpus: int) -> None:
    assert gpu_count(value) == gpus


@pytest.mark.parametrize("value", ["x", "8x", "1.2.3", True, None])
def test_what_is_not_a_quantity_is_refused(value: object) -> None:
    with pytest.raises(ValueError, match="not a quantity"):
        gpu_count(value)


def role(name: str, resources: dict[str, Any], replicas: int = 1, group: int | None = None) -> dict[str, Any]:
    out: dict[str, Any] = {"name": name, "replicas": replicas, "template": {"spec": {"containers": [{"resources": resources}]}}}
    if group:
        out["podGroupSize"] = group
    return out


def test_every_pod_of_a_replica_with_its_gpus() -> None:
    stormservice = {
        "spec": {
            "template": {
                "spec": {
                    "roles": [
                        role("prefill", {"requests": {"nvidia.com/gpu": "8000m"}}, group=2),  # a multi-node prefill
                        role("decode", {"limits": {"nvidia.com/gpu": 8}}),  # limits only
                        role("router", {}),  # asks for nothing
                    ]
                }
            }
        }
    }
    assert sorted(replica_pods(template_spec(stormservice))) == [0, 8, 8, 8]
    assert template_spec({}) == {} and template_spec({"spec": None}) == {}
