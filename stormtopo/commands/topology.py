"""`stormtopo topology apply | from-labels | show`: declare the switch tree, and see it with its load."""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from rich.console import Console

from stormtopo.core.topology.fabric import check_size, parse_topology
from stormtopo.core.topology.hypernodes import hypernode_diff, hypernode_manifests, topology_from_hypernodes
from stormtopo.core.topology.labels import topology_from_labels
from stormtopo.core.topology.tree import Topology, TopologyError
from stormtopo.core.vocabulary import ROLE_LABEL, STORMSERVICE_LABEL, VOLCANO_TOPOLOGY
from stormtopo.kube.client import Api
from stormtopo.view.tree import topology_tree


def _apply(api: Api, topology: Topology, dry_run: bool, console: Console) -> int:
    existing = api.list_objects(VOLCANO_TOPOLOGY, "hypernodes")
    diff = hypernode_diff(hypernode_manifests(topology), existing)  # raises before anything is written
    for line in diff.lines():
        console.print(line, highlight=False)
    if dry_run:
        console.print("(dry run: nothing written)")
        return 0
    for manifest in diff.create + diff.update:  # leaves first, so a parent never names a missing child
        api.apply_hypernode(manifest)
    for name in reversed(diff.delete):
        api.delete_hypernode(name)
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
