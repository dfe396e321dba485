"""The chart's alerts, unit-tested with promtool (issue 22): every alert fires in one case and stays quiet
in another (tests/deploy/prometheus/rules-test.yaml), on the rules as the chart renders them. And
monitoring stays off unless asked for."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import yaml

from stormtopo.devenv import prometheus
from tests.deploy.monitoring import alerts, of_kind, rendered, rule_groups

RULES_TEST = Path(__file__).parent / "prometheus" / "rules-test.yaml"


def promtool(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run([str(prometheus.binary("promtool")), *args], cwd=cwd, capture_output=True, text=True, timeout=120)


def test_promtool_checks_the_rendered_rules_and_every_alert_fires_and_stays_quiet(tmp_path: Path) -> None:
    (tmp_path / "rules.yaml").write_text(yaml.safe_dump(rule_groups(), sort_keys=False))
    shutil.copy(RULES_TEST, tmp_path / RULES_TEST.name)
    checked = promtool("check", "rules", "rules.yaml", cwd=tmp_path)
    assert checked.returncode == 0, checked.stdout + checked.stderr
    tested = promtool("test", "rules", RULES_TEST.name, cwd=tmp_path)
    assert tested.returncode == 0, tested.stdout + tested.stderr

    cases = [case for test in yaml.safe_load(RULES_TEST.read_text())["tests"] for case in test["alert_rule_test"]]
    firing = {c["alertname"] for c in cases if c["exp_alerts"]}
    quiet = {c["alertname"] for c in cases if not c["exp_alerts"]}
    shipped = set(alerts())
    assert len(shipped) == 9, shipped  # issue 22's seven conditions, issue 32's failing loop, issue 42's watch behind
    assert shipped - firing == set(), "alerts without a firing case"
    assert shipped - quiet == set(), "alerts without a quiet case"
    assert (firing | quiet) - shipped == set(), "cases for alerts the chart does not ship"


def backlog_rule(*sets: str) -> dict[str, str]:
    groups = of_kind(rendered(*sets), "PrometheusRule")["spec"]["groups"]
    (rule,) = [r for g in groups for r in g["rules"] if r["alert"] == "StormtopoWorkQueueBacklog"]
    return dict(rule)


def test_a_threshold_set_in_values_reaches_the_rule() -> None:
    default = backlog_rule()
    assert default["expr"].endswith("> 100") and default["for"] == "10m"
    changed = backlog_rule("monitoring.alerts.workQueueBacklog.depth=7", "monitoring.alerts.workQueueBacklog.for=3m")
    assert changed["expr"].endswith("> 7") and changed["for"] == "3m"


def test_kube_prometheus_stack_finds_what_it_selects_by() -> None:
    objects = rendered("monitoring.additionalLabels.release=kube-prometheus-stack")
    kinds = {o["kind"]: o for o in objects}
    assert set(kinds) == {"ServiceMonitor", "PrometheusRule", "ConfigMap"}
    assert kinds["ServiceMonitor"]["metadata"]["labels"]["release"] == "kube-prometheus-stack"
    assert kinds["PrometheusRule"]["metadata"]["labels"]["release"] == "kube-prometheus-stack"
    assert kinds["ConfigMap"]["metadata"]["labels"]["grafana_dashboard"] == "1"
    assert kinds["ServiceMonitor"]["spec"]["selector"]["matchLabels"]["app.kubernetes.io/component"] == "metrics"
    assert kinds["ServiceMonitor"]["spec"]["endpoints"][0]["port"] == "metrics"


def test_monitoring_is_off_by_default_and_each_part_can_be_left_out() -> None:
    assert {o["kind"] for o in rendered("monitoring.prometheusRule.enabled=false")} == {"ServiceMonitor", "ConfigMap"}
    everything = {(o["kind"], o["metadata"]["name"]) for o in rendered("monitoring.enabled=false", only="")}
    assert ("Deployment", "x-stormtopo") in everything
    assert not [o for o in everything if o[0] in ("ServiceMonitor", "PrometheusRule") or o[1].endswith("-dashboard")], everything
