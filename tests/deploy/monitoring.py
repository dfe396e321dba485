"""The chart's monitoring as it ships: the PrometheusRule's rule groups and the dashboard, read from
`helm template --set monitoring.enabled=true` with the default thresholds. The promtool tests and the
real-Prometheus test both read them from here, so they test what the chart renders."""

from __future__ import annotations

import json
import re
import subprocess
from typing import Any

import yaml

from stormtopo.devenv import components
from tests.conftest import CHART_IMAGE, REPO

CHART = REPO / "deploy" / "helm" / "stormtopo"


def rendered(*sets: str, only: str = "templates/monitoring.yaml") -> list[dict[str, Any]]:
    """Every object of templates/monitoring.yaml (`only`: another template, or "" for all), with
    monitoring on unless `sets` turn it off."""
    args = ["template", "x", str(CHART), "--kube-version", "1.35.3", *(["--show-only", only] if only else [])]
    for value in (CHART_IMAGE, "monitoring.enabled=true", *sets):
        args += ["--set", value]
    done = subprocess.run([str(components.ensure_binary("helm")), *args], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    return [o for o in yaml.safe_load_all(done.stdout) if o]


def of_kind(objects: list[dict[str, Any]], kind: str) -> dict[str, Any]:
    (found,) = [o for o in objects if o["kind"] == kind]
    return found


def rule_groups() -> dict[str, Any]:
    """The PrometheusRule's spec: a Prometheus rules file as it stands ({groups: [...]})."""
    return dict(of_kind(rendered(), "PrometheusRule")["spec"])


def alerts() -> dict[str, str]:
    """Alert name -> expression."""
    return {r["alert"]: r["expr"] for g in rule_groups()["groups"] for r in g["rules"] if "alert" in r}


def dashboard() -> dict[str, Any]:
    data = of_kind(rendered(), "ConfigMap")["data"]
    return dict(json.loads(data["stormtopo.json"]))


def dashboard_queries() -> dict[str, str]:
    """ "panel title / refId" -> PromQL. No Grafana variable appears in a query (only the data source is
    one), so each runs on Prometheus as it is."""
    queries = {f"{p['title']} / {t['refId']}": t["expr"] for p in dashboard()["panels"] for t in p["targets"]}
    assert not [q for q in queries.values() if re.search(r"\$\w", q)], "a Grafana variable in a query: substitute it in the tests"
    return queries
