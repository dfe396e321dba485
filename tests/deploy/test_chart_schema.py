"""The chart as users expect (issue 22, in part): `helm lint --strict` passes, and values.schema.json
refuses a bad value or a misspelt key with a message naming it, before anything is rendered."""

from __future__ import annotations

import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

from stormtopo.devenv import components
from tests.conftest import CHART_IMAGE

CHART = Path(__file__).resolve().parents[2] / "deploy" / "helm" / "stormtopo"


def helm(*args: str, image: bool = True) -> subprocess.CompletedProcess[str]:
    """helm, with the chart's one required value set (`image`) as the docs set it."""
    sets = ["--set", CHART_IMAGE] if image else []
    return subprocess.run([str(components.ensure_binary("helm")), *args, *sets], capture_output=True, text=True, timeout=120)


@pytest.mark.parametrize("sets", [[], ["--set", "monitoring.enabled=true"], ["--set", "nodeTier.enabled=true"]])
def test_the_chart_lints_strictly(sets: list[str]) -> None:
    linted = helm("lint", "--strict", str(CHART), *sets)
    assert linted.returncode == 0, linted.stdout + linted.stderr


@pytest.mark.parametrize(
    ("value", "named"),
    [
        ("replicaCount=two", "/replicaCount"),
        ("webhook.port=99999", "/webhook/port"),
        ("image.pullPolicy=Sometimes", "/image/pullPolicy"),
        ("webhok.port=9443", "'webhok' not allowed"),
        ("networkPolicy.enabled=yes-please", "/networkPolicy/enabled"),
        ("healing.cooldownSeconds=0", "/healing/cooldownSeconds"),
        ("monitoring.enabled=yes-please", "/monitoring/enabled"),
        ("nodeTier.enabled=yes-please", "/nodeTier/enabled"),
        ("monitoring.alerts.noLeader.for=2 minutes", "/monitoring/alerts/noLeader/for"),
        ("monitoring.alerts.workQueueBacklog.depth=-1", "/monitoring/alerts/workQueueBacklog/depth"),
        ("monitoring.alerts.admissionSlow.p99=1", "'p99' not allowed"),
        ("volcano.schedulerConfigMap=volcano-scheduler-configmap", "/volcano/schedulerConfigMap"),
        ("preemption.exact.fewest=jobs", "/preemption/exact/fewest"),
        ("preemption.narrowSoft=sometimes", "/preemption/narrowSoft"),
    ],
)
def test_a_bad_value_is_refused_naming_it(value: str, named: str) -> None:
    refused = helm("template", "x", str(CHART), "--kube-version", "1.35.3", "--set", value)
    assert refused.returncode != 0 and named in refused.stderr, refused.stderr


def test_the_node_tier_is_off_by_default_and_creates_hypernodes_only_when_enabled() -> None:
    """Off, it may still patch leaves and delete its own tier-0 HyperNodes: turned off (and at uninstall)
    every leaf gets its nodes back (issue 33). The admission policy node-tier-only limits both."""

    def render(*sets: str) -> tuple[list[str], set[str]]:
        done = helm("template", "x", str(CHART), "--kube-version", "1.35.3", *sets)
        assert done.returncode == 0, done.stderr
        objects = [o for o in yaml.safe_load_all(done.stdout) if o]
        (deployment,) = [o for o in objects if o["kind"] == "Deployment"]
        (role,) = [o for o in objects if o["kind"] == "ClusterRole" and o["metadata"]["name"] == "x-stormtopo"]
        verbs = {v for rule in role["rules"] if "hypernodes" in rule["resources"] for v in rule["verbs"]}
        return deployment["spec"]["template"]["spec"]["containers"][0]["args"], verbs

    args, verbs = render()
    assert "--node-tier" not in args and verbs == {"get", "list", "watch", "patch", "delete"}
    args, verbs = render("--set", "nodeTier.enabled=true")
    assert "--node-tier" in args and verbs == {"get", "list", "watch", "create", "patch", "delete"}
    args, _ = render("--set", "nodeTier.enabled=true", "--set", "nodeTier.leaves={rack-a,rack-b}")
    assert "--node-tier-leaf=rack-a" in args and "--node-tier-leaf=rack-b" in args
    assert "--node-tier-keep-runs" not in args
    args, _ = render("--set", "nodeTier.enabled=true", "--set", "nodeTier.keepRuns=true")
    assert "--node-tier" in args and "--node-tier-keep-runs" in args


def test_every_list_the_operator_follows_by_watch_is_granted_watch() -> None:
    """The free-room reading (operator/room.py) and the operator's own streams list, then watch: a
    ClusterRole granting list alone froze the reading at its first list (review of issue 33, item 5)."""
    done = helm("template", "x", str(CHART), "--kube-version", "1.35.3")
    assert done.returncode == 0, done.stderr
    (role,) = [o for o in yaml.safe_load_all(done.stdout) if o and o["kind"] == "ClusterRole" and o["metadata"]["name"] == "x-stormtopo"]
    for resource in ("pods", "nodes", "hypernodes", "podgroups"):
        verbs = {v for rule in role["rules"] if resource in rule["resources"] for v in rule["verbs"]}
        assert {"list", "watch"} <= verbs, (resource, verbs)


def test_the_chart_refuses_a_kubernetes_without_the_admission_policies_it_installs() -> None:
    """Issue 45, item 1: the chart's ValidatingAdmissionPolicies are admissionregistration.k8s.io/v1, GA in
    Kubernetes 1.30: Helm refuses an older cluster up front, rather than install and fail at the apply."""
    old = helm("template", "x", str(CHART), "--kube-version", "1.29.9")
    assert old.returncode != 0 and "kubeVersion" in old.stderr and "1.30" in old.stderr, old.stderr
    assert helm("template", "x", str(CHART), "--kube-version", "1.30.0").returncode == 0


def test_the_uninstall_job_has_resources_and_ends_before_helms_default_timeout() -> None:
    """Issue 43, item 5: the hook's Job sets its resources (it reads a page at a time: bench/uninstall.py) and
    its deadline is under Helm's default 5-minute --timeout, so Helm reports its failure; both can be set."""

    def job(*sets: str) -> dict[str, Any]:
        done = helm("template", "x", str(CHART), "--kube-version", "1.35.3", *sets)
        assert done.returncode == 0, done.stderr
        return next(d for d in yaml.safe_load_all(done.stdout) if d and d["kind"] == "Job")

    default = job()
    assert default["spec"]["activeDeadlineSeconds"] < 300
    [container] = default["spec"]["template"]["spec"]["containers"]
    assert container["resources"] == {"requests": {"cpu": "50m", "memory": "64Mi"}, "limits": {"memory": "128Mi"}}
    longer = job("--set", "uninstallHook.activeDeadlineSeconds=840", "--set", "uninstallHook.resources.limits.memory=256Mi")
    assert longer["spec"]["activeDeadlineSeconds"] == 840
    assert longer["spec"]["template"]["spec"]["containers"][0]["resources"]["limits"] == {"memory": "256Mi"}
    refused = helm("template", "x", str(CHART), "--kube-version", "1.35.3", "--set", "uninstallHook.activeDeadlineSeconds=5")
    assert refused.returncode != 0 and "activeDeadlineSeconds" in refused.stderr


def test_without_an_image_the_chart_refuses_to_render_and_says_what_to_set() -> None:
    """Nothing publishes an image of stormtopo: a default would install one that cannot be pulled (and its
    fail-closed webhooks would refuse every opted-in create). helm install renders as template does."""
    refused = helm("template", "x", str(CHART), "--kube-version", "1.35.3", image=False)
    assert refused.returncode != 0, refused.stdout
    said = refused.stdout + refused.stderr
    assert "image.repository is not set" in said and "--set image.repository=REGISTRY/stormtopo" in said, said
    assert "docs/install.md" in said
    done = helm("template", "x", str(CHART), "--kube-version", "1.35.3", "--show-only", "templates/deployment.yaml")
    assert done.returncode == 0, done.stderr
    (deployment,) = [d for d in yaml.safe_load_all(done.stdout) if d]
    image = deployment["spec"]["template"]["spec"]["containers"][0]["image"]
    chart_version = yaml.safe_load((CHART / "Chart.yaml").read_text())["appVersion"]
    assert image == f"registry.example.com/stormtopo:{chart_version}"


def test_more_than_one_replica_without_leader_election_is_refused() -> None:
    """Without a Lease every replica would reconcile, heal and evict at once."""
    refused = helm("template", "x", str(CHART), "--kube-version", "1.35.3", "--set", "leaderElection.enabled=false")
    assert refused.returncode != 0 and "replicaCount above 1 needs leaderElection.enabled: true" in refused.stderr, refused.stderr
    one = helm("template", "x", str(CHART), "--kube-version", "1.35.3", "--set", "leaderElection.enabled=false", "--set", "replicaCount=1")
    assert one.returncode == 0, one.stderr


def test_volcanos_scheduler_configuration_is_read_by_name_only_or_not_at_all() -> None:
    """volcano.schedulerConfigMap: `get` of ConfigMaps of that one name (a ClusterRole: Volcano's namespace need
    not exist at install), and the operator told where it is; empty, neither (it reads nothing)."""

    def render(*sets: str) -> tuple[list[str], list[dict[str, Any]]]:
        done = helm("template", "x", str(CHART), "--kube-version", "1.35.3", *sets)
        assert done.returncode == 0, done.stderr
        objects = [o for o in yaml.safe_load_all(done.stdout) if o]
        (deployment,) = [o for o in objects if o["kind"] == "Deployment"]
        roles = [o for o in objects if o["metadata"]["name"] == "x-stormtopo-volcano-scheduler-conf"]
        return deployment["spec"]["template"]["spec"]["containers"][0]["args"], roles

    args, objects = render()
    assert "--volcano-scheduler-configmap=volcano-system/volcano-scheduler-configmap" in args
    (role,) = [o for o in objects if o["kind"] == "ClusterRole"]
    assert role["rules"] == [
        {"apiGroups": [""], "resources": ["configmaps"], "resourceNames": ["volcano-scheduler-configmap"], "verbs": ["get"]}
    ]
    (binding,) = [o for o in objects if o["kind"] == "ClusterRoleBinding"]
    assert binding["subjects"][0]["name"] == "x-stormtopo" and binding["roleRef"]["name"] == role["metadata"]["name"]
    args, objects = render("--set", "volcano.schedulerConfigMap=batch-sched/vc-conf")
    assert "--volcano-scheduler-configmap=batch-sched/vc-conf" in args
    assert [o["rules"][0]["resourceNames"] for o in objects if o["kind"] == "ClusterRole"] == [["vc-conf"]]
    args, objects = render("--set", "volcano.schedulerConfigMap=")
    assert "--volcano-scheduler-configmap=" in args and not objects
    # Values without the key (an upgrade with --reuse-values keeps the older release's): its default.
    args, objects = render("--set", "volcano=null")
    assert "--volcano-scheduler-configmap=volcano-system/volcano-scheduler-configmap" in args and len(objects) == 2


def test_exact_preemption_takes_what_it_minimises_first_from_its_value() -> None:
    def args(*sets: str) -> list[str]:
        on = ("--set", "preemption.exact.enabled=true", "--set", "preemption.exact.victimNamespaces={batch}")
        done = helm("template", "x", str(CHART), "--kube-version", "1.35.3", *on, *sets)
        assert done.returncode == 0, done.stderr
        (deployment,) = [o for o in yaml.safe_load_all(done.stdout) if o and o["kind"] == "Deployment"]
        return list(deployment["spec"]["template"]["spec"]["containers"][0]["args"])

    assert "--exact-preemption-fewest=pods" in args()  # the default: the fewest jobs disrupted
    assert "--exact-preemption-fewest=gpus" in args("--set", "preemption.exact.fewest=gpus")
    # Values without the key (an upgrade with --reuse-values keeps the older release's): the default, never "".
    assert "--exact-preemption-fewest=pods" in args("--set", "preemption.exact.fewest=null")


def test_soft_replicas_are_narrowed_unless_turned_off() -> None:
    def args(*sets: str) -> list[str]:
        done = helm("template", "x", str(CHART), "--kube-version", "1.35.3", *sets)
        assert done.returncode == 0, done.stderr
        (deployment,) = [o for o in yaml.safe_load_all(done.stdout) if o and o["kind"] == "Deployment"]
        return list(deployment["spec"]["template"]["spec"]["containers"][0]["args"])

    assert "--no-narrow-soft-preemption" not in args()  # on: the operator's default
    assert "--no-narrow-soft-preemption" in args("--set", "preemption.narrowSoft=false")
    # Values without the key (an upgrade with --reuse-values keeps the older release's): the default, on.
    assert "--no-narrow-soft-preemption" not in args("--set", "preemption.narrowSoft=null")
