"""Volcano's scheduler configuration: network-topology-aware enabled and kept to a tier, no task-topology, and
the actions and plugins docs/install.md recommends."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from stormtopo.core.diagnosis.findings import Finding, Level
from stormtopo.core.diagnosis.snapshot import Snapshot
from stormtopo.core.diagnosis.tree import _node_tier
from stormtopo.core.volcano_conf import GANG_PREEMPT, PREEMPT, PREEMPTION_DOC, SchedulerConf, SchedulerConfError, parse_scheduler_conf

NTA = "network-topology-aware"
# docs/install.md, "Volcano": Volcano's default actions (backfill places pods that ask for no resources), and the
# plugins stormtopo relies on or recommends beside network-topology-aware.
RECOMMENDED_ACTIONS = ("enqueue", "allocate", "backfill")
RECOMMENDED_PLUGINS = ("gang", "predicates", "nodeorder", "binpack")
GPU_RESOURCE = "nvidia.com/gpu"
# What gangpreempt asks of the plugins (docs/install.md "Priority and preemption"): without them it finds no
# victim (priority, gang), may take critical pods (conformance), or ignores the queues' shares (proportion).
GANG_PREEMPT_PLUGINS = ("priority", "gang", "conformance", "predicates", "proportion")


def _arguments(option: Mapping[str, Any]) -> Mapping[str, Any]:
    arguments = option.get("arguments")
    return arguments if isinstance(arguments, Mapping) else {}


def check_scheduler_config(snapshot: Snapshot) -> list[Finding]:
    """network-topology-aware enabled (else a hard networkTopology is not enforced), no task-topology
    (panics vc-scheduler), and the actions and plugins docs/install.md recommends."""
    check, source = "scheduler-config", snapshot.scheduler_config
    if source.text is None:
        return [
            Finding(
                Level.WARNING,
                check,
                f"Volcano's scheduler configuration could not be read ({source.where}: {source.problem})",
                "pass the file vc-scheduler runs with (its --scheduler-conf) as --scheduler-config FILE",
            )
        ]
    try:
        conf = parse_scheduler_conf(source.text, source.where)
    except SchedulerConfError as exc:
        return [
            Finding(
                Level.ERROR,
                check,
                f"{source.where}: {exc}; vc-scheduler keeps its previous configuration, at start Volcano's default (without {NTA})",
                "fix the file",
            )
        ]
    plugins, actions = conf.plugins, list(conf.actions)
    findings: list[Finding] = []
    nta = plugins.get(NTA)
    install = "docs/install.md#volcano"
    if nta is None:
        findings.append(
            Finding(
                Level.ERROR,
                check,
                f"{source.where}: the {NTA} plugin is not enabled, so Volcano does not enforce a hard networkTopology: "
                "replicas are placed across any switch",
                f"add `- name: {NTA}` to a tier's plugins ({install})",
            )
        )
    elif nta.get("enabledHyperNodeGradient") is False:
        findings.append(
            Finding(
                Level.ERROR,
                check,
                f"{source.where}: {NTA} has enabledHyperNodeGradient: false, so Volcano does not keep a gang within its tier",
                "remove enabledHyperNodeGradient from the plugin's options",
            )
        )
    if "task-topology" in plugins:
        findings.append(
            Finding(
                Level.ERROR,
                check,
                f"{source.where}: the task-topology plugin is enabled; in Volcano v1.15.1 it panics vc-scheduler as soon as a "
                "gang with a hard network topology has more than one HyperNode it could go to (volcano-sh/volcano#4003)",
                f"remove task-topology ({install})",
            )
        )
    missing = [f"action {a}" for a in RECOMMENDED_ACTIONS if a not in actions]
    missing += [f"plugin {p}" for p in RECOMMENDED_PLUGINS if p not in plugins]
    findings += _preemption(conf)
    if GANG_PREEMPT in actions:
        shares = "capacity" if "capacity" in plugins else "proportion"  # capacity replaces proportion (queues' shares)
        wanted = [p if p != "proportion" else shares for p in GANG_PREEMPT_PLUGINS]
        missing += [f"plugin {p} (for {GANG_PREEMPT})" for p in wanted if p not in plugins and p not in RECOMMENDED_PLUGINS]
    binpack = plugins.get("binpack")
    if binpack is not None and GPU_RESOURCE not in str(_arguments(binpack).get("binpack.resources", "")):
        missing.append(f"binpack.resources: {GPU_RESOURCE} (GPUs packed rather than spread)")
    if missing:
        findings.append(
            Finding(
                Level.WARNING,
                check,
                f"{source.where}: recommended but missing: {', '.join(missing)}",
                f"add them as the local control plane runs them ({install})",
            )
        )
    if nta is not None and _node_tier(snapshot.hypernodes):
        normal = str(_arguments(nta).get("hypernode.binpack.normal-pod.enable", "")).lower()
        if normal != "false":
            findings.append(
                Finding(
                    Level.WARNING,
                    check,
                    f"{source.where}: the node tier is on (tier-0 HyperNodes of stormtopo's) and {NTA} scores pods without a "
                    "topology over every HyperNode, the tier-0 ones included, which slows them",
                    f"set hypernode.binpack.normal-pod.enable: false in {NTA}'s arguments (docs/node-tier.md#volcanos-setting)",
                )
            )
    if not findings:
        findings.append(
            Finding(Level.OK, check, f"{source.where}: {NTA} enabled; actions {', '.join(actions)}; recommended plugins present")
        )
    return findings


def _preemption(conf: SchedulerConf) -> list[Finding]:
    """Without gangpreempt, an opted-in replica never preempts lower-priority work (it waits for room); with it
    before preempt, jobs without a topology preempt only after every topology job's turn."""
    actions, where = list(conf.actions), conf.where
    todo = f'actions: "{", ".join(conf.actions_with_preemption())}" ({PREEMPTION_DOC})'
    if GANG_PREEMPT not in actions:
        return [
            Finding(
                Level.WARNING,
                "scheduler-config",
                f"{where}: no {GANG_PREEMPT} action: Volcano's {PREEMPT} skips every job with a network topology, so an opted-in "
                "replica never preempts lower-priority work; a high-priority replica in a full cluster stays Pending",
                todo,
            )
        ]
    if PREEMPT in actions and actions.index(PREEMPT) > actions.index(GANG_PREEMPT):
        return [
            Finding(
                Level.WARNING,
                "scheduler-config",
                f"{where}: {GANG_PREEMPT} runs before {PREEMPT}: jobs without a network topology preempt only after it",
                todo,
            )
        ]
    return []
