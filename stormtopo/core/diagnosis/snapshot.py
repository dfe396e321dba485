"""What the doctor read: the shell (commands/doctor.py) reads the cluster into a `Snapshot`, each check turns it
into findings; where Volcano's and AIBrix's installs keep what it reads, and how many StormServices it samples."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

# Where Volcano's own install keeps its controllers' configuration (its chart, release "volcano").
CONTROLLER_CONFIGMAP = "volcano-controller-configmap"
CONTROLLER_CONFIG_KEY = "volcano-controller.conf"
AIBRIX_NAMESPACE = "aibrix-system"

# Opted-in StormServices whose PodGroups are compared: bounded, so the doctor stays cheap at 10,000 services.
SAMPLE = 200


@dataclass(frozen=True)
class Source:
    """A configuration text, or why it could not be read; `where` names the file or the ConfigMap."""

    where: str
    text: str | None = None
    problem: str | None = None


@dataclass(frozen=True)
class ServiceSample:
    stormservice: Mapping[str, Any]
    rolesets: tuple[Mapping[str, Any], ...]
    podgroups: Mapping[str, Mapping[str, Any]]  # by name, in the StormService's namespace


@dataclass(frozen=True)
class Snapshot:
    """What the doctor read. `unreadable`: what could not be read (hypernodes, nodes, podgroup-crd,
    deployments, admission, leases, stormservices) -> why (HTTP 403, not found); its fields are then empty."""

    now: float  # wall-clock seconds, to judge the Lease's renewTime and moves' deadlines
    scheduler_config: Source
    controller_config: Source | None = None
    hypernodes: tuple[Mapping[str, Any], ...] = ()
    nodes: Mapping[str, Mapping[str, str]] = field(default_factory=dict)  # name -> labels
    podgroup_schema: Mapping[str, Any] | None = None
    images: tuple[tuple[str, str], ...] = ()  # (namespace/deployment, image) in Volcano's and AIBrix's namespaces
    admission: tuple[Mapping[str, Any], ...] = ()  # webhook configurations, admission policies and bindings
    expected_admission: tuple[Mapping[str, Any], ...] = ()  # what stormtopo registers (operator/webhook.py)
    lease_name: str = "stormtopo-operator"
    leases: tuple[Mapping[str, Any], ...] = ()
    services: tuple[ServiceSample, ...] = ()
    services_more: bool = False  # more opted-in StormServices exist than were sampled
    unreadable: Mapping[str, str] = field(default_factory=dict)
