"""`stormtopo topology apply | from-labels | show`: declare the switch tree, and see it with its load."""

from __future__ import annotations

import contextlib
import json
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import urllib3
import yaml
from rich.console import Console

from stormtopo.core.topology.fabric import check_size, parse_topology
from stormtopo.core.topology.hypernodes import HyperNodeDiff, hypernode_diff, hypernode_manifests, topology_from_hypernodes
from stormtopo.core.topology.labels import topology_from_labels
from stormtopo.core.topology.node_tier import NODE_TIER
from stormtopo.core.topology.tree import Topology, TopologyError
from stormtopo.core.vocabulary import OPERATOR_NAME, ROLE_LABEL, STORMSERVICE_LABEL, VOLCANO_TOPOLOGY
from stormtopo.kube.client import APPLY_PATCH, Api, ApiError, NotFound
from stormtopo.view.tree import topology_tree

# What can fail once writing has begun: the API server's refusal, or losing it.
_FAILURES = (ApiError, urllib3.exceptions.HTTPError, OSError)


@dataclass(frozen=True)
class _Write:
    """One HyperNode write of an apply, sent for real or as a server-side dry run."""

    verb: str  # create, update or delete
    name: str
    manifest: dict[str, Any] | None = None

    def __str__(self) -> str:
        return f"{self.verb} HyperNode {self.name}"

    def send(self, api: Api, dry_run: bool) -> None:
        query = {"dryRun": "All"} if dry_run else {}
        if self.verb == "create":  # not apply: a HyperNode someone made meanwhile is refused, not taken over
            api.request("POST", api.path(VOLCANO_TOPOLOGY, "hypernodes"), self.manifest, **query)
        elif self.verb == "update":
            path = api.path(VOLCANO_TOPOLOGY, "hypernodes", None, self.name)
            api.request("PATCH", path, self.manifest, APPLY_PATCH, fieldManager=OPERATOR_NAME, force="true", **query)
        else:
            with contextlib.suppress(NotFound):  # already gone is what was wanted
                api.request("DELETE", api.path(VOLCANO_TOPOLOGY, "hypernodes", None, self.name), **query)


def _ordered_writes(diff: HyperNodeDiff, existing: Sequence[Mapping[str, Any]]) -> list[_Write]:
    """Deletions first, parents before children, so no HyperNode is left with two parents (Volcano refuses
    to build such a tree); then creates and updates, children before parents, so a parent never names a
    child that does not exist yet. The node tier's tier-0 HyperNodes go last, once the leaves that named
    them have their nodes back: a leaf naming a missing HyperNode leaves its node outside the tree."""
    tier = {h["metadata"]["name"]: int((h.get("spec") or {}).get("tier", 0)) for h in existing}
    deletes = [_Write("delete", name) for name in sorted(diff.delete, key=lambda n: (-tier.get(n, 0), n))]
    upserts = [_Write("create", m["metadata"]["name"], m) for m in diff.create]
    upserts += [_Write("update", m["metadata"]["name"], m) for m in diff.update]
    upserts.sort(key=lambda w: (int((w.manifest or {})["spec"]["tier"]), w.name))
    last = [w for w in deletes if tier.get(w.name, 0) == NODE_TIER]
    return [w for w in deletes if w not in last] + upserts + last


def _api_message(exc: Exception) -> str:
    if not isinstance(exc, ApiError):
        return f"cannot reach the API server: {exc}"
    return f"HTTP {exc.status}: {exc.message}"


def _fail(text: str) -> int:
    print(f"stormtopo: {text}", file=sys.stderr)
    return 1


def _apply(api: Api, topology: Topology, dry_run: bool, console: Console) -> int:
    """All or nothing, as far as the API allows: every write is first sent as a server-side dry run, so
    whatever the API server (its validation, admission webhooks and policies, RBAC) would refuse is found
    before anything is stored. What can still fail after that (a race, an outage) is reported write by write."""
    existing = api.list_objects(VOLCANO_TOPOLOGY, "hypernodes")
    diff = hypernode_diff(hypernode_manifests(topology), existing)  # raises before anything is written
    for line in diff.lines():
        console.print(line, highlight=False)
    if dry_run:
        console.print("(dry run: nothing written)")
        return 0
    writes = _ordered_writes(diff, existing)
    for write in writes:
        try:
            write.send(api, dry_run=True)
        except _FAILURES as exc:
            return _fail(f"the API server would refuse to {write}: {_api_message(exc)}; nothing was written")
    for done, write in enumerate(writes):
        try:
            write.send(api, dry_run=False)
        except _FAILURES as exc:
            written = ", ".join(map(str, writes[:done])) or "nothing"
            return _fail(
                f"{write} failed: {_api_message(exc)}\n"
                f"  written: {written}\n"
                f"  not written: {', '.join(map(str, writes[done:]))}\n"
                "  run the same command again to finish: it writes only what still differs"
            )
    return 0


def apply_file(api: Api, path: Path, dry_run: bool, console: Console) -> int:
    """Validate a description (and that its nodes exist) before writing anything."""
    check_size(path.stat().st_size)  # before reading: a huge file is refused without loading it
    try:
        text = path.read_text()
    except UnicodeDecodeError as exc:
        raise TopologyError(f"not UTF-8 text ({exc.reason} at byte {exc.start})") from exc
    topology = parse_topology(text)
    present = set(api.node_labels())
    missing = sorted(set(topology.nodes) - present, key=lambda n: topology.lines.get(n, 0))
    if missing:
        where = ", ".join(f"{n} (line {topology.lines.get(n, '?')})" for n in missing)
        raise TopologyError(f"{len(missing)} node(s) of the description do not exist in the cluster: {where}")
    return _apply(api, topology, dry_run, console)


def apply_labels(api: Api, levels: list[str], dry_run: bool, console: Console) -> int:
    return _apply(api, topology_from_labels(api.node_labels(), levels), dry_run, console)


def _replicas_by_node(api: Api) -> dict[str, list[str]]:
    """Labels like "P ns/svc:roleset" per node, for every bound pod of a StormService."""
    marks: dict[str, list[str]] = {}
    for pod in api.raw_list("/api/v1/pods", labelSelector=STORMSERVICE_LABEL, fieldSelector="spec.nodeName!="):
        labels = pod["metadata"].get("labels") or {}
        role = labels.get(ROLE_LABEL, "?")
        where = f"{pod['metadata']['namespace']}/{labels.get('roleset-name', '?')}"
        marks.setdefault(pod["spec"]["nodeName"], []).append(f"{role[:1].upper()} {where}")
    return marks


def show(api: Api, output: str, console: Console) -> int:
    free = api.free_gpus()
    totals = api.gpu_totals()
    topology = topology_from_hypernodes(api.list_objects(VOLCANO_TOPOLOGY, "hypernodes"), api.node_labels())  # labelMatch needs labels
    marks = _replicas_by_node(api)
    if output == "json":
        console.print_json(json.dumps(_as_json(topology, free, totals, marks)))
        return 0
    if output == "yaml":
        console.print(yaml.safe_dump(_as_json(topology, free, totals, marks), sort_keys=False), end="", highlight=False)
        return 0
    if not topology.switches:
        console.print("no HyperNodes in this cluster: create them with `stormtopo topology apply -f FILE` or `from-labels`")
        return 0
    console.print(topology_tree(topology, free, totals, marks, title="HyperNodes"))
    return 0


def _as_json(topology: Topology, free: Mapping[str, int], totals: Mapping[str, int], marks: Mapping[str, list[str]]) -> dict[str, Any]:
    def gpus(nodes: list[str]) -> dict[str, int]:
        return {"free": sum(free.get(n, 0) for n in nodes), "total": sum(totals.get(n, 0) for n in nodes)}

    return {
        "hyperNodes": [
            {
                "name": s.name,
                "tier": s.tier,
                "parent": s.parent,
                "children": list(s.children),
                "nodes": list(s.nodes),
                "gpus": gpus(topology.nodes_under(s.name)),
            }
            for s in sorted(topology.switches.values(), key=lambda s: (s.tier, s.name))
        ],
        "nodes": [
            {"name": n, "hyperNode": topology.nodes[n].switch, "gpus": gpus([n]), "replicas": marks.get(n, [])}
            for n in sorted(topology.nodes)
        ],
    }
