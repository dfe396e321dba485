"""What the read commands share: the cluster's tree and tiers as the operator sees them, and a report
printed as text, or as json or yaml for tools (kubectl's -o)."""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping
from typing import Any

import yaml
from rich.console import Console

from stormtopo.core.capabilities import cluster_tiers
from stormtopo.core.request import ClusterTiers
from stormtopo.core.topology.hypernodes import topology_from_hypernodes
from stormtopo.core.topology.tree import Topology
from stormtopo.core.vocabulary import PODGROUP_CRD, VOLCANO_TOPOLOGY
from stormtopo.kube.client import Api


def cluster_view(api: Api) -> tuple[Topology, ClusterTiers]:
    """The switch tree over every node (HyperNodes may select by regex or label) and the cluster's tiers."""
    hypernodes = api.list_objects(VOLCANO_TOPOLOGY, "hypernodes")
    return topology_from_hypernodes(hypernodes, api.node_labels()), cluster_tiers(hypernodes, api.crd_schema(PODGROUP_CRD))


class NotFound(LookupError):
    """The StormService a command was asked about does not exist."""


def print_report(
    report: Mapping[str, Any], render: Callable[[Mapping[str, Any]], list[str]], console: Console, output: str, soft_wrap: bool = False
) -> None:
    if output == "json":
        console.print_json(json.dumps(report))
    elif output == "yaml":
        console.print(yaml.safe_dump(dict(report), sort_keys=False), end="", highlight=False)
    else:
        for line in render(report):
            console.print(line, highlight=False, soft_wrap=soft_wrap)
