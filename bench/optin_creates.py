"""Opt-in at scale (issue 42, items 1 and 2): what creating a StormService that asks for a topology costs
beside creating a plain one, with nothing opted in yet and again after many more are opted in.

On one local control plane with the operator (a new opted-in StormService's role templates are labelled by a
MutatingAdmissionPolicy, which the local control plane serves, or else stormtopo's webhook; once that is in
force), CLIENTS threads create ROUND opted-in StormServices and ROUND plain ones
(`replicas: 0`: nothing for AIBrix to place), each round in a namespace of its own; then `--background`
more are opted in, spread over `--namespaces` namespaces (the teams of a shared cluster), and the rounds run
again. Reported: each round's seconds, the opted-in/plain ratio at both sizes (the median of alternating pairs), creates refused, and etcd's
database growth per opted-in create. The anchor of every ratio is the plain round of the same moment.
With `--change update`, a round opts ROUND plain StormServices in by an update (listed in their namespace's
opted-in list, as the gate lists them) against ROUND plain updates; with `--change heal`, it turns healing on for
ROUND opted-in ones (listed as healing) against ROUND plain updates of the same.
"""

from __future__ import annotations

import json
import statistics
import tempfile
import time
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from kubernetes.client.exceptions import ApiException

from stormtopo.core.optin import LABEL_POLICY
from stormtopo.core.vocabulary import AIBRIX, HEAL_ANNOTATION, HIGHEST_TIER, MODE, OPTED_IN_LABEL
from stormtopo.devenv import cluster
from stormtopo.devenv.client import DevCluster
from stormtopo.devenv.workloads import stormservice

CLIENTS = 8
ROUND = 300
HARD = {MODE: "hard", HIGHEST_TIER: "1"}


def etcd_db_bytes(admin: DevCluster) -> int:
    port = json.loads((admin.state_dir / "cluster.json").read_text())["ports"]["etcd"]
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as answer:
        metrics = answer.read().decode()
    return next(int(float(line.split()[-1])) for line in metrics.splitlines() if line.startswith("etcd_mvcc_db_total_size_in_bytes "))


def create_all(admin: DevCluster, names: list[tuple[str, str]], opted_in: bool) -> tuple[float, int]:
    """Create each (namespace, name) from CLIENTS threads; (seconds, creates refused)."""
    refused = [0]

    def create(where: tuple[str, str]) -> None:
        namespace, name = where
        body = stormservice(name, namespace, replicas=0, annotations=HARD if opted_in else None)
        try:
            admin.create(body)
        except ApiException as exc:
            if exc.status != 409:
                refused[0] += 1

    started = time.monotonic()
    with ThreadPoolExecutor(CLIENTS) as pool:
        list(pool.map(create, names))
    return time.monotonic() - started, refused[0]


CHANGES = ("create", "update", "heal")  # what a round times: creates; opt-ins by update of plain services; heal turned on
PLAIN_CHANGE = {"example.com/owner": "team-a"}  # the plain round's update: an annotation stormtopo never reads


def patch_all(admin: DevCluster, names: list[tuple[str, str]], annotations: dict[str, str]) -> tuple[float, int]:
    """Merge these annotations into each (namespace, name) from CLIENTS threads; (seconds, updates refused)."""
    refused = [0]

    def patch(where: tuple[str, str]) -> None:
        try:
            admin.custom.patch_namespaced_custom_object(
                *AIBRIX, where[0], "stormservices", where[1], {"metadata": {"annotations": annotations}}
            )
        except ApiException:
            refused[0] += 1

    started = time.monotonic()
    with ThreadPoolExecutor(CLIENTS) as pool:
        list(pool.map(patch, names))
    return time.monotonic() - started, refused[0]


def timed_round(admin: DevCluster, namespace: str, change: str, opted_in: bool) -> tuple[float, int]:
    """One round of ROUND changes in `namespace`: creates (opted in or plain); or, over ROUND StormServices made first
    (untimed: plain ones for "update", opted-in ones for "heal"), the change itself against a plain update."""
    names = [(namespace, f"svc-{i:05d}") for i in range(ROUND)]
    if change == "create":
        return create_all(admin, names, opted_in)
    create_all(admin, names, change == "heal")
    asked = (HARD if change == "update" else {HEAL_ANNOTATION: "true"}) if opted_in else PLAIN_CHANGE
    return patch_all(admin, names, asked)


def labelling_in_force(admin: DevCluster, timeout: float = 60.0) -> float:
    """Seconds until the API server labels a new opted-in StormService's role templates (a dry-run create):
    a policy or webhook just registered takes a moment to reach its admission chain, and creates meanwhile
    go unlabelled (the reconciler lists them after). The rounds measure what comes after."""
    started = time.monotonic()
    admin.create_namespace("probe")
    while True:
        body = stormservice("probe", "probe", replicas=0, annotations=HARD)
        made = admin.custom.create_namespaced_custom_object(*AIBRIX, "probe", "stormservices", body, dry_run="All")
        if all(OPTED_IN_LABEL in (r["template"]["metadata"].get("labels") or {}) for r in made["spec"]["template"]["spec"]["roles"]):
            return time.monotonic() - started
        if time.monotonic() - started > timeout:
            raise TimeoutError(f"new opted-in StormServices still unlabelled after {timeout:.0f} s")
        time.sleep(0.1)


PAIRS = 9  # an opted-in round and a plain one, in alternating order: the machine drifts between rounds


def rounds(admin: DevCluster, label: str, change: str = "create") -> dict[str, Any]:
    """PAIRS pairs of ROUND opted-in changes and ROUND plain ones (timed_round), each round in a fresh namespace, the
    order alternating (opted-in first, then plain first, ...); the ratio is the median of the pairs' ratios."""
    pairs: list[dict[str, Any]] = []
    for pair in range(PAIRS):
        out: dict[str, Any] = {}
        kinds = (("opted_in", True), ("plain", False))
        for kind, opted_in in kinds if pair % 2 == 0 else reversed(kinds):
            namespace = f"round-{label}-{pair}-{kind.replace('_', '-')}"
            admin.create_namespace(namespace)
            before = etcd_db_bytes(admin)
            seconds, refused = timed_round(admin, namespace, change, opted_in)
            out[kind] = {"seconds": round(seconds, 2), "refused": refused, "etcd_db_growth_bytes": etcd_db_bytes(admin) - before}
            if change != "create":  # (its growth counts the untimed creates too: read the pairs' difference)
                out[kind]["listed_in_namespace"] = sum(1 for key in admin.opted_in() if key.startswith(f"{namespace}."))
        out["ratio"] = round(out["opted_in"]["seconds"] / out["plain"]["seconds"], 3)
        pairs.append(out)
    middle = sorted(pairs, key=lambda p: p["ratio"])[PAIRS // 2]
    return {
        "pairs": pairs,
        "ratio": middle["ratio"],
        "opted_in": middle["opted_in"],
        "plain": middle["plain"],
        "refused": sum(p[k]["refused"] for p in pairs for k in ("opted_in", "plain")),
        "etcd_growth_per_opted_in_create_bytes": round(statistics.median(p["opted_in"]["etcd_db_growth_bytes"] for p in pairs) / ROUND),
        "etcd_growth_per_plain_create_bytes": round(statistics.median(p["plain"]["etcd_db_growth_bytes"] for p in pairs) / ROUND),
    }


def run(background: int = 10_000, namespaces: int = 100, labelled_by: str = "policy", change: str = "create") -> dict[str, Any]:
    state = Path(tempfile.mkdtemp(prefix="stormtopo-bench-optin-"))
    cluster.up(state, timeout=300)
    try:
        admin = DevCluster(state)
        if labelled_by == "webhook":  # as on an API server without MutatingAdmissionPolicy: the webhook labels
            bindings = ("admissionregistration.k8s.io", "v1beta1", "mutatingadmissionpolicybindings")
            admin.custom.delete_cluster_custom_object(*bindings, LABEL_POLICY)
            time.sleep(2)  # the API server drops it from its chain: both label the same, the webhook after
        in_force = labelling_in_force(admin)
        empty = rounds(admin, "empty", change)
        print(f"  nothing opted in: opted-in {empty['opted_in']['seconds']} s, plain {empty['plain']['seconds']} s", flush=True)
        spread = [f"team-{i:03d}" for i in range(namespaces)]
        for namespace in spread:
            admin.create_namespace(namespace)
        started = time.monotonic()
        seconds, refused = create_all(admin, [(spread[i % namespaces], f"bg-{i:05d}") for i in range(background)], True)
        print(f"  {background} more opted in over {namespaces} namespaces in {seconds:.0f} s ({refused} refused)", flush=True)
        listed = len(admin.opted_in())
        full = rounds(admin, "full", change)
        print(f"  after them: opted-in {full['opted_in']['seconds']} s, plain {full['plain']['seconds']} s", flush=True)
        return {
            "round": ROUND,
            "change": change,
            "labelled_by": labelled_by,
            "labelling_in_force_seconds": round(in_force, 2),
            "clients": CLIENTS,
            "background": {"opted_in": background, "namespaces": namespaces, "seconds": round(seconds, 1), "refused": refused},
            "listed_after_background": listed,
            "empty": empty,
            "full": full,
            "ratio_empty": empty["ratio"],
            "ratio_full": full["ratio"],
            "background_wall_seconds": round(time.monotonic() - started, 1),
        }
    finally:
        cluster.down(state)
