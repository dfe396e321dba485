"""The chart registers exactly the admission objects the operator registers itself (webhook.py,
core/optin.py): files/admission.json is generated from that code, and this test fails when it is
stale. After a deliberate change: UPDATE_SNAPSHOTS=1 pytest tests/deploy/test_safety_chart.py, review,
commit. The chart's templates only fill in names, namespaces and how the API server reaches the webhook."""

from __future__ import annotations

import json
import os
from typing import Any

from stormtopo.operator import webhook
from tests.conftest import REPO

ADMISSION_FILE = REPO / "deploy" / "helm" / "stormtopo" / "files" / "admission.json"


def chart_admission_objects() -> dict[str, Any]:
    """What the operator registers, without what depends on the installation: CA bundles and addresses
    (kept: the path)."""
    objects = webhook.configuration(b"", url_base="", service=None)
    for obj in objects:
        for hook in obj.get("webhooks") or []:
            hook["clientConfig"] = {"path": hook["clientConfig"]["url"]}
    # Where the API server serves MutatingAdmissionPolicy, the chart renders these instead of the webhook that
    # labels new opted-in StormServices' role templates (templates/webhook.yaml sets their apiVersion).
    label_policy = [o for o in webhook.configuration(b"", url_base="", label_policy="v1") if "MutatingAdmissionPolicy" in o["kind"]]
    return {
        "_comment": "generated from stormtopo.operator.webhook.configuration by tests/deploy/test_safety_chart.py",
        "objects": objects,
        "labelPolicy": label_policy,
    }


def test_the_charts_admission_objects_are_the_operators() -> None:
    generated = json.dumps(chart_admission_objects(), indent=2, sort_keys=True) + "\n"
    if os.environ.get("UPDATE_SNAPSHOTS"):
        ADMISSION_FILE.write_text(generated)
    assert generated == ADMISSION_FILE.read_text(), "deploy/helm/stormtopo/files/admission.json is stale: see this test's docstring"
