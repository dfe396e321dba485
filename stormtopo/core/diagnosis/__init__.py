"""`stormtopo doctor`: read-only checks of a cluster, as pure functions over what the doctor read.

The shell (commands/doctor.py) reads the cluster into a `Snapshot` (snapshot.py); each check turns it into
findings (findings.py), one line each: a level (ok, warning, error), the check's name, what was found and what to
do. A check that finds nothing wrong says so in one `ok` line. An error is something that silently breaks
topology-aware scheduling; a warning is something to look at.

The checks, in the order they run: Volcano's scheduler configuration (scheduler_config.py), the HyperNode tree
(tree.py), versions (versions.py), stormtopo's webhooks and admission policies (webhooks.py), the leader Lease
(leader.py), and opted-in StormServices' PodGroups (podgroups.py).
"""

from __future__ import annotations

from collections.abc import Callable

from stormtopo.core.diagnosis.findings import LISTED, Finding, Level, exit_code
from stormtopo.core.diagnosis.leader import LEASE_GRACE, check_leader
from stormtopo.core.diagnosis.podgroups import check_podgroups, podgroup_names
from stormtopo.core.diagnosis.scheduler_config import GPU_RESOURCE, NTA, RECOMMENDED_ACTIONS, RECOMMENDED_PLUGINS, check_scheduler_config
from stormtopo.core.diagnosis.snapshot import (
    AIBRIX_NAMESPACE,
    CONTROLLER_CONFIG_KEY,
    CONTROLLER_CONFIGMAP,
    SAMPLE,
    ServiceSample,
    Snapshot,
    Source,
)
from stormtopo.core.diagnosis.tree import check_hypernodes
from stormtopo.core.diagnosis.versions import check_versions, image_tag, parse_version
from stormtopo.core.diagnosis.webhooks import check_admission
from stormtopo.core.volcano_conf import SCHEDULER_CONFIG_KEY, SCHEDULER_CONFIGMAP, VOLCANO_NAMESPACE

__all__ = [
    "AIBRIX_NAMESPACE",
    "CHECKS",
    "CONTROLLER_CONFIGMAP",
    "CONTROLLER_CONFIG_KEY",
    "GPU_RESOURCE",
    "LEASE_GRACE",
    "LISTED",
    "NTA",
    "RECOMMENDED_ACTIONS",
    "RECOMMENDED_PLUGINS",
    "SAMPLE",
    "SCHEDULER_CONFIGMAP",
    "SCHEDULER_CONFIG_KEY",
    "VOLCANO_NAMESPACE",
    "Finding",
    "Level",
    "ServiceSample",
    "Snapshot",
    "Source",
    "check_admission",
    "check_hypernodes",
    "check_leader",
    "check_podgroups",
    "check_scheduler_config",
    "check_versions",
    "diagnose",
    "exit_code",
    "image_tag",
    "parse_version",
    "podgroup_names",
]


CHECKS: tuple[Callable[[Snapshot], list[Finding]], ...] = (
    check_scheduler_config,
    check_hypernodes,
    check_versions,
    check_admission,
    check_leader,
    check_podgroups,
)


def diagnose(snapshot: Snapshot) -> list[Finding]:
    return [finding for check in CHECKS for finding in check(snapshot)]
