"""Opt-in at O(1) (issue 42, item 1), on the real control plane: a StormService created with a request is held
by the label `stormtopo.io/opted-in` on its role templates (put there inside the API server by a
MutatingAdmissionPolicy where it is served, as here, else by stormtopo's webhook), never by a listing; the
label survives a re-apply that drops it, without a rollout; a service that opts out goes free; one opted in
by an update keeps its templates and is listed instead."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from kubernetes import client
from kubernetes.client.exceptions import ApiException

from stormtopo.core.vocabulary import ADMITTED_LABEL, HIGHEST_TIER, MODE, OPTED_IN_LABEL
from stormtopo.devenv.client import DevCluster
from stormtopo.devenv.workloads import stormservice
from tests.conftest import stormtopo

HARD_LEAF = {MODE: "hard", HIGHEST_TIER: "1"}


def role_labels(svc: dict[str, Any]) -> list[dict[str, str]]:
    return [(r.get("template") or {}).get("metadata", {}).get("labels") or {} for r in svc["spec"]["template"]["spec"]["roles"]]


def test_a_new_opted_in_service_is_labelled_not_listed_and_keeps_the_label_through_a_reapply(cluster: DevCluster, namespace: str) -> None:
    created = cluster.create(stormservice("fresh", namespace, annotations=HARD_LEAF))
    assert all(labels.get(OPTED_IN_LABEL) == "true" for labels in role_labels(created))
    pods = cluster.bound_pods(namespace, "storm-service-name=fresh", 2)
    assert all(p["metadata"]["labels"].get(OPTED_IN_LABEL) == "true" and p["metadata"]["labels"].get(ADMITTED_LABEL) for p in pods)
    first = {p["metadata"]["uid"] for p in pods}
    (roleset,) = cluster.rolesets(namespace, "fresh")

    # A re-apply of the manifest as written (server-side apply drops what the manifest does not say): the label
    # is put back in the same write, so the template does not change and AIBrix rolls nothing.
    manifest = stormservice("fresh", namespace, annotations=HARD_LEAF)
    reapplied = cluster.patch_stormservice(namespace, "fresh", {"spec": {"template": manifest["spec"]["template"]}})
    assert all(labels.get(OPTED_IN_LABEL) == "true" for labels in role_labels(reapplied))
    assert reapplied["metadata"]["generation"] == created["metadata"]["generation"]  # the spec did not change
    assert [r["metadata"]["name"] for r in cluster.rolesets(namespace, "fresh")] == [roleset["metadata"]["name"]]
    assert {p["metadata"]["uid"] for p in cluster.pods(namespace, "storm-service-name=fresh")} == first
    assert f"{namespace}.fresh" not in cluster.opted_in()


def test_a_service_that_opts_out_goes_free_and_one_opted_in_by_an_update_is_listed(cluster: DevCluster, namespace: str) -> None:
    cluster.create(stormservice("leaving", namespace, annotations=HARD_LEAF))
    cluster.bound_pods(namespace, "storm-service-name=leaving", 2)
    cluster.patch_stormservice(
        namespace, "leaving", {"metadata": {"annotations": {MODE: None, HIGHEST_TIER: None}}, "spec": {"replicas": 2}}
    )
    pods = cluster.bound_pods(namespace, "storm-service-name=leaving", 4, timeout=90)
    new = [p for p in pods if OPTED_IN_LABEL not in p["metadata"]["labels"]]
    assert len(new) == 2 and not any(ADMITTED_LABEL in p["metadata"]["labels"] for p in new)  # as if stormtopo were not installed
    assert all(labels.get(OPTED_IN_LABEL) for labels in role_labels(cluster.stormservice(namespace, "leaving")))  # kept: no rollout

    cluster.create(stormservice("joining", namespace))
    cluster.bound_pods(namespace, "storm-service-name=joining", 2)
    joined = cluster.patch_stormservice(namespace, "joining", {"metadata": {"annotations": HARD_LEAF}})
    assert not any(OPTED_IN_LABEL in labels for labels in role_labels(joined))  # a label there would roll every replica
    assert cluster.opted_in().get(f"{namespace}.joining") == "RoleSet"  # listed by the gate before the update was stored

    # Its owner puts the label on its role templates in a rollout of its own: AIBrix updates its replica's RoleSet, and
    # once every RoleSet has the labelled templates the label holds its pods; the list lets it go (install.md).
    roles = joined["spec"]["template"]["spec"]["roles"]
    for role in roles:
        role.setdefault("template", {}).setdefault("metadata", {}).setdefault("labels", {})[OPTED_IN_LABEL] = "true"
    cluster.patch_stormservice(namespace, "joining", {"spec": {"template": {"spec": {"roles": roles}}}})
    cluster.wait(lambda: f"{namespace}.joining" not in cluster.opted_in(), 90, "the service off its namespace's list")
    rolesets = cluster.rolesets(namespace, "joining")
    replicas = [((r.get("template") or {}).get("metadata") or {}).get("labels") or {} for rs in rolesets for r in rs["spec"]["roles"]]
    assert replicas and all(labels.get(OPTED_IN_LABEL) == "true" for labels in replicas)  # (unlisted only then)


def test_of_two_services_whose_roleset_prefix_agrees_neither_is_movable_until_one_goes(
    cluster: DevCluster, cluster_dir: Path, namespace: str
) -> None:
    """Issue 43, item 3: the eviction policy knows a service's pods by "<name>-roleset-" cut to 58 characters;
    a service that asks for healing is marked `+heal` (its pods evictable) only while no other StormService of
    its namespace shares that prefix, and its request's Event says why not."""
    healer = "inference-prod-use1-llama-70b-prefill-decode-disaggregated-a"
    twin = healer[:-1] + "b"
    assert len(healer) == 60 and healer[:58] == twin[:58]
    cluster.create(stormservice(healer, namespace, replicas=0, annotations={**HARD_LEAF, "stormtopo.io/heal": "true"}))
    key = f"{namespace}.{healer}"
    cluster.wait(lambda: cluster.opted_in().get(key) == "RoleSet+heal", 30, "the healing service listed +heal")
    cluster.create(stormservice(twin, namespace, replicas=0))  # never opted in
    # Labelled, so listed only while movable: unlisted.
    cluster.wait(lambda: key not in cluster.opted_in(), 30, "+heal taken off once the twin exists")

    def told() -> bool:
        events = cluster.core.list_namespaced_event(namespace, field_selector=f"involvedObject.name={healer}").items
        return any(e.reason == "InvalidHealAnnotation" and twin in (e.message or "") for e in events)

    cluster.wait(told, 30, "the Event naming the twin")
    dry = stormtopo("heal", f"{namespace}/{healer}", "--dry-run", "--kubeconfig", str(cluster_dir / "kubeconfig"))
    assert f"healing stays off: the RoleSets of StormService '{twin}'" in dry.stdout and "the operator moves nothing" in dry.stdout, (
        dry.stdout
    )
    cluster.delete_stormservice(namespace, twin)
    cluster.wait(lambda: cluster.opted_in().get(key) == "RoleSet+heal", 30, "+heal back once the twin is gone")


def test_the_webhook_labels_what_the_policy_did_not_and_the_gate_refuses_what_nothing_labelled(cluster: DevCluster, namespace: str) -> None:
    """The review's finding: an API server that serves MutatingAdmissionPolicy but does not run it (its feature
    gate off), or has not loaded it yet, would let a new opted-in service in unlabelled, its pods unheld while
    stormtopo is down. The webhook labels what the policy did not; should neither label it, the gate (which sees
    the object once mutated) refuses it, saying what to do; a create that carries the label itself goes."""
    bindings = ("admissionregistration.k8s.io", "v1beta1", "mutatingadmissionpolicybindings")
    binding = cluster.custom.get_cluster_custom_object(*bindings, "stormtopo-opt-in-label")
    hooks = client.AdmissionregistrationV1Api(cluster.api_client)
    mutating = hooks.read_mutating_webhook_configuration("stormtopo")
    cluster.custom.delete_cluster_custom_object(*bindings, "stormtopo-opt-in-label")
    try:

        def created_by_webhook() -> list[dict[str, str]]:
            body = stormservice("by-webhook", namespace, replicas=0, annotations=HARD_LEAF)
            made = cluster.custom.create_namespaced_custom_object(*services_of(namespace), body, dry_run="All")
            return role_labels(made)

        cluster.wait(lambda: all(OPTED_IN_LABEL in labels for labels in created_by_webhook()), 30, "the webhook labelling")
        kept = [h for h in mutating.webhooks if h.name != "opt-in.stormservices.stormtopo.io"]
        hooks.patch_mutating_webhook_configuration(
            "stormtopo", [{"op": "replace", "path": "/webhooks", "value": cluster.api_client.sanitize_for_serialization(kept)}]
        )

        def refused() -> str:
            try:
                body = stormservice("unheld", namespace, replicas=0, annotations=HARD_LEAF)
                cluster.custom.create_namespaced_custom_object(*services_of(namespace), body, dry_run="All")
            except ApiException as exc:
                return str(exc.body)
            return ""  # the API server has not seen the webhook go yet

        message = cluster.wait(refused, 30, "the create refused")
        assert OPTED_IN_LABEL in message and "feature gate" in message
        body = stormservice("self-labelled", namespace, replicas=0, annotations=HARD_LEAF)
        for role in body["spec"]["template"]["spec"]["roles"]:
            role["template"]["metadata"]["labels"][OPTED_IN_LABEL] = "true"
        assert role_labels(cluster.create(body))[0][OPTED_IN_LABEL] == "true"
    finally:
        hooks.patch_mutating_webhook_configuration(
            "stormtopo", [{"op": "replace", "path": "/webhooks", "value": cluster.api_client.sanitize_for_serialization(mutating.webhooks)}]
        )
        binding["metadata"] = {"name": binding["metadata"]["name"], "labels": binding["metadata"].get("labels") or {}}
        cluster.custom.create_cluster_custom_object(*bindings, binding)


def services_of(namespace: str) -> tuple[str, str, str, str]:
    return ("orchestration.aibrix.ai", "v1alpha1", namespace, "stormservices")
