"""The `stormtopo` command line."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import TYPE_CHECKING

from stormtopo.core.topology.tree import TopologyError
from stormtopo.core.volcano_conf import SCHEDULER_CONFIGMAP, VOLCANO_NAMESPACE, configmap_ref

if TYPE_CHECKING:
    from stormtopo.kube.client import Api, ApiError

# What to do about an API error, by HTTP status: the one line the user reads instead of a traceback.
_API_ADVICE = {
    401: "the API server did not accept your credentials: log in again or check the kubeconfig's user",
    403: "your user is not allowed to do this: ask for the RBAC permission, or use a kubeconfig that has it",
    404: "not found: check the name and namespace, and that Volcano's and AIBrix's CRDs are installed",
    409: "someone else changed it at the same time: run the command again",
    422: "the API server rejected the object as invalid",
    429: "the API server is overloaded: retry in a moment",
}


def _select_versions(args: argparse.Namespace) -> bool:
    from stormtopo.devenv import components

    try:
        components.select_versions(args.aibrix_version, args.volcano_version, args.kubernetes_version)
    except components.BuildError as exc:
        print(f"stormtopo: {exc}", file=sys.stderr)
        return False
    return True


def _dev_up(args: argparse.Namespace) -> int:
    from stormtopo.devenv import cluster

    if not _select_versions(args):
        return 2
    try:
        cluster.up(Path(args.state_dir), Path(args.topology) if args.topology else None, with_operator=not args.without_operator)
    except TopologyError as exc:
        print(f"stormtopo: {args.topology}: {exc}", file=sys.stderr)
        return 2
    except cluster.AlreadyRunning as exc:
        print(f"stormtopo: {exc}", file=sys.stderr)
        return 1
    except (cluster.ClusterError, RuntimeError) as exc:
        print(f"stormtopo: dev up failed: {exc}", file=sys.stderr)
        return 1
    return 0


def _dev_down(args: argparse.Namespace) -> int:
    from stormtopo.devenv import cluster

    stopped = cluster.down(Path(args.state_dir).resolve())
    print(f"stormtopo: stopped {stopped} process(es) in {args.state_dir}")
    return 0


def _dev_build(args: argparse.Namespace) -> int:
    from stormtopo.devenv import components

    if not _select_versions(args):
        return 2
    names = tuple(args.component) or tuple(components.COMPONENTS)
    unknown = [n for n in names if n not in components.COMPONENTS]
    if unknown:
        print(f"stormtopo: unknown component(s) {unknown}; known: {sorted(components.COMPONENTS)}", file=sys.stderr)
        return 2
    try:
        for name, path in components.ensure_binaries(names).items():
            print(f"{name}\t{path}")
    except components.BuildError as exc:
        print(f"stormtopo: {exc}", file=sys.stderr)
        return 1
    return 0


def _demo(args: argparse.Namespace) -> int:
    from stormtopo import demo
    from stormtopo.devenv import cluster
    from stormtopo.kvtransfer import KVConfigError

    try:
        return demo.run(
            Path(args.state_dir) if args.state_dir else None,
            Path(args.kv_config) if args.kv_config else demo.DEFAULT_KV_CONFIG,
            Path(args.picture) if args.picture else None,
            keep=args.keep,
        )
    except KVConfigError as exc:
        print(f"stormtopo: {args.kv_config}: {exc}", file=sys.stderr)
        return 2
    except cluster.ClusterError as exc:
        print(f"stormtopo: demo failed: {exc}", file=sys.stderr)
        return 1


def _api(args: argparse.Namespace) -> Api:
    from stormtopo.kube.client import Api

    return Api(args.kubeconfig, getattr(args, "context", None))


def _topology(args: argparse.Namespace) -> int:
    from rich.console import Console

    from stormtopo.commands import topology

    console = Console()
    try:
        if args.topology_command == "apply":
            return topology.apply_file(_api(args), Path(args.file), args.dry_run, console)
        if args.topology_command == "from-labels":
            levels = [level.strip() for level in args.levels.split(",") if level.strip()]
            return topology.apply_labels(_api(args), levels, args.dry_run, console)
        return topology.show(_api(args), args.output, console)
    except TopologyError as exc:
        source = f"{args.file}: " if getattr(args, "file", None) else ""
        print(f"stormtopo: {source}{exc}; nothing was changed", file=sys.stderr)
        return 2
    except OSError as exc:
        print(f"stormtopo: {exc}", file=sys.stderr)
        return 2


def _stormservice_target(args: argparse.Namespace) -> tuple[str, str] | None:
    """NAMESPACE/NAME, or NAME with -n/--namespace (kubectl's habit; default: "default"); None if neither."""
    namespace, sep, name = args.target.partition("/")
    if not sep:
        namespace, name = args.namespace or "default", args.target
    if not namespace or not name or "/" in name or (sep and args.namespace and args.namespace != namespace):
        print(
            f"stormtopo: {args.command} takes NAMESPACE/STORMSERVICE, or STORMSERVICE with -n NAMESPACE; got {args.target!r}",
            file=sys.stderr,
        )
        return None
    return namespace, name


def _explain(args: argparse.Namespace) -> int:
    from rich.console import Console

    from stormtopo.commands import explain

    target = _stormservice_target(args)
    if target is None:
        return 2
    try:
        return explain.run(_api(args), *target, Console(), args.output, args.volcano_scheduler_configmap)
    except explain.NotFound as exc:
        print(f"stormtopo: {exc}", file=sys.stderr)
        return 1


def _doctor(args: argparse.Namespace) -> int:
    from rich.console import Console

    from stormtopo.commands import doctor

    try:
        return doctor.run(_api(args), args.scheduler_config, Console(), args.output)
    except doctor.BadFile as exc:
        print(f"stormtopo: {exc}", file=sys.stderr)
        return 2


def _heal(args: argparse.Namespace) -> int:
    from rich.console import Console

    from stormtopo.commands import heal

    target = _stormservice_target(args)
    if target is None:
        return 2
    if not args.dry_run:
        print(
            'stormtopo: heal takes --dry-run: the operator moves the replicas of StormServices annotated stormtopo.io/heal: "true"; '
            "--dry-run shows which it would move now, and where",
            file=sys.stderr,
        )
        return 2
    try:
        return heal.run(_api(args), *target, Console(), args.output)
    except heal.NotFound as exc:
        print(f"stormtopo: {exc}", file=sys.stderr)
        return 1


def _release_held(args: argparse.Namespace) -> int:
    from stormtopo.commands import release_held

    return release_held.run(_api(args), args.namespace, args.dry_run, print)


def _uninstall(args: argparse.Namespace) -> int:
    from stormtopo.operator import uninstall

    if args.stop_deployment and "/" not in args.stop_deployment:
        print(f"stormtopo: --stop-deployment {args.stop_deployment!r}: accepted: NAMESPACE/NAME", file=sys.stderr)
        return 2
    return uninstall.run(_api(args), args.stop_deployment, args.delete_webhooks, args.labelled_pods_binding)


def build_parser(prog: str = "stormtopo") -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog=prog, description="Network-topology-aware scheduling for AIBrix StormService on Volcano")
    sub = parser.add_subparsers(dest="command", required=True)

    dev = sub.add_parser("dev", help="a local control plane from real upstream components").add_subparsers(
        dest="dev_command", required=True
    )
    up = dev.add_parser("up", help="start etcd, kube-apiserver, kube-controller-manager, Volcano, AIBrix, kwok and the operator")
    up.add_argument("--state-dir", required=True, help="directory for kubeconfig, bin/kubectl, logs and data")
    up.add_argument("--topology", help="switch-tree YAML: creates fake GPU nodes and HyperNodes (see examples/topology)")
    up.add_argument("--without-operator", action="store_true", help="start everything but stormtopo's operator and webhook")
    up.set_defaults(func=_dev_up)
    down = dev.add_parser("down", help="stop every process `dev up` started in the state directory")
    down.add_argument("--state-dir", required=True)
    down.set_defaults(func=_dev_down)
    build = dev.add_parser("build", help="build (or find cached) upstream binaries and print their paths")
    build.add_argument("component", nargs="*")
    build.set_defaults(func=_dev_build)
    for releases in (up, build):  # COMPATIBILITY.md lists the served releases; `make compat` runs every pair
        releases.add_argument("--aibrix-version", help="AIBrix release (default: $STORMTOPO_AIBRIX_VERSION, else the newest served)")
        releases.add_argument("--volcano-version", help="Volcano release (default: $STORMTOPO_VOLCANO_VERSION, else the newest served)")
        releases.add_argument(
            "--kubernetes-version",
            help="release of kube-apiserver, kube-controller-manager, kube-scheduler (default: $STORMTOPO_KUBERNETES_VERSION or v1.35.3)",
        )
    kube = argparse.ArgumentParser(add_help=False)
    kube.add_argument("--kubeconfig", help="kubeconfig file (default: $KUBECONFIG, else the service account in a pod, else ~/.kube/config)")
    kube.add_argument("--context", help="the kubeconfig context to use (default: its current context)")
    topo = sub.add_parser("topology", help="declare HyperNodes and see the tree").add_subparsers(dest="topology_command", required=True)
    apply = topo.add_parser("apply", parents=[kube], help="create, update and prune HyperNodes from a switch-tree file")
    apply.add_argument("-f", "--file", required=True)
    apply.add_argument("--dry-run", action="store_true", help="print the changes, write nothing")
    labels = topo.add_parser("from-labels", parents=[kube], help="HyperNodes from node labels (Volcano's label discovery semantics)")
    labels.add_argument("--levels", required=True, help="node labels naming each switch level, top tier first, comma-separated")
    labels.add_argument("--dry-run", action="store_true")
    show = topo.add_parser("show", parents=[kube], help="the HyperNode tree with free/total GPUs and the replicas on each node")
    show.add_argument("-o", "--output", choices=("tree", "json", "yaml"), default="tree")
    for p in (apply, labels, show):
        p.set_defaults(func=_topology)
    explain = sub.add_parser("explain", parents=[kube], help="where each replica of a StormService landed, or why it is Pending")
    explain.add_argument("target", metavar="[NAMESPACE/]STORMSERVICE")
    explain.add_argument("-n", "--namespace", help="the StormService's namespace, with a bare STORMSERVICE (default: default)")
    explain.add_argument("-o", "--output", choices=("text", "json", "yaml"), default="text")
    explain.add_argument(
        "--volcano-scheduler-configmap",
        type=configmap_ref,
        default=f"{VOLCANO_NAMESPACE}/{SCHEDULER_CONFIGMAP}",
        metavar="NAMESPACE/NAME",
        help="where vc-scheduler's configuration is kept, read to say whether Volcano preempts for a Pending replica ('' reads none)",
    )
    explain.set_defaults(func=_explain)
    doctor = sub.add_parser("doctor", parents=[kube], help="read-only checks: Volcano's configuration, HyperNodes, webhooks, PodGroups")
    doctor.add_argument("--scheduler-config", metavar="FILE", help="vc-scheduler's configuration (default: its ConfigMap)")
    doctor.add_argument("-o", "--output", choices=("text", "json"), default="text")
    doctor.set_defaults(func=_doctor)

    heal = sub.add_parser("heal", parents=[kube], help="which replicas healing would move now, and where (with --dry-run)")
    heal.add_argument("target", metavar="[NAMESPACE/]STORMSERVICE")
    heal.add_argument("-n", "--namespace", help="the StormService's namespace, with a bare STORMSERVICE (default: default)")
    heal.add_argument("--dry-run", action="store_true", help="say which replicas would move and where; move nothing")
    heal.add_argument("-o", "--output", choices=("text", "json", "yaml"), default="text")
    heal.set_defaults(func=_heal)

    held = sub.add_parser(
        "release-held", parents=[kube], help="free every pod held at stormtopo's scheduling gate (after uninstalling stormtopo)"
    )
    held.add_argument("--namespace", "-n", help="only this namespace (default: every namespace)")
    held.add_argument("--dry-run", action="store_true", help="print what would be released, change nothing")
    held.set_defaults(func=_release_held)

    gone = sub.add_parser(
        "uninstall",
        parents=[kube],
        help="leave the cluster as it was: gates, moves' holds and the node tier's HyperNodes taken back (stop the operator first)",
    )
    from stormtopo.operator.uninstall import add_arguments

    add_arguments(gone)
    gone.set_defaults(func=_uninstall)

    demo = sub.add_parser("demo", help="the feature request's 1P1D scenario with and without stormtopo, as trees and a PNG")
    demo.add_argument("--state-dir", help="where to run the demo cluster (default: a new temporary directory)")
    demo.add_argument("--kv-config", help="KV-transfer model: per-tier bandwidth and latency (default: the packaged one)")
    demo.add_argument("--picture", help="PNG to write (default: build/demo/placement.png)")
    demo.add_argument("--keep", action="store_true", help="leave the cluster running afterwards")
    demo.set_defaults(func=_demo)
    return parser


def describe_api_error(exc: ApiError) -> str:
    """One line: the request that failed, the API server's own message, and what to do."""
    message = exc.message
    advice = _API_ADVICE.get(exc.status, "the API server may be unhealthy: retry, or check its logs" if exc.status >= 500 else "")
    return "; ".join(part for part in (f"{exc.request} failed (HTTP {exc.status})", message, advice) if part)


def main(argv: list[str] | None = None, prog: str = "stormtopo") -> int:
    import ssl

    import urllib3

    from stormtopo.kube.client import ApiError, CredentialsError

    args = build_parser(prog).parse_args(argv)
    try:
        return int(args.func(args))
    except ApiError as exc:
        print(f"stormtopo: {describe_api_error(exc)}", file=sys.stderr)
    except CredentialsError as exc:
        print(f"stormtopo: {exc}", file=sys.stderr)
    except (urllib3.exceptions.HTTPError, ssl.SSLError, ConnectionError) as exc:
        reason = getattr(exc, "reason", None) or exc
        print(f"stormtopo: cannot reach the API server: {reason}; check the cluster is up and the kubeconfig's server", file=sys.stderr)
    return 1


def kubectl_main(argv: list[str] | None = None) -> int:
    """`kubectl stormtopo ...`: kubectl runs the `kubectl-stormtopo` it finds on PATH with the rest of
    the command line (kubectl's plugin mechanism)."""
    return main(argv, prog="kubectl stormtopo")


if __name__ == "__main__":
    sys.exit(main())
