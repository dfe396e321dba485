"""`topology apply` writes all or nothing: every write dry-run first, then in dependency order, and a failure
after the dry run says exactly what was and was not written (issue 14, item 5). The API is a stand-in here;
tests/integration/test_topology_cli.py runs the same against a real API server."""

from __future__ import annotations

from typing import Any

import pytest
from rich.console import Console

from stormtopo.commands.topology import _apply
from stormtopo.core.topology.fabric import parse_topology
from stormtopo.core.topology.hypernodes import hypernode_manifests
from stormtopo.core.vocabulary import MANAGED_BY
from stormtopo.kube.client import Api, ApiError

NEW = parse_topology("switches:\n  spine:\n    leaf-a: [n0]\n    leaf-b: [n1]\n")
OLD = parse_topology("switches:\n  core:\n    old-spine:\n      leaf-a: [n0, n1]\n")


class RecordingApi(Api):
    """Holds HyperNodes in memory, records every request, and refuses the ones `refuse` picks."""

    def __init__(self, existing: list[dict[str, Any]], refuse: Any = lambda method, name, dry_run: False) -> None:
        self.existing = existing
        self.refuse = refuse
        self.sent: list[tuple[str, str, bool]] = []

    def list_objects(self, *args: Any, **kwargs: Any) -> list[dict[str, Any]]:
        return self.existing

    def request(self, method: str, path: str, body: Any = None, content_type: str = "", **query: str) -> Any:
        name = body["metadata"]["name"] if method == "POST" else path.rsplit("/", 1)[-1]
        dry_run = query.get("dryRun") == "All"
        if self.refuse(method, name, dry_run):
            raise ApiError.of(422, method, path, '{"kind":"Status","message":"admission webhook denied: no ' + name + '"}')
        self.sent.append((method, name, dry_run))
        return None


def managed(manifests: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [m | {"metadata": m["metadata"] | {"labels": dict(MANAGED_BY)}} for m in manifests]


def test_everything_is_dry_run_first_then_written_parents_deleted_first_and_children_created_first() -> None:
    api = RecordingApi(managed(hypernode_manifests(OLD)))
    assert _apply(api, NEW, dry_run=False, console=Console(quiet=True)) == 0
    order = [("DELETE", "core"), ("DELETE", "old-spine"), ("PATCH", "leaf-a"), ("POST", "leaf-b"), ("POST", "spine")]
    assert api.sent == [(m, n, True) for m, n in order] + [(m, n, False) for m, n in order]


def test_a_write_the_server_would_refuse_writes_nothing(capsys: pytest.CaptureFixture[str]) -> None:
    api = RecordingApi(managed(hypernode_manifests(OLD)), refuse=lambda method, name, dry_run: name == "spine")
    assert _apply(api, NEW, dry_run=False, console=Console(quiet=True)) == 1
    assert all(dry_run for _, _, dry_run in api.sent)
    err = capsys.readouterr().err
    assert "would refuse to create HyperNode spine: HTTP 422: admission webhook denied: no spine; nothing was written" in err


def test_a_failure_after_the_dry_run_names_what_was_and_was_not_written(capsys: pytest.CaptureFixture[str]) -> None:
    api = RecordingApi([], refuse=lambda method, name, dry_run: name == "leaf-b" and not dry_run)
    assert _apply(api, NEW, dry_run=False, console=Console(quiet=True)) == 1
    assert [n for _, n, dry_run in api.sent if not dry_run] == ["leaf-a"]
    err = capsys.readouterr().err
    assert "create HyperNode leaf-b failed: HTTP 422: admission webhook denied: no leaf-b" in err
    assert "written: create HyperNode leaf-a\n" in err
    assert "not written: create HyperNode leaf-b, create HyperNode spine\n" in err


def test_explain_takes_kubectls_namespace_flag_and_output_formats() -> None:
    from stormtopo.cli import build_parser

    parser = build_parser("kubectl stormtopo")
    bare = parser.parse_args(["explain", "svc", "-n", "ns", "-o", "yaml", "--context", "c"])
    assert (bare.target, bare.namespace, bare.output, bare.context) == ("svc", "ns", "yaml", "c")
    qualified = parser.parse_args(["explain", "ns/svc"])
    assert (qualified.target, qualified.namespace, qualified.output) == ("ns/svc", None, "text")
    assert parser.parse_args(["topology", "show", "-o", "yaml"]).output == "yaml"
