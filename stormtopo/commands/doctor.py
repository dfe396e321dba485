"""`stormtopo doctor`: read the cluster into a snapshot (reads only, never a write) and print the pure checks of
core/diagnosis/, one line each. What could not be read (403, a CRD missing) is a finding too, not a failure."""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable, Iterator, Mapping
from concurrent.futures import ThreadPoolExecutor
from functools import partial
from pathlib import Path
from typing import Any, TypeVar

from rich.console import Console

from stormtopo.commands.report import print_report
from stormtopo.core.diagnosis import (
    AIBRIX_NAMESPACE,
    CONTROLLER_CONFIG_KEY,
    CONTROLLER_CONFIGMAP,
    SAMPLE,
    SCHEDULER_CONFIG_KEY,
    SCHEDULER_CONFIGMAP,
    VOLCANO_NAMESPACE,
    Finding,
    ServiceSample,
    Snapshot,
    Source,
    diagnose,
    exit_code,
    podgroup_names,
)
from stormtopo.core.optin import LABEL_POLICY
from stormtopo.core.request import is_opted_in
from stormtopo.core.vocabulary import AIBRIX, PODGROUP_CRD, ROLESET_LABEL, STORMSERVICE_LABEL, VOLCANO_SCHEDULING, VOLCANO_TOPOLOGY
from stormtopo.kube.client import Api, ApiError
from stormtopo.operator.leader import LEASE_NAME
from stormtopo.operator.webhook import (
    configuration,
    served_label_policy,
)  # what stormtopo registers: the checks look for that

T = TypeVar("T")
CORE = ("", "v1")
ADMISSION = ("admissionregistration.k8s.io", "v1")
READ_AT_MOST = 2_000  # StormServices read to find the sample: bounded, at 10,000 services too
CHUNK = 50  # RoleSet names per label selector (a URL stays short)


class BadFile(ValueError):
    """--scheduler-config names a file that cannot be read: bad usage (exit 2)."""


def run(api: Api, scheduler_config: str | None, console: Console, output: str = "text") -> int:
    """Print every check's findings; 0 when none is an error, 1 otherwise."""
    source = read_file(scheduler_config) if scheduler_config else None  # before any request: bad usage first
    findings = diagnose(read_snapshot(api, source))
    report = {
        "checks": [dataclasses.asdict(f) for f in findings],
        "errors": sum(f.level == "error" for f in findings),
        "warnings": sum(f.level == "warning" for f in findings),
    }
    if output == "json":
        print_report(report, render, console, output)
    else:  # not as rich markup: a finding may quote brackets (a RequestError's values, a YAML error)
        for text in render(report):
            console.print(text, highlight=False, markup=False, soft_wrap=True)
    return exit_code(findings)


def render(report: Mapping[str, Any]) -> list[str]:
    lines = [line(Finding(**c)) for c in report["checks"]]
    return [*lines, f"{report['errors']} error(s), {report['warnings']} warning(s)"]


def line(finding: Finding) -> str:
    text = f"{finding.level.value:<8}{finding.check:<18}{finding.found}"
    return f"{text} -- {finding.todo}" if finding.todo else text


def read_file(path: str) -> Source:
    try:
        return Source(f"file {path}", Path(path).read_text())
    except (OSError, UnicodeDecodeError) as exc:
        raise BadFile(f"--scheduler-config {path}: {exc}") from exc


def _why(exc: ApiError) -> str:
    return {403: "HTTP 403: not allowed", 404: "not found"}.get(exc.status, f"HTTP {exc.status}")


def _attempt(read: Callable[[], T], unreadable: dict[str, str], what: str) -> T | None:
    """`read()`, or None with why in `unreadable[what]` when the API refuses (an unreachable server still raises)."""
    try:
        return read()
    except ApiError as exc:
        unreadable[what] = _why(exc)
        return None


def read_snapshot(api: Api, scheduler_config: Source | None = None) -> Snapshot:
    """What the checks read. A read the API refuses is recorded in `unreadable`, for its check to report."""
    unreadable: dict[str, str] = {}
    hypernodes = _attempt(lambda: api.list_objects(VOLCANO_TOPOLOGY, "hypernodes"), unreadable, "hypernodes") or []
    nodes = _attempt(api.node_labels, unreadable, "nodes") or {}
    schema = _attempt(lambda: api.crd_schema(PODGROUP_CRD), unreadable, "podgroup-crd")
    images: list[tuple[str, str]] = []
    for namespace in (VOLCANO_NAMESPACE, AIBRIX_NAMESPACE):
        for deployment in _attempt(partial(api.list_objects, ("apps", "v1"), "deployments", namespace), unreadable, "deployments") or []:
            pod = ((deployment.get("spec") or {}).get("template") or {}).get("spec") or {}
            where = f"{namespace}/{deployment['metadata']['name']}"
            images += [(where, str(c.get("image", ""))) for c in [*(pod.get("containers") or []), *(pod.get("initContainers") or [])]]
    admission: list[dict[str, Any]] = []
    for plural, kind in (
        ("mutatingwebhookconfigurations", "MutatingWebhookConfiguration"),
        ("validatingwebhookconfigurations", "ValidatingWebhookConfiguration"),
        ("validatingadmissionpolicies", "ValidatingAdmissionPolicy"),
        ("validatingadmissionpolicybindings", "ValidatingAdmissionPolicyBinding"),
    ):
        # Items of a list carry no kind: set it, the checks match by it.
        admission += [{**o, "kind": kind} for o in _attempt(partial(api.list_objects, ADMISSION, plural), unreadable, "admission") or []]
    label_policy = _attempt(lambda: served_label_policy(api), unreadable, "admission")
    if label_policy:
        for plural, kind in (
            ("mutatingadmissionpolicies", "MutatingAdmissionPolicy"),
            ("mutatingadmissionpolicybindings", "MutatingAdmissionPolicyBinding"),
        ):
            listed = _attempt(partial(api.list_objects, (ADMISSION[0], label_policy), plural), unreadable, "admission")
            admission += [{**o, "kind": kind} for o in listed or []]
        if not any(o["kind"] == "MutatingAdmissionPolicy" and o["metadata"]["name"].endswith(LABEL_POLICY) for o in admission):
            label_policy = None  # rendered for an API server without it (or before an upgrade to one): the webhook labels
    leases = _attempt(
        lambda: api.raw_list("/apis/coordination.k8s.io/v1/leases", fieldSelector=f"metadata.name={LEASE_NAME}"), unreadable, "leases"
    )
    services, more = _sample(api, unreadable)
    return Snapshot(
        now=time.time(),
        scheduler_config=scheduler_config or _configmap(api, SCHEDULER_CONFIGMAP, SCHEDULER_CONFIG_KEY, fallback=True),
        controller_config=_configmap(api, CONTROLLER_CONFIGMAP, CONTROLLER_CONFIG_KEY),
        hypernodes=tuple(hypernodes),
        nodes=nodes,
        podgroup_schema=schema,
        images=tuple(images),
        admission=tuple(admission),
        expected_admission=tuple(configuration(b"", label_policy=label_policy)),
        lease_name=LEASE_NAME,
        leases=tuple(leases or ()),
        services=services,
        services_more=more,
        unreadable=unreadable,
    )


def _configmap(api: Api, name: str, key: str, fallback: bool = False) -> Source:
    """A key of a ConfigMap in Volcano's namespace. With `fallback`, a ConfigMap of another name that has the key
    (Volcano's chart names it after its release) when the usual one is not there."""
    where = f"ConfigMap {VOLCANO_NAMESPACE}/{name} key {key}"
    try:
        found = api.get(CORE, "configmaps", VOLCANO_NAMESPACE, name)
        if found is None and fallback:
            others = [c for c in api.list_objects(CORE, "configmaps", VOLCANO_NAMESPACE) if key in (c.get("data") or {})]
            if others:
                found = others[0]
                where = f"ConfigMap {VOLCANO_NAMESPACE}/{found['metadata']['name']} key {key}"
    except ApiError as exc:
        return Source(where, problem=_why(exc))
    if found is None:
        return Source(where, problem="not found")
    text = (found.get("data") or {}).get(key)
    return Source(where, text) if text is not None else Source(where, problem=f"the ConfigMap has no key {key}")


def _stormservices(api: Api) -> Iterator[dict[str, Any]]:
    read = 0
    for page in api.pages(Api.path(AIBRIX, "stormservices")):
        for item in page:
            yield item
            read += 1
            if read >= READ_AT_MOST:
                return


def _sample(api: Api, unreadable: dict[str, str]) -> tuple[tuple[ServiceSample, ...], bool]:
    """At most SAMPLE opted-in StormServices, each with its RoleSets and the PodGroups the check compares;
    True when more may exist (the sample is full, or READ_AT_MOST services were read)."""
    chosen: list[dict[str, Any]] = []
    more = False
    try:
        for count, stormservice in enumerate(_stormservices(api), 1):
            if is_opted_in((stormservice.get("metadata") or {}).get("annotations")):
                if len(chosen) == SAMPLE:
                    more = True
                    break
                chosen.append(stormservice)
            more = count >= READ_AT_MOST
        with ThreadPoolExecutor(max_workers=8) as pool:  # a few hundred small reads: overlap their round trips
            samples = tuple(pool.map(lambda s: _service(api, s), chosen))
    except ApiError as exc:
        unreadable["stormservices"] = f"{exc.request}: {_why(exc)}"
        return (), False
    return samples, more


def _service(api: Api, stormservice: dict[str, Any]) -> ServiceSample:
    meta = stormservice["metadata"]
    namespace, name = meta["namespace"], meta["name"]
    rolesets = api.list_objects(AIBRIX, "rolesets", namespace, label_selector=f"{STORMSERVICE_LABEL}={name}")
    wanted = podgroup_names(stormservice, rolesets)
    replicas = sorted(set(wanted) & {r["metadata"]["name"] for r in rolesets})
    podgroups: dict[str, dict[str, Any]] = {}
    for start in range(0, len(replicas), CHUNK):
        selector = f"{ROLESET_LABEL} in ({','.join(replicas[start : start + CHUNK])})"
        podgroups |= {p["metadata"]["name"]: p for p in api.list_objects(VOLCANO_SCHEDULING, "podgroups", namespace, selector)}
    for group in set(wanted) - set(replicas):  # the service's own PodGroup (scope StormService)
        found = api.get(VOLCANO_SCHEDULING, "podgroups", namespace, group)
        if found is not None:
            podgroups[group] = found
    return ServiceSample(stormservice, tuple(rolesets), podgroups)
