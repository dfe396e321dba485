"""`stormtopo release-held`: free every pod held at stormtopo's scheduling gate, as they are.

While stormtopo runs, it releases a held pod (a role that asks for no resources, under a hard
request) into its replica's domain once the replica's other pods are bound. After `helm uninstall`,
or a rollback to a release without stormtopo, nobody would: their pods would stay SchedulingGated.
"""

from __future__ import annotations

from collections.abc import Callable

from stormtopo.core.uninstall import release_gates
from stormtopo.core.vocabulary import ADMITTED_LABEL
from stormtopo.kube.client import Api, KubeError


def run(api: Api, namespace: str | None, dry_run: bool, say: Callable[[str], None]) -> int:
    """Returns 1 if a held pod could not be released (each is named; the others are still released)."""
    if api.get(("admissionregistration.k8s.io", "v1"), "mutatingwebhookconfigurations", None, "stormtopo") is not None:
        say("note: stormtopo's webhook is still installed; pods released now leave without their replica's domain")
    path = f"/api/v1/namespaces/{namespace}/pods" if namespace else "/api/v1/pods"
    pods = [pod for page in api.pages(path, labelSelector=ADMITTED_LABEL) for pod in page]
    failed = 0
    releases = release_gates(pods)
    for release in releases:  # every gate of stormtopo's goes, nothing else changes
        where = f"{release.namespace}/{release.name}"
        if dry_run:
            say(f"would release {where}")
            continue
        try:
            api.patch_pod(release.namespace, release.name, [dict(op) for op in release.ops])
            say(f"released {where}")
        except KubeError as exc:  # gone, released meanwhile (its test op fails), or refused: the others go on
            failed += 1
            say(f"could not release {where}: {exc}")
    say(f"{len(releases)} pod(s) held at stormtopo's gate{' (dry run: nothing changed)' if dry_run else ''}")
    return 1 if failed else 0
