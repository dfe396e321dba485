"""The operator's flags, typed once at start: what the chart and `dev up` pass, and bad values refused
with a message naming the flag and what it accepts."""

from __future__ import annotations

import pytest

from stormtopo.operator.config import OperatorConfig, ServiceRef, parse_args


def test_the_charts_flags_become_a_typed_config() -> None:
    config = parse_args(
        ["--webhook-service", "stormtopo/stormtopo-webhook:8443", "--no-register-webhook", "--leader-elect", "--heal-interval", "5"]
    )
    assert config.webhook_service == ServiceRef("stormtopo", "stormtopo-webhook", 8443)
    assert config.webhook_service.hosts[0] == "stormtopo-webhook.stormtopo.svc"
    assert not config.register_webhook and config.leader_elect and config.heal_interval == 5.0
    assert parse_args([]) == OperatorConfig()
    assert not OperatorConfig().node_tier and parse_args(["--node-tier"]).node_tier  # off unless asked for
    assert not parse_args(["--node-tier"]).node_tier_keep_runs and parse_args(["--node-tier", "--node-tier-keep-runs"]).node_tier_keep_runs
    assert OperatorConfig().volcano_scheduler_configmap == "volcano-system/volcano-scheduler-configmap"  # where Volcano's chart keeps it
    assert parse_args(["--volcano-scheduler-configmap", ""]).volcano_scheduler_configmap == ""  # read none
    assert OperatorConfig().exact_preemption_fewest == "pods"
    assert parse_args(["--exact-preemption", "--exact-preemption-fewest", "gpus"]).exact_preemption_fewest == "gpus"
    assert OperatorConfig().narrow_soft_preemption and not parse_args(["--no-narrow-soft-preemption"]).narrow_soft_preemption
    assert parse_args(["--exact-preemption-hold", "5"]).exact_preemption_hold == 5  # it bounds the narrowing's hold too
    assert parse_args(["--webhook-service", "ns/svc"]).webhook_service == ServiceRef("ns", "svc", 443)
    assert parse_args(["--webhook-url-host", "127.0.0.1", "--webhook-port", "9444"]).webhook_url_base == "https://127.0.0.1:9444"


def test_periods_are_configuration_with_the_production_defaults() -> None:
    from stormtopo.core.spread import SPREAD_GIVE_UP
    from stormtopo.operator.loops import HANG_SECONDS

    default = OperatorConfig()
    assert (default.resync_seconds, default.hang_seconds, default.spread_give_up) == (30.0, HANG_SECONDS, SPREAD_GIVE_UP)
    short = parse_args(["--resync-seconds=5", "--hang-seconds=40", "--spread-give-up=12", "--volcano-recheck-seconds=3"])
    assert (short.resync_seconds, short.hang_seconds, short.spread_give_up, short.volcano_recheck_seconds) == (5, 40, 12, 3)


@pytest.mark.parametrize(
    ("argv", "named"),
    [
        (["--webhook-service", "svc-without-namespace"], "--webhook-service: 'svc-without-namespace': accepted: NAMESPACE/NAME"),
        (["--webhook-service", "ns/svc:https"], "--webhook-service: 'ns/svc:https'"),
        (["--metrics-port", "99999"], "--metrics-port: '99999': accepted: a port from 1 to 65535"),
        (["--heal-cooldown", "-1"], "--heal-cooldown: '-1': accepted: a positive float"),
        (["--lease-duration", "soon"], "--lease-duration: 'soon': accepted: a positive int"),
        (["--node-tier-keep-runs"], "--node-tier-keep-runs: accepted only with --node-tier"),
        (["--exact-preemption-fewest", "gpus"], "--exact-preemption-fewest: accepted only with --exact-preemption"),
        (
            ["--no-narrow-soft-preemption", "--exact-preemption-hold", "5"],
            "--exact-preemption-hold: accepted only with --exact-preemption or --narrow-soft-preemption",
        ),
        (["--exact-preemption", "--exact-preemption-fewest", "jobs"], "argument --exact-preemption-fewest: invalid choice: 'jobs'"),
        (["--resync-seconds", "0"], "--resync-seconds: '0': accepted: a positive float"),
        (["--spread-give-up", "never"], "--spread-give-up: 'never': accepted: a positive float"),
        (
            ["--volcano-scheduler-configmap", "volcano-scheduler-configmap"],
            "--volcano-scheduler-configmap: 'volcano-scheduler-configmap': accepted: NAMESPACE/NAME, e.g. volcano-system/",
        ),
    ],
)
def test_a_bad_flag_is_refused_before_anything_starts(argv: list[str], named: str, capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exited:
        parse_args(argv)
    assert exited.value.code == 2
    assert named in capsys.readouterr().err
