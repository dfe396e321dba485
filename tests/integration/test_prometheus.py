"""The chart's dashboard and alerts on a real Prometheus scraping the operator of the local control plane
(issue 22): every query evaluates without error and returns series from the real scrape.

Prometheus 2.42.0 (Debian's package, stormtopo/devenv/prometheus.py) runs on 127.0.0.1 with its own
storage, scrapes the operator's metrics port every second and loads the PrometheusRule's rules as the
chart renders them. A StormService that opts in is placed, and one that no leaf can hold stays pending, so
that the series the queries read exist with real values.
"""

from __future__ import annotations

import json
import re
import subprocess
import urllib.parse
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from stormtopo.core.vocabulary import HIGHEST_TIER, MODE
from stormtopo.devenv import prometheus
from stormtopo.devenv.client import DevCluster, Timeout
from stormtopo.devenv.processes import free_port
from stormtopo.devenv.workloads import Role, stormservice
from tests.deploy.monitoring import alerts, dashboard_queries, rule_groups

HARD_LEAF = {MODE: "hard", HIGHEST_TIER: "1"}
JOB = "stormtopo"
# A threshold comparison at the end of an alert's expression: what makes it quiet on a healthy cluster.
THRESHOLD = re.compile(r"\s*(?:>=|<=|==|!=|>|<)\s*[0-9.]+\s*$")


class Prometheus:
    def __init__(self, port: int) -> None:
        self.base = f"http://127.0.0.1:{port}"

    def get(self, path: str, **query: str) -> dict[str, Any]:
        url = f"{self.base}{path}" + (f"?{urllib.parse.urlencode(query)}" if query else "")
        with urllib.request.urlopen(url, timeout=10) as response:
            return dict(json.load(response))

    def query(self, expr: str) -> list[dict[str, Any]]:
        """The instant vector `expr` evaluates to now; an error (bad query) fails the test at once."""
        try:
            answer = self.get("/api/v1/query", query=expr)
        except urllib.error.HTTPError as exc:  # 400/422: the query did not parse or evaluate
            raise AssertionError(f"{expr!r}: {exc.read().decode()}") from exc
        assert answer["status"] == "success", (expr, answer)
        return list(answer["data"]["result"])

    def ready(self) -> bool:
        try:
            return self.get("/api/v1/query", query=f'up{{job="{JOB}"}} == 1')["data"]["result"] != []
        except OSError:  # not listening yet
            return False


@pytest.fixture(scope="module")
def scraping(cluster: DevCluster, cluster_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Prometheus]:
    tmp_path = tmp_path_factory.mktemp("prometheus")
    metrics_port = json.loads((cluster_dir / "cluster.json").read_text())["ports"]["operator_metrics"]
    (tmp_path / "rules.yaml").write_text(yaml.safe_dump(rule_groups(), sort_keys=False))
    config = {
        "global": {"scrape_interval": "1s", "evaluation_interval": "1s"},
        "rule_files": ["rules.yaml"],
        "scrape_configs": [{"job_name": JOB, "static_configs": [{"targets": [f"127.0.0.1:{metrics_port}"]}]}],
    }
    (tmp_path / "prometheus.yml").write_text(yaml.safe_dump(config))
    port = free_port()
    with open(tmp_path / "prometheus.log", "w") as log:
        server = subprocess.Popen(
            [
                str(prometheus.binary("prometheus")),
                f"--config.file={tmp_path / 'prometheus.yml'}",
                f"--storage.tsdb.path={tmp_path / 'data'}",
                f"--web.listen-address=127.0.0.1:{port}",
            ],
            stdout=log,
            stderr=subprocess.STDOUT,
        )
    try:
        prom = Prometheus(port)
        cluster.wait(lambda: server.poll() is not None or prom.ready(), 60, "Prometheus to scrape the operator")
        assert server.poll() is None, (tmp_path / "prometheus.log").read_text()[-3000:]
        yield prom
    finally:
        server.terminate()
        try:
            server.wait(timeout=30)
        except subprocess.TimeoutExpired:
            server.kill()
            server.wait()


def series_parts(expr: str) -> list[str]:
    """The parts of an alert's expression that select series on a healthy cluster. An alert is quiet by
    design there, so its whole expression returns nothing; what shows that its metrics exist in the
    scrape is the expression without its threshold comparison (e.g. `sum(...) > 0` -> `sum(...)`), and,
    for `absent(m)`, `m`. Each top-level `or` branch separately."""
    parts = []
    for branch in expr.split(" or "):
        absent = re.fullmatch(r"absent\((.*)\)", branch.strip())
        parts.append(absent.group(1) if absent else THRESHOLD.sub("", branch.strip()))
    assert all(parts), expr
    return parts


def test_every_dashboard_and_alert_query_returns_series_from_the_real_scrape(
    cluster: DevCluster, namespace: str, scraping: Prometheus
) -> None:
    # Placed: 6 + 6 GPUs within one leaf of 2 x 8. Pending: 3 x 8 GPUs, which no leaf (16) holds.
    fits_a_leaf = (Role("prefill", gpus=6), Role("decode", gpus=6))
    fits_no_leaf = (Role("prefill", replicas=2, gpus=8), Role("decode", gpus=8))
    cluster.create(stormservice("pd-placed", namespace, roles=fits_a_leaf, annotations=HARD_LEAF))
    cluster.create(stormservice("pd-pending", namespace, roles=fits_no_leaf, annotations=HARD_LEAF))
    cluster.bound_pods(namespace, "storm-service-name=pd-placed", 2, timeout=90)

    # The real values behind two alerts, through Prometheus: the pending gang counted (by the leader)
    # and explained, the placement counted by tier.
    pending = series_parts(alerts()["StormtopoHardGangPending"])[0]
    cluster.wait(lambda: [s for s in scraping.query(pending) if float(s["value"][1]) >= 1], 120, "a pending hard gang in Prometheus")
    cluster.wait(lambda: scraping.query('stormtopo_explanations_total{outcome="exact"} > 0'), 60, "an explanation counted")

    def alert_state(name: str) -> str:
        states = [a["state"] for a in scraping.get("/api/v1/alerts")["data"]["alerts"] if a["labels"]["alertname"] == name]
        return states[0] if states else ""

    # The rule itself, evaluated by Prometheus on the real scrape: active, and firing after its `for`.
    assert cluster.wait(lambda: alert_state("StormtopoHardGangPending"), 30, "StormtopoHardGangPending to be active") == "pending"
    cluster.wait(lambda: scraping.query('stormtopo_replicas_placed_total{tier="1"} > 0'), 60, "a tier-1 placement counted")

    queries = {f"dashboard: {title}": expr for title, expr in dashboard_queries().items()}
    for name, expr in alerts().items():
        scraping.query(expr)  # the whole expression evaluates without error (most are quiet here: no series)
        for i, part in enumerate(series_parts(expr)):
            queries[f"alert {name} [{i}]"] = part
    # rate() and increase() need two samples of a series: wait for each query to return series rather
    # than for some fixed time.
    missing = dict(queries)

    def every_query_returned() -> bool:
        for name in [n for n, q in missing.items() if scraping.query(q)]:
            del missing[name]
        return not missing

    try:
        cluster.wait(every_query_returned, 60, "every query to return series")
    except Timeout:
        raise AssertionError(f"no series from the real scrape for: {json.dumps(missing, indent=1)}") from None


def test_prometheus_evaluates_every_shipped_rule_without_error(scraping: Prometheus, cluster: DevCluster) -> None:
    def evaluated() -> list[dict[str, Any]]:
        rules = [r for g in scraping.get("/api/v1/rules")["data"]["groups"] for r in g["rules"]]
        return rules if rules and all(r["health"] != "unknown" for r in rules) else []  # unknown: not evaluated yet

    rules = cluster.wait(evaluated, 30, "Prometheus to evaluate every rule once")
    assert {r["name"] for r in rules} == set(alerts())
    assert [(r["name"], r["health"], r.get("lastError")) for r in rules if r["health"] != "ok"] == []
