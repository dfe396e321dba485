"""CRDs of the local control plane, read from the upstream module sources in the Go module cache."""

from __future__ import annotations

from pathlib import Path

from stormtopo.devenv import components

# Volcano: everything its scheduler and controller manager watch. AIBrix: the orchestration API.
VOLCANO_CRDS = (
    "config/crd/volcano/bases/scheduling.volcano.sh_podgroups.yaml",
    "config/crd/volcano/bases/scheduling.volcano.sh_queues.yaml",
    "config/crd/volcano/bases/topology.volcano.sh_hypernodes.yaml",
    "config/crd/volcano/bases/nodeinfo.volcano.sh_numatopologies.yaml",
    "config/crd/volcano/bases/batch.volcano.sh_jobs.yaml",
    "config/crd/volcano/bases/batch.volcano.sh_cronjobs.yaml",
    "config/crd/volcano/bases/bus.volcano.sh_commands.yaml",
    "config/crd/volcano/bases/shard.volcano.sh_nodeshards.yaml",
    "config/crd/volcano/bases/config.volcano.sh_colocationconfigurations.yaml",
    "config/crd/jobflow/bases/flow.volcano.sh_jobflows.yaml",
    "config/crd/jobflow/bases/flow.volcano.sh_jobtemplates.yaml",
)
AIBRIX_CRDS = (
    "config/crd/orchestration/orchestration.aibrix.ai_stormservices.yaml",
    "config/crd/orchestration/orchestration.aibrix.ai_rolesets.yaml",
    "config/crd/orchestration/orchestration.aibrix.ai_podsets.yaml",
)


def crd_files() -> list[Path]:
    volcano = components.module_dir_of("k8s135", "volcano.sh/volcano", components.VOLCANO_VERSION)
    aibrix_component = components.COMPONENTS["aibrix-controller-manager"]
    aibrix = components.module_dir_of(aibrix_component.module, "github.com/vllm-project/aibrix", aibrix_component.version)
    return [volcano / f for f in VOLCANO_CRDS] + [aibrix / f for f in AIBRIX_CRDS]
