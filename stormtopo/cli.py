"""The `stormtopo` command line."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from stormtopo.core.topology import TopologyError


def _dev_up(args: argparse.Namespace) -> int:
    from stormtopo.devenv import cluster

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

    names = tuple(args.component) or (*components.CONTROL_PLANE, "vc-controller-manager")
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
    from stormtopo.core.kvtransfer import KVConfigError
    from stormtopo.devenv import cluster

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


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="stormtopo", description="Network-topology-aware scheduling for AIBrix StormService on Volcano")
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
    demo = sub.add_parser("demo", help="the feature request's 1P1D scenario with and without stormtopo, as trees and a PNG")
    demo.add_argument("--state-dir", help="where to run the demo cluster (default: a new temporary directory)")
    demo.add_argument("--kv-config", help="KV-transfer model: per-tier bandwidth and latency (default: the packaged one)")
    demo.add_argument("--picture", help="PNG to write (default: build/demo/placement.png)")
    demo.add_argument("--keep", action="store_true", help="leave the cluster running afterwards")
    demo.set_defaults(func=_demo)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    return int(args.func(args))


if __name__ == "__main__":
    sys.exit(main())
