"""The kopf shell: what the operator registers, and what it tells kopf it does not need."""

from __future__ import annotations

from typing import Any, cast

import kopf

from stormtopo.operator import handlers
from stormtopo.operator.leader import Leadership


def _registry() -> kopf.OperatorRegistry:
    registry = kopf.OperatorRegistry()
    unused = cast(Any, None)  # registration only keeps these: nothing is called before kopf runs
    handlers.register(registry, unused, unused, unused, Leadership(None, "default", "test", 15))
    return registry


def test_only_raw_event_handlers_so_kopf_needs_no_diff_base() -> None:
    """NoDiffBase tells kopf nothing ever changed: right only while no change or daemon handler exists
    (an on.update handler would never fire). Adding one must fail here, not silently in a cluster."""
    registry = _registry()
    assert len(registry._watching.get_all_handlers()) == 3  # StormServices, RoleSets, HyperNodes: pods and PodGroups are not kopf's
    assert not registry._changing.get_all_handlers()
    assert not registry._spawning.get_all_handlers()
    assert not registry._indexing.get_all_handlers()


def test_no_diff_base_keeps_no_copy_of_an_object() -> None:
    storage = handlers.NoDiffBase()
    body = kopf.Body({"metadata": {"name": "p", "annotations": {"a": "b"}}, "spec": {"x": [1, 2]}})
    assert storage.build(body=body) == {}
    assert storage.fetch(body=body) is None
    patch = kopf.Patch()
    storage.store(body=body, patch=patch, essence=kopf.BodyEssence())
    assert not patch  # never writes kopf's last-handled annotation into a user's object


def test_the_operator_uses_it() -> None:
    settings = kopf.OperatorSettings()
    handlers._configure(settings)
    assert isinstance(settings.persistence.diffbase_storage, handlers.NoDiffBase)
