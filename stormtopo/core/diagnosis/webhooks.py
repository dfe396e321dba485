"""stormtopo's admission objects, as operator/webhook.py registers them: its webhook configurations (with a
caBundle and the failurePolicy it wants) and admission policies with their bindings, each registered once."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from stormtopo.core.diagnosis.findings import Finding, Level, _names
from stormtopo.core.diagnosis.snapshot import Snapshot
from stormtopo.core.optin import LABEL_POLICY, LABELLED_PODS_POLICY, PODGROUPS_POLICY, PODS_POLICY

# Why each admission object matters, by its kind (webhook configurations) or name (policies).
_CONSEQUENCE = {
    "MutatingWebhookConfiguration": "opted-in pods and PodGroups get no task, gang or networkTopology at admission, and a new "
    "opted-in StormService's role templates no opt-in label",
    "ValidatingWebhookConfiguration": "a StormService opted in by an update is not listed before its new pods come, so they are not "
    "held while stormtopo is down",
    LABELLED_PODS_POLICY: "pods of StormServices created opted in are not held while stormtopo is down, and may be placed unconstrained",
    PODS_POLICY: "pods of StormServices opted in by an update are not held while stormtopo is down, and may be placed unconstrained",
    LABEL_POLICY: "a new opted-in StormService's role templates get no opt-in label, so its pods are not held while stormtopo is "
    "down until the operator lists it",
    PODGROUPS_POLICY: "an update may strip networkTopology from a constrained PodGroup while stormtopo is down",
}


def _webhook_names(obj: Mapping[str, Any]) -> set[str]:
    return {str(w.get("name")) for w in obj.get("webhooks") or []}


def _unbound(snapshot: Snapshot, binding_kind: str, policy: str) -> list[str]:
    """The policies of this name (any install's: the chart prefixes them) that no binding names: a policy binds
    nothing without its own binding, whatever other bindings of a like name exist."""
    kind = binding_kind.removesuffix("Binding")
    found = sorted(
        str(o["metadata"]["name"]) for o in snapshot.admission if o.get("kind") == kind and str(o["metadata"]["name"]).endswith(policy)
    )
    bound = {str((o.get("spec") or {}).get("policyName", "")) for o in snapshot.admission if o.get("kind") == binding_kind}
    return [name for name in found if name not in bound]


def check_admission(snapshot: Snapshot) -> list[Finding]:
    """stormtopo's webhook configurations (found by their webhooks' names) and admission policies with their
    bindings (by name: the chart prefixes them with its release), as operator/webhook.py registers them."""
    check = "webhooks"
    if "admission" in snapshot.unreadable:
        return [
            Finding(
                Level.WARNING,
                check,
                f"admission configuration could not be read ({snapshot.unreadable['admission']})",
                "use a kubeconfig that may list mutatingwebhookconfigurations, validatingwebhookconfigurations and "
                "validatingadmissionpolicies(bindings)",
            )
        ]
    missing: list[str] = []
    why: list[str] = []
    problems: list[str] = []
    twice: list[str] = []
    policies: list[str] = []
    present: list[str] = []  # webhook configurations, then policies with their bindings
    for expected in snapshot.expected_admission:
        kind, name = str(expected.get("kind")), str(expected["metadata"]["name"])
        same_kind = [o for o in snapshot.admission if o.get("kind") == kind]
        if kind.endswith("WebhookConfiguration"):
            hooks = _webhook_names(expected)
            matches = [o for o in same_kind if hooks <= _webhook_names(o)]
            what = f"{kind} with {', '.join(sorted(hooks))}"
            consequence = _CONSEQUENCE.get(kind, "")
            for obj in matches:
                wanted = {str(w["name"]): w for w in expected.get("webhooks") or []}
                for hook in obj.get("webhooks") or []:
                    want = wanted.get(str(hook.get("name")))
                    if want is None:
                        continue
                    config = hook.get("clientConfig") or {}
                    where = f"webhook {hook['name']} of {kind} {obj['metadata']['name']}"
                    if not config.get("caBundle") and "service" in config:
                        problems.append(f"{where} has no caBundle, so the API server cannot verify it and every call fails")
                    if want.get("failurePolicy") and hook.get("failurePolicy") != want["failurePolicy"]:
                        problems.append(f"{where} has failurePolicy {hook.get('failurePolicy')}, not {want['failurePolicy']}")
        elif kind.endswith(("AdmissionPolicy", "AdmissionPolicyBinding")):
            matches = [o for o in same_kind if str(o["metadata"]["name"]).endswith(name)]
            what = f"{kind} *{name}"
            policy = name if kind.endswith("AdmissionPolicy") else str((expected.get("spec") or {}).get("policyName", ""))
            consequence = _CONSEQUENCE.get(policy, "")
        else:
            continue  # the opted-in ConfigMap: the operator writes it in its own namespace
        unbound = _unbound(snapshot, kind, policy) if matches and kind.endswith("Binding") else []
        if unbound:  # another install's binding of the same name binds its own policy, not this one: inert
            missing.append(f"{what} for {', '.join(unbound)}")
            if consequence and consequence not in why:
                why.append(consequence)
        elif not matches:
            missing.append(what)
            if consequence and consequence not in why:
                why.append(consequence)
        elif len(matches) > 1:
            twice.append(f"{what}: {', '.join(sorted(str(o['metadata']['name']) for o in matches))}")
        elif kind.endswith("WebhookConfiguration"):
            present.append(f"{kind} {matches[0]['metadata']['name']}")
        elif kind.endswith("AdmissionPolicy"):
            policies.append(str(matches[0]["metadata"]["name"]))
    findings: list[Finding] = []
    if missing:
        findings.append(
            Finding(
                Level.ERROR,
                check,
                f"not registered: {_names(missing, 6)}; so {'; '.join(why)}",
                "install the chart (docs/install.md, step 3), or start the operator with webhook registration on",
            )
        )
    if problems:
        findings.append(
            Finding(
                Level.WARNING,
                check,
                "; ".join(problems),
                "reinstall the chart (helm upgrade); with certMode certManager, check cert-manager's CA injector",
            )
        )
    if twice:
        findings.append(
            Finding(
                Level.WARNING,
                check,
                f"registered more than once (two installs?): {'; '.join(twice)}",
                "uninstall one of them (stormtopo uninstall --delete-webhooks, or helm uninstall)",
            )
        )
    if not findings:
        policies_text = f"admission policies {', '.join(policies)} with their bindings" if policies else ""
        findings.append(Finding(Level.OK, check, f"registered: {', '.join([*present, policies_text] if policies else present)}"))
    if not any(o.get("kind") == "MutatingAdmissionPolicy" for o in snapshot.expected_admission):
        findings.append(
            Finding(
                Level.WARNING,
                check,
                "no MutatingAdmissionPolicy of stormtopo's labels new opted-in StormServices (the API server serves none, or the "
                "chart was installed before it did), so stormtopo's webhook labels each one's role templates: each such create "
                "waits on a call to stormtopo (1.46 to 1.89 times a plain create, BENCHMARKS.md) and is refused while stormtopo is down",
                "on Kubernetes 1.34 or 1.35, start the API server with --feature-gates=MutatingAdmissionPolicy=true and "
                "--runtime-config=admissionregistration.k8s.io/v1beta1=true (1.36 serves it); then helm upgrade the chart, which "
                "installs the policy where it is served",
            )
        )
    return findings
