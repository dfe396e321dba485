"""Volcano's scheduler configuration as stormtopo reads it: its actions and plugins, and what they mean for a
job with a network topology. The doctor checks it whole (core/diagnosis/scheduler_config.py); a Pending
replica's explanation asks one thing of it: does anything preempt for such a job?

Volcano v1.15.1's `preempt` skips every job with a network topology; `gangpreempt` is the one action that
preempts for them (docs/install.md, "Priority and preemption"). Without it, a high-priority opted-in replica
in a full cluster waits for room that nothing frees, while the same service without stormtopo's request
would have preempted: its Warning must say so, not name victims that nobody will take.
"""

from __future__ import annotations

import argparse
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import yaml

# Where Volcano's own install keeps its configuration (its chart, release "volcano").
VOLCANO_NAMESPACE = "volcano-system"
SCHEDULER_CONFIGMAP = "volcano-scheduler-configmap"
SCHEDULER_CONFIG_KEY = "volcano-scheduler.conf"
GANG_PREEMPT, PREEMPT = "gangpreempt", "preempt"
PREEMPTION_DOC = "docs/install.md#priority-and-preemption"


def configmap_ref(text: str) -> str:
    """NAMESPACE/NAME of the ConfigMap holding vc-scheduler's configuration, or "" for none: the operator's and the
    CLI's --volcano-scheduler-configmap (an argparse type: its error says what is accepted)."""
    if text and not re.fullmatch(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?/[a-z0-9]([-.a-z0-9]*[a-z0-9])?", text):
        example = f"{VOLCANO_NAMESPACE}/{SCHEDULER_CONFIGMAP}"
        raise argparse.ArgumentTypeError(f"{text!r}: accepted: NAMESPACE/NAME, e.g. {example}, or '' for none")
    return text


class SchedulerConfError(ValueError):
    """The text is no configuration vc-scheduler would load: what is wrong with it."""


@dataclass(frozen=True)
class SchedulerConf:
    where: str  # the file, or ConfigMap and key, it was read from
    actions: tuple[str, ...]
    plugins: Mapping[str, Mapping[str, Any]] = field(default_factory=dict, compare=False, hash=False)  # name -> options

    @property
    def preempts_for_topology(self) -> bool:
        return GANG_PREEMPT in self.actions

    def actions_with_preemption(self) -> tuple[str, ...]:
        """Its actions with preempt then gangpreempt right after allocate (where docs/install.md puts them)."""
        kept = [a for a in self.actions if a not in (PREEMPT, GANG_PREEMPT)]
        at = kept.index("allocate") + 1 if "allocate" in kept else len(kept)
        return (*kept[:at], PREEMPT, GANG_PREEMPT, *kept[at:])

    def no_topology_preemption(self) -> str | None:
        """Why nothing preempts for a job with a network topology under this configuration; None if gangpreempt runs."""
        if self.preempts_for_topology:
            return None
        return (
            f"Volcano's scheduler runs no {GANG_PREEMPT} ({self.where}: actions {', '.join(self.actions) or 'none'}) and its "
            f"{PREEMPT} skips every job with a network topology, so nothing is preempted for it; to preempt, set "
            f'actions: "{", ".join(self.actions_with_preemption())}" ({PREEMPTION_DOC})'
        )


def parse_scheduler_conf(text: str, where: str) -> SchedulerConf:
    """vc-scheduler's configuration (its --scheduler-conf file, or the ConfigMap key Volcano's chart mounts there)."""
    try:
        conf = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        raise SchedulerConfError(f"not valid YAML ({str(exc).splitlines()[0]})") from None
    if not isinstance(conf, Mapping):
        raise SchedulerConfError("not a mapping with actions and tiers")
    plugins: dict[str, Mapping[str, Any]] = {}
    tiers = conf.get("tiers")
    for tier in tiers if isinstance(tiers, list) else []:
        options = tier.get("plugins") if isinstance(tier, Mapping) else None
        for option in options if isinstance(options, list) else []:
            if isinstance(option, Mapping) and option.get("name"):
                plugins.setdefault(str(option["name"]), option)
    actions = tuple(a.strip() for a in str(conf.get("actions") or "").split(",") if a.strip())
    return SchedulerConf(where, actions, plugins)
