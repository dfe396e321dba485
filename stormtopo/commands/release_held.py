"""`stormtopo release-held`: free every pod held at stormtopo's scheduling gate, as they are.

While stormtopo runs, it releases a held pod (a role that asks for no resources, under a hard
request) into its replica's domain once the replica's other pods are bound. After `helm uninstall`,
or a rollback to a release without stormtopo, nobody would: their pods would stay SchedulingGated.
The chart runs this as a pre-delete hook; run it by hand after any other removal.
"""

from __future__ import annotations

from collections.abc import Callable

from stormtopo.core.placement import EMPTY_TOPOLOGY, is_held, plan_release
from stormtopo.core.vocabulary import ADMITTED_LABEL
from stormtopo.kube.client import Api


def run(api: Api, namespace: str | None, dry_run: bool, say: Callable[[str], None]) -> int:
    path = f"/api/v1/namespaces/{namespace}/pods" if namespace else "/api/v1/pods"
    held = [pod for page in api.pages(path, labelSelector=ADMITTED_LABEL) for pod in page if is_held(pod)]
    for release in plan_release(EMPTY_TOPOLOGY, [], 0, held):  # no domain: the gate goes, nothing else changes
        if not dry_run:
            api.patch_pod(release.namespace, release.name, [dict(op) for op in release.ops])
        say(f"{'would release' if dry_run else 'released'} {release.namespace}/{release.name}")
    say(f"{len(held)} pod(s) held at stormtopo's gate{' (dry run: nothing changed)' if dry_run else ''}")
    return 0
