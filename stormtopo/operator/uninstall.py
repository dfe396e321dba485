"""Leaving the cluster as it was: `python -m stormtopo.operator.uninstall`, the
chart's pre-delete hook (and `stormtopo uninstall` without the chart).

In order: the operator stopped (with --stop-deployment, the chart's Deployment scaled to zero and its
pods waited out: a running leader would gate pods and write HyperNodes again), every namespace's
opted-in list deleted and (with --labelled-pods-binding, the chart's hook) the binding of the policy that
holds labelled pods (either would otherwise refuse the pods of opted-in StormServices until Helm deletes
the policies), then what core/uninstall.py plans: gates removed, moves' holds let go, the node tier's
HyperNodes put back. With --delete-webhooks (the operator registered them itself, without the chart)
its webhook configurations and admission policy go first. Every step is idempotent: run it again after
a failure and it does what is left."""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import logging
import sys
import time
from collections.abc import Iterator
from typing import Any

from stormtopo.core.capabilities import cluster_tiers
from stormtopo.core.request import ClusterTiers
from stormtopo.core.uninstall import ClusterPages, plan_uninstall_in_pages
from stormtopo.core.vocabulary import ADMITTED_LABEL, AIBRIX, PODGROUP_CRD, VOLCANO_SCHEDULING, VOLCANO_TOPOLOGY
from stormtopo.core.writes import CreateHyperNode, DeleteHyperNode, SetHyperNodeMembers
from stormtopo.kube.client import MERGE_PATCH, Api, KubeError, NotFound
from stormtopo.operator import webhook
from stormtopo.operator.optin import every_list, list_path
from stormtopo.operator.writer import HyperNodeWritesRefused, execute, execute_hypernode_writes

log = logging.getLogger("stormtopo.uninstall")
STOP_TIMEOUT = 120.0  # seconds to wait for the operator's pods to end


def _pages(api: Api, group: tuple[str, str], plural: str, selector: str = "") -> Iterator[list[dict[str, Any]]]:
    """A cluster-wide list a page at a time, read as the planner asks for it; a CRD not installed: nothing
    of it to undo."""
    try:
        yield from api.pages(api.path(group, plural), **({"labelSelector": selector} if selector else {}))
    except NotFound:
        return


def cluster_pages(api: Api) -> ClusterPages:
    """What one pass plans over: the HyperNodes read now, every other list read page by page as planned."""
    hypernodes = tuple(h for page in _pages(api, VOLCANO_TOPOLOGY, "hypernodes") for h in page)
    tiers: ClusterTiers = cluster_tiers(list(hypernodes), api.crd_schema(PODGROUP_CRD) or {})
    return ClusterPages(
        hypernodes=hypernodes,
        pods=_pages(api, ("", "v1"), "pods", f"{ADMITTED_LABEL}=true"),
        stormservices=_pages(api, AIBRIX, "stormservices"),
        rolesets=_pages(api, AIBRIX, "rolesets"),
        podgroups=_pages(api, VOLCANO_SCHEDULING, "podgroups"),
        tiers=tiers,
    )


def stop_deployment(api: Api, namespace: str, name: str, timeout: float = STOP_TIMEOUT) -> None:
    """Scale the operator's Deployment to zero and wait until none of its pods is left."""
    deployment = api.get(("apps", "v1"), "deployments", namespace, name)
    if deployment is None:
        return  # gone already
    api.request("PATCH", api.path(("apps", "v1"), "deployments", namespace, name) + "/scale", {"spec": {"replicas": 0}}, MERGE_PATCH)
    labels = (deployment["spec"].get("selector") or {}).get("matchLabels") or {}
    selector = ",".join(f"{k}={v}" for k, v in sorted(labels.items()))
    deadline = time.monotonic() + timeout

    def operators() -> list[dict[str, Any]]:
        # The Deployment's own pods (a ReplicaSet's), never the pod this runs in, whatever its labels.
        pods = api.list_objects(("", "v1"), "pods", namespace, selector)
        return [p for p in pods if any(o.get("kind") == "ReplicaSet" for o in p["metadata"].get("ownerReferences") or [])]

    while operators():
        if time.monotonic() > deadline:
            raise TimeoutError(f"the operator's pods ({selector}) in {namespace} did not end within {timeout:.0f} s")
        time.sleep(1.0)


def delete_opted_in_lists(api: Api) -> None:
    """Every namespace's opted-in list, and the one an older stormtopo kept in the namespace it ran in."""
    for listed in every_list(api):
        with contextlib.suppress(NotFound):
            api.request("DELETE", list_path(str(listed["metadata"]["namespace"])))


PASSES = 5  # looks at the cluster, each over a fresh snapshot, before the uninstall gives up


async def undo(api: Api) -> tuple[int, list[str]]:
    """Plan over the cluster, a page at a time, and carry out each page's writes, every write tried whatever
    the others do; (writes planned, what failed)."""
    planned, failed = 0, []
    for batch in plan_uninstall_in_pages(cluster_pages(api)):
        planned += len(batch)
        hypernode_writes = [w for w in batch if isinstance(w, CreateHyperNode | SetHyperNodeMembers | DeleteHyperNode)]
        for write in (w for w in batch if w not in hypernode_writes):
            try:
                await execute(api, [write])
            except (KubeError, OSError) as exc:
                failed.append(f"{type(write).__name__} {getattr(write, 'namespace', '')}/{getattr(write, 'name', '')}: {exc}"[:400])
        try:
            await execute_hypernode_writes(api, hypernode_writes)
        except HyperNodeWritesRefused as exc:
            failed.append(str(exc))
    return planned, failed


async def undo_all(api: Api, passes: int = PASSES) -> int:
    """Until a pass plans nothing (what changed while a pass ran: a pod gated just before the webhook
    went, a leaf another writer rewrote), at most `passes` times; the writes carried out."""
    done, failed = 0, list[str]()
    for _ in range(passes):
        count, failed = await undo(api)
        if count == 0:
            return done
        done += count - len(failed)
    left = [w for batch in plan_uninstall_in_pages(cluster_pages(api)) for w in batch[:1]]
    if left:
        raise RuntimeError(f"writes still planned after {passes} passes (the first: {left[0]}); {'; '.join(failed)[:600]}")
    return done


def release_labelled_pods(api: Api, binding: str) -> None:
    """Delete the binding of the policy that holds pods carrying the opt-in label: once the operator is
    stopped, nothing admits them, and their role templates keep the label (taking it off rolls replicas)."""
    with contextlib.suppress(NotFound):
        api.request("DELETE", f"/apis/admissionregistration.k8s.io/v1/validatingadmissionpolicybindings/{binding}")


def run(api: Api, stop: str | None = None, delete_webhooks: bool = False, labelled_pods_binding: str | None = None) -> int:
    """The whole uninstall; 0 when nothing of stormtopo's that changes scheduling is left."""
    try:
        if stop:
            deployment_namespace, _, name = stop.partition("/")
            stop_deployment(api, deployment_namespace, name)
        if delete_webhooks:
            webhook.unregister(api, webhook.configuration(b"", url_base="https://unused", label_policy=webhook.served_label_policy(api)))
        delete_opted_in_lists(api)
        if labelled_pods_binding:
            release_labelled_pods(api, labelled_pods_binding)
        done = asyncio.run(undo_all(api))
    except (KubeError, OSError, TimeoutError, RuntimeError) as exc:
        print(f"stormtopo uninstall: {exc}; run it again to finish: it does only what is left", file=sys.stderr)
        return 1
    print(f"stormtopo uninstall: {done} writes; no gate, hold or node-tier HyperNode of stormtopo's is left")
    return 0


def main(argv: list[str] | None = None) -> int:
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    p = argparse.ArgumentParser(prog="python -m stormtopo.operator.uninstall", description=(__doc__ or "").split("\n\n")[0])
    p.add_argument("--kubeconfig", help="kubeconfig file; in-cluster configuration when omitted")
    add_arguments(p)
    a = p.parse_args(argv)
    if a.stop_deployment and "/" not in a.stop_deployment:
        p.error(f"--stop-deployment {a.stop_deployment!r}: accepted: NAMESPACE/NAME")
    return run(Api(a.kubeconfig), a.stop_deployment, a.delete_webhooks, a.labelled_pods_binding)


def add_arguments(p: argparse.ArgumentParser) -> None:
    """The options `stormtopo uninstall` and the chart's hook share."""
    p.add_argument(
        "--stop-deployment", metavar="NAMESPACE/NAME", help="scale the operator's Deployment to zero first and wait for its pods to end"
    )
    p.add_argument(
        "--namespace",
        default="default",
        help="ignored: each namespace's opted-in list is found by its name (kept so that existing scripts run)",
    )
    p.add_argument(
        "--delete-webhooks",
        action="store_true",
        help="also delete the webhook configurations and admission policies the operator registered itself (run without the chart)",
    )
    p.add_argument(
        "--labelled-pods-binding",
        metavar="NAME",
        help="also delete this ValidatingAdmissionPolicyBinding: the chart's <release>-stormtopo-labelled-pods (its hook passes it)",
    )


if __name__ == "__main__":
    sys.exit(main())
