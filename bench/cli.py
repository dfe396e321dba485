"""`python -m bench SUBCOMMAND`: every benchmark of stormtopo, one subcommand each (BENCHMARKS.md).

Each writes bench/results/NAME.json (`--name` overrides NAME), which starts with the command line, the commit,
the machine and the pinned versions (bench/record.py). The options mean the same wherever they appear:

- `--seed S`: the seeded stream's seed; where a bench takes several, a range (29-40) or a list (29,31).
- `--size PRESET` (`--quick` for `--size quick`): a bench's preset size (smoke, quick, full).
- `--replicas N`, `--plain N`, `--services N`: how many replicas with a topology, gangs without one, or
  StormServices; `--nodes NODES[=REPLICAS],...` for the simulator's fabrics.

The forms before subcommands still work: `python -m bench --quick` is `quick`, `python -m bench` is `full`,
`--heal [--quick]`, `--scale N`, `--large`, `--expressions`, `--admission`, `--scale-nodes`, `--foreign-pods`
and `--sim` the subcommands of those names.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shlex
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from bench import record
from stormtopo.core.topology.node_tier import SPARE_EMPTY

Runner = Callable[[argparse.Namespace, str], int]

LEGACY = {
    "--sim": "sim",
    "--heal": "heal",
    "--scale": "scale",
    "--large": "large",
    "--expressions": "expressions",
    "--admission": "admission",
    "--scale-nodes": "scale-nodes",
    "--foreign-pods": "foreign-pods",
}


def canonical(argv: Sequence[str]) -> list[str]:
    """The subcommand form of a command line in the flag forms of before (`--quick`, `--heal --quick`,
    `--scale 1000`, none at all: the full run); a subcommand form unchanged."""
    rest = list(argv)
    if rest and (not rest[0].startswith("-") or rest[0] in ("-h", "--help")):
        return rest
    for flag, command in LEGACY.items():
        if command == "scale":
            at = next((i for i, a in enumerate(rest) if a == flag or a.startswith(flag + "=")), None)
            if at is None:
                continue
            given = rest.pop(at)
            services = given.split("=", 1)[1] if "=" in given else rest.pop(at) if at < len(rest) else ""
            return ["scale", "--services", services, *rest]
        if flag in rest:
            rest.remove(flag)
            return [command] if command == "sim" else [command, *rest]  # --sim took no other option
    if "--quick" in rest:
        rest.remove("--quick")
        return ["quick", *rest]
    return ["full", *rest]


def seeds(text: str) -> list[int]:
    """`29`, `29-40` or `29,31,33`."""
    if not re.fullmatch(r"\d+(-\d+)?(,\d+(-\d+)?)*", text):
        raise argparse.ArgumentTypeError(f"{text!r}: a seed, a range of them (29-40) or a list (29,31)")
    out: list[int] = []
    for part in text.split(","):
        first, _, last = part.partition("-")
        out += range(int(first), int(last or first) + 1)
    return out


def one_seed(text: str) -> int:
    found = seeds(text)
    if len(found) != 1:
        raise argparse.ArgumentTypeError(f"{text!r}: this bench takes one seed")
    return found[0]


def _seed(parser: argparse.ArgumentParser, default: str, many: bool, what: str) -> None:
    kind = "seeds of {}: one, a range (29-40) or a list (29,31)" if many else "seed of {}"
    parse = seeds if many else one_seed
    parser.add_argument("--seed", type=parse, default=parse(default), help=f"{kind.format(what)} (default {default})")


def _operator_source(parser: argparse.ArgumentParser, verb: str) -> None:
    parser.add_argument("--operator-source", help=f"{verb} of another checkout (its directory), e.g. an older commit's")


def _size(parser: argparse.ArgumentParser, presets: dict[str, str], default: str) -> None:
    described = "; ".join(f"{k}: {v}" for k, v in presets.items())
    parser.add_argument("--size", choices=list(presets), default=default, help=f"{described} (default {default})")
    parser.add_argument("--quick", dest="size", action="store_const", const="quick", help="--size quick")


def _node_tier(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--node-tier", action="store_true", help="the operator keeps the node tier's short list (its --node-tier)")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m bench",
        description=(__doc__ or "").split("\n\n")[0],
        epilog="Each writes bench/results/NAME.json; `python -m bench SUBCOMMAND --help` for its options.",
    )
    sub = parser.add_subparsers(dest="command", required=True, metavar="SUBCOMMAND")

    def add(name: str, runner: Runner, summary: str, result: str, named: bool = True) -> argparse.ArgumentParser:
        p = sub.add_parser(name, help=summary, description=f"{summary} Writes bench/results/{result}.")
        if named:
            p.add_argument("--name", help=f"results file stem (default: {result.split('.')[0]})")
        p.set_defaults(run=runner)
        return p

    p = add(
        "quick", run_quick, "make bench-quick: small versions of the full run, 16 nodes, about 3 minutes; one JSON line last.", "quick.json"
    )
    _node_tier(p)
    p = add("full", run_full, "placement quality, packing, critical path, webhook latency, churn, 256 nodes.", "full-DATE.json")
    _node_tier(p)
    add("large", run_large, "placement quality only, 1,024 nodes, 120 StormServices per mode.", "placement-1024.json")
    add("expressions", run_expressions, "a PodGroup per replica against one with subgroups, 1,024 nodes.", "expressions-1024.json")
    p = add("scale", run_scale, "N StormServices on 1,024 nodes: the operator's memory, CPU and API requests.", "scale-N.json")
    p.add_argument("--services", type=int, default=1000, help="StormServices (default 1000)")
    add("admission", run_admission, "webhook admission with 20 pending hard gangs against none, 1,024 nodes.", "admission-1024.json")
    add(
        "scale-nodes",
        run_scale_nodes,
        "time to every pod bound, hard tier 1 against plain, batches of StormServices, on 4,096 then 1,024 nodes.",
        "scale-nodes.json",
    )
    p = add(
        "idle-lists",
        run_idle_lists,
        "the node tier at rest: the operator's list calls on pods and nodes per idle minute (audit log), beside 2,000 pods.",
        "idle-lists.json",
    )
    p.add_argument("--operator-source", metavar="DIR", help="run the operator from this checkout (PYTHONPATH), e.g. an older commit")
    p.add_argument("--others", type=int, default=2000, help="bound pods of another tenant (default 2000)")
    p = add(
        "foreign-pods", run_foreign_pods, "the operator restarted beside 10,000 pods it never admitted, against none.", "foreign-pods.json"
    )
    p.add_argument("--operator-source", metavar="DIR", help="run the operator from this checkout (PYTHONPATH), e.g. an older commit")
    p = add(
        "heal",
        run_heal,
        "make bench-heal: healing under churn, without and with stormtopo.io/heal, 256 nodes.",
        "healing[-SIZE][-seedN]...json",
    )
    _size(
        p,
        {"smoke": "30 simulated min, 16 nodes", "quick": "2 simulated h at 60x, ~10 min", "full": "6 simulated h at 30x, ~40 min"},
        "full",
    )
    _seed(p, "23", many=False, what="the churn stream")
    p.add_argument("--factor", type=float, help="simulated seconds per real second (default: the size's, 60 quick, 30 full)")
    p.add_argument("--make-room", action="store_true", help="the operator with --heal-make-room")
    _node_tier(p)
    p = add(
        "heal-rescore",
        run_heal_rescore,
        "summarize finished healing runs again against the optimum as computed now.",
        "FILE (rewritten)",
        named=False,
    )
    p.add_argument("files", nargs="+", type=Path, metavar="FILE", help="a healing result, its -samples.json beside it")
    p = add("packing", run_packing, "packing over time against the exact offline optimum, on its own cluster.", "packing[-quick].json")
    _size(p, {"quick": "16 nodes", "full": "the 64 nodes under one spine of 256"}, "full")
    _node_tier(p)
    p = add(
        "node-tier", run_node_tier, "the node tier on the real control plane, 1,024 nodes, five layouts in turn.", "node-tier-1024.json"
    )
    p.add_argument("--replicas", type=int, default=24, help="hard tier-1 replicas per run (default 24)")
    p.add_argument("--plain", type=int, default=12, help="gangs without a topology per run (default 12)")
    p = add("idle", run_idle, "the idle cost of a 4,096-node control plane, per setting.", "idle-4096.json")
    p.add_argument("settings", nargs="*", default=["40,200ms", "3600,200ms", "3600,1s"], help="LEASE_SECONDS,SCHEDULE_PERIOD ...")
    p = add("kvflow", run_kvflow, "the KV-transfer flow simulation on a packing run's placements (no cluster).", "kvflow[-quick].json")
    p.add_argument("packing", nargs="?", type=Path, default=record.RESULTS / "packing.json", help="a packing result (default packing.json)")
    p.add_argument("--requests", type=int, default=2000, help="requests per cell (default 2000)")
    p = add("hindsight", run_hindsight, "the packing full run's streams placed by a search that knows them (no cluster).", "hindsight.json")
    _seed(p, "29", many=True, what="the streams")
    p.add_argument("--misses", default="0", help="replicas allowed off one node, each a search (e.g. 0,1)")
    p.add_argument("--starts", default="fragmented,empty")
    p.add_argument("--budget", type=int, default=1_000_000, help="search steps per prefix length tried")
    p = add(
        "spread",
        run_spread,
        "replica spread (stormtopo.io/replica-spread-tier) under churn and leaf failures, simulated (no cluster).",
        "spread[-quick].json",
    )
    _size(p, {"quick": "16 nodes, 4 simulated h", "full": "128 nodes, 48 simulated h, ~5 min for 20 seeds"}, "full")
    _seed(p, "1-20", many=True, what="the churn and failure streams")
    p = add("sim", run_sim, "make bench-sim: Volcano's allocate action and plugins at 1,024-16,384 nodes (no cluster).", "sim.json, sim.md")
    p.add_argument("--nodes", "--sizes", dest="nodes", help="NODES[=REPLICAS],... (default 1024=64,4096=24,16384=8)")
    p.add_argument("--starts", default="empty,fragmented")
    p.add_argument("--settings", default="shipped,normal-pod-off", help="scheduler conf settings (bench/sim.py SETTINGS)")
    p.add_argument("--layouts", help="only these layouts (leaf is always run: the baseline)")
    p.add_argument("--plain", type=int, help="gangs without a topology per case (default 32 / 8 / 4 by size)")
    p.add_argument("--batch", type=int, default=1, help="replicas per scheduling session (default 1)")
    p.add_argument("--opening", default=None, help="the node tier's rule (default: stormtopo's)")
    p = add(
        "preemption",
        run_preemption,
        "Volcano's gangpreempt on fragmented clusters: its victims against the exact minimum (no cluster).",
        "preemption[-quick].json, .md",
    )
    _size(p, {"quick": "64 nodes, 3 seeds", "full": "64 nodes x 20 seeds and 1,024 nodes x 10 seeds, about 2 minutes"}, "full")
    p = add(
        "loop-stall",
        run_loop_stall,
        "the leader's event loop while a resync drains every StormService and RoleSet: longest stall, pod webhook p99 (no cluster).",
        "loop-stall.json",
    )
    p.add_argument("--services", type=int, default=10_000, help="StormServices that never opted in (default 10,000)")
    p.add_argument("--replicas", type=int, default=3, help="RoleSets of each (default 3: 30,000 RoleSets)")
    p.add_argument(
        "--cluster",
        action="store_true",
        help="on the local control plane: the operator's own lag metric and its pod webhook, without and with a resync (about 15 minutes)",
    )
    p.add_argument("--seconds", type=float, default=60.0, help="with --cluster: each phase's probing (default 60)")
    _operator_source(p, "run the operator (with --cluster)")
    p = add(
        "collector",
        run_collector,
        "every pass of the garbage collector while the readings grow to 10,000 StormServices and 100,000 pods, then churn (no cluster).",
        "collector.json",
    )
    p.add_argument("--services", type=int, default=10_000, help="StormServices fed (default 10,000; 5 RoleSets, 10 pods each)")
    p = add(
        "room-stall",
        run_room_stall,
        "the leader's event loop while held replicas that must preempt are planned over 16,384 nodes (no cluster).",
        "room-stall.json",
    )
    p.add_argument("--nodes", type=int, default=16_384, help="nodes of 8 GPUs, filled (default 16,384)")
    p.add_argument("--rounds", type=int, default=20, help="held replicas planned, one change of the reading before each (default 20)")
    p = add(
        "node-tier-stall",
        run_node_tier_stall,
        "the leader's event loop while the node tier keeps its short lists current over 16,384 nodes (no cluster).",
        "node-tier-stall.json",
    )
    p.add_argument("--spines", type=int, default=16, help="spines of 32 leaves of 32 nodes of 8 GPUs (default 16: 16,384 nodes)")
    p.add_argument("--rounds", type=int, default=20, help="passes, a few pods ended and bound on listed nodes before each (default 20)")
    p = add(
        "memory",
        run_memory,
        "the operator's memory at 10,000 StormServices, 100,000 admitted pods and 4,096 nodes, follower and leader (simulated).",
        "memory.json",
    )
    p.add_argument("--services", type=int, default=10_000, help="opted-in StormServices (default 10,000)")
    p.add_argument("--replicas", type=int, default=5, help="RoleSets of each, two admitted pods each (default 5: 100,000 pods)")
    p.add_argument("--nodes", type=int, default=4_096, help="nodes (default 4,096)")
    _operator_source(p, "measure the operator")
    p = add(
        "optin-creates",
        run_optin_creates,
        "300 opted-in creates against 300 plain, with nothing opted in and after --background more (issue 42): ratios, refusals.",
        "optin-creates.json",
    )
    p.add_argument("--background", type=int, default=10_000, help="StormServices opted in between the two rounds (default 10,000)")
    p.add_argument("--namespaces", type=int, default=100, help="namespaces they are spread over (default 100)")
    p.add_argument(
        "--labelled-by",
        choices=("policy", "webhook"),
        default="policy",
        help="who labels new opted-in StormServices: the MutatingAdmissionPolicy (default), or stormtopo's webhook "
        "(the policy's binding deleted: as on Kubernetes before 1.34)",
    )
    p.add_argument(
        "--change",
        choices=("create", "update", "heal"),
        default="create",
        help="what each round times: creates (default); opt-ins by an update of plain StormServices; healing turned on; "
        "each against as many plain updates",
    )
    _operator_source(p, "run the operator")
    p = add(
        "uninstall",
        run_uninstall,
        "the chart's uninstall hook over 1,000 and 10,000 admitted pods: its peak RSS and wall time (one local control plane).",
        "uninstall.json",
    )
    p.add_argument("--sizes", type=_sizes, default="1000,10000", help="admitted pods, comma-separated (default 1000,10000)")
    _operator_source(p, "run the uninstall")
    p = add(
        "sim-packing",
        run_sim_packing,
        "the packing full run (64 nodes) in the simulator, per stream and opening rule.",
        "sim-packing.json, .md",
    )
    _seed(p, "29-40", many=True, what="the streams")
    p.add_argument("--openings", default=None, help="the node tier's rules, comma-separated (default: stormtopo's and -pairs)")
    p.add_argument("--repeats", type=int, default=1, help="each case this many times")
    p.add_argument("--sticky", action="store_true", help="listed partly used nodes stay listed while they qualify")
    p.add_argument("--spare-empty", type=int, default=None, help="more empty nodes of the first leaf to open, listed too")
    p.add_argument("--next-empty", type=int, default=1, help="empty nodes the node tier lists (the operator's next_empty)")
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args_list = canonical(sys.argv[1:] if argv is None else argv)
    args = build_parser().parse_args(args_list)
    command = shlex.join(["python", "-m", "bench", *args_list])
    runner: Runner = args.run
    return runner(args, command)


def _sizes(text: str) -> tuple[int, ...]:
    """--sizes 1000,10000: positive counts, comma-separated."""
    try:
        sizes = tuple(int(n) for n in text.split(",") if n.strip())
    except ValueError:
        sizes = ()
    if not sizes or min(sizes) < 1:
        raise argparse.ArgumentTypeError(f"{text!r}: accepted: positive whole numbers, comma-separated (e.g. 1000,10000)")
    return sizes


def _use_operator_source(args: argparse.Namespace) -> None:
    """--operator-source DIR: the operator processes a run starts inherit PYTHONPATH=DIR (another checkout's
    code, for a before/after pair in one session); this process keeps its own modules."""
    if args.operator_source:
        os.environ["PYTHONPATH"] = str(Path(args.operator_source).resolve())


def _print_json(value: Any) -> None:
    print(json.dumps(value, default=str), flush=True)


def _suite(args: argparse.Namespace, command: str, quick: bool) -> int:
    from bench import kvflow, report, suite

    out = suite.run(quick, node_tier=args.node_tier)
    name = args.name or ("quick" if quick else f"full-{time.strftime('%Y%m%d-%H%M%S')}") + ("-node-tier" if args.node_tier else "")
    path = record.write(name, command, out)
    print(f"results: {path}", file=sys.stderr)
    if not quick:
        stamped = json.loads(path.read_text())
        report.plot(out, record.RESULTS / "placement.png")
        # Beside its run (NAME-kvflow.json): kvflow.json is `bench kvflow`'s, which BENCHMARKS.md quotes.
        kvflow.write(out["packing"], path.name, path.with_name(f"{path.stem}-kvflow"), provenance=record.provenance(command))
        path.with_suffix(".md").write_text(report.table(stamped, f"bench/results/{path.name}") + "\n")
    _print_json(suite.headline(out))  # make bench-quick's contract: this JSON object is the last line
    return 0


def run_quick(args: argparse.Namespace, command: str) -> int:
    return _suite(args, command, quick=True)


def run_full(args: argparse.Namespace, command: str) -> int:
    return _suite(args, command, quick=False)


def run_large(args: argparse.Namespace, command: str) -> int:
    from bench import report, suite

    out = suite.run(quick=False, large=True)
    path = record.write(args.name or "placement-1024", command, out)
    report.plot(out, path.with_suffix(".png"))
    path.with_suffix(".md").write_text(report.table(json.loads(path.read_text()), f"bench/results/{path.name}") + "\n")
    _print_json({mode: {k: v for k, v in s.items() if k != "replicas_detail"} for mode, s in out["placement"].items()})
    return 0


def run_expressions(args: argparse.Namespace, command: str) -> int:
    from bench import suite

    result = suite.expressions_at_scale()
    record.write(args.name or "expressions-1024", command, {"expressions": result})
    _print_json(result)
    return 0


def run_scale(args: argparse.Namespace, command: str) -> int:
    from bench import scale

    result = scale.run(args.services)
    record.write(args.name or f"scale-{args.services}", command, {"scale": result})
    _print_json(result)
    return 0


def run_admission(args: argparse.Namespace, command: str) -> int:
    from bench import admission_load, suite

    result = admission_load.run(suite.LARGE)
    record.write(args.name or "admission-1024", command, {"admission": result})
    _print_json({k: v for k, v in result.items() if k != "rounds"})
    return 0


def run_scale_nodes(args: argparse.Namespace, command: str) -> int:
    from bench import scale_nodes

    name = args.name or "scale-nodes"
    partial = f"{name}-partial"  # each cluster's figures as soon as it is done: a long run keeps them
    result = scale_nodes.run(done=lambda clusters: record.write(partial, command, {"clusters": clusters}))
    record.write(name, command, {"scale_nodes": result})
    (record.RESULTS / f"{partial}.json").unlink(missing_ok=True)
    _print_json({"growth": result["growth"], "seconds": result["seconds"]})
    return 0


def run_foreign_pods(args: argparse.Namespace, command: str) -> int:
    from bench import foreign_pods

    _use_operator_source(args)
    result = foreign_pods.run()
    record.write(args.name or ("foreign-pods-before" if args.operator_source else "foreign-pods"), command, {"foreign_pods": result})
    _print_json(result)
    return 0


def run_idle_lists(args: argparse.Namespace, command: str) -> int:
    from bench import idle_lists

    _use_operator_source(args)
    result = {**idle_lists.run(args.others), "operator_source": args.operator_source or ""}
    record.write(args.name or ("idle-lists-before" if args.operator_source else "idle-lists"), command, {"idle_lists": result})
    _print_json(result)
    return 0


def run_heal(args: argparse.Namespace, command: str) -> int:
    from bench import healing

    out = healing.run_size(args.size, args.seed, args.node_tier, args.factor, args.make_room)
    name = args.name or healing.result_name(args.size, args.seed, args.factor, args.node_tier, args.make_room)
    samples = out.pop("samples")
    path = record.write(name, command, out)
    # The samples as `python -m bench heal-rescore` reads them: no provenance (it is in the file beside).
    path.with_name(f"{name}-samples.json").write_text(json.dumps(samples, separators=(",", ":")))
    print(healing.markdown(out))
    _print_json({k: out[k] for k in ("seconds", "optimum")})
    return 0


def run_heal_rescore(args: argparse.Namespace, command: str) -> int:
    from bench import healing

    for path in args.files:
        try:
            again = healing.rescore(path)
        except FileNotFoundError as exc:
            print(f"heal-rescore {path}: {exc.filename} not found (a result file and its -samples.json beside it)", file=sys.stderr)
            return 1
        ratios = {m: again[m]["within_tier1_vs_optimum"] for m in ("off", "heal")}
        print(path, json.dumps({"optimum": again["optimum"], **ratios, "before": again["before"]}))
    return 0


def run_packing(args: argparse.Namespace, command: str) -> int:
    from bench import packing

    out = packing.standalone(args.size, args.node_tier)
    name = args.name or ("packing-quick" if args.size == "quick" else "packing") + ("-node-tier" if args.node_tier else "")
    record.write(name, command, out)
    _print_json({k: v for k, v in out.items() if "packing" in k or k in ("seconds", "one_node_where_one_fits", "kv_time_vs_node_optimal")})
    return 0


def run_node_tier(args: argparse.Namespace, command: str) -> int:
    from bench import node_tier

    out = node_tier.run(args.replicas, args.plain)
    record.write(args.name or "node-tier-1024", command, out)
    _print_json({"ratios": out["ratios"], "seconds": out["seconds"]})
    return 0


def run_idle(args: argparse.Namespace, command: str) -> int:
    from bench import idle

    runs = []
    for setting in args.settings:
        lease, _, period = setting.partition(",")
        runs.append(idle.idle(int(lease), period))
        _print_json(runs[-1])
    record.write(args.name or "idle-4096", command, {"runs": runs}, indent=1)
    return 0


def run_kvflow(args: argparse.Namespace, command: str) -> int:
    from bench import kvflow

    stem = record.RESULTS / (args.name or args.packing.stem.replace("packing", "kvflow"))
    out = kvflow.write(json.loads(args.packing.read_text()), args.packing.name, stem, args.requests, record.provenance(command))
    print("\n\n".join(kvflow.markdown(r) for r in out))
    return 0


def run_hindsight(args: argparse.Namespace, command: str) -> int:
    from bench import hindsight

    if not re.fullmatch(r"\d+(,\d+)*", args.misses):
        raise SystemExit(f"--misses {args.misses!r}: numbers of replicas, e.g. 0 or 0,1")
    starts = args.starts.split(",")
    if unknown := [s for s in starts if s not in ("empty", "fragmented")]:
        raise SystemExit(f"--starts: {unknown[0]!r} is not one of empty, fragmented")
    name = args.name or "hindsight"
    misses = [int(m) for m in args.misses.split(",")]
    hindsight.search(args.seed, misses, starts, args.budget, keep=lambda out: record.write(name, command, out, indent=1))
    return 0


def run_spread(args: argparse.Namespace, command: str) -> int:
    from bench import spread

    out = spread.run(args.size, args.seed)
    record.write(args.name or ("spread" if args.size == "full" else "spread-quick"), command, out, indent=1)
    print(spread.markdown(out))
    _print_json(spread.headline(out))
    return 0


def run_sim(args: argparse.Namespace, command: str) -> int:
    from bench import sim

    opening = args.opening if args.opening is not None else sim.SHIPPED
    if not re.fullmatch(sim.OPENING_RULES, opening):
        raise SystemExit(f"unknown opening rule {opening!r} (bench/sim.py OPENING_RULES)")
    settings = args.settings.split(",")
    if unknown := [s for s in settings if s not in sim.SETTINGS]:
        raise SystemExit(f"--settings: {unknown[0]!r} is not one of {', '.join(sim.SETTINGS)}")
    sizes = sim._sizes(args.nodes)
    if args.layouts:
        wanted = ("leaf", *[layout for layout in args.layouts.split(",") if layout != "leaf"])
        sizes = {n: (g, p, tuple(layout for layout in wanted if layout in sim.LAYOUTS)) for n, (g, p, _) in sizes.items()}
    if args.plain is not None:
        sizes = {n: (g, args.plain, layouts) for n, (g, _, layouts) in sizes.items()}
    result = sim.scale(sizes, args.starts.split(","), settings, args.batch, opening)
    name = args.name or "sim"
    record.RESULTS.mkdir(exist_ok=True)
    (record.RESULTS / f"{name}.json").write_text(sim.dump(record.stamped(command, result)))
    text = sim.table(result["rows"])
    (record.RESULTS / f"{name}.md").write_text(text + "\n")
    print(text)
    print(f"bench-sim: {result['seconds']} s; bench/results/{name}.json", file=sys.stderr)
    return 0


def run_sim_packing(args: argparse.Namespace, command: str) -> int:
    from bench import sim

    openings = (args.openings if args.openings is not None else ",".join(sim.OPENINGS)).split(",")
    if unknown := [rule for rule in openings if not re.fullmatch(sim.OPENING_RULES, rule)]:
        raise SystemExit(f"unknown opening rule {unknown[0]!r} (bench/sim.py OPENING_RULES)")
    if args.next_empty < 1:
        raise SystemExit(f"--next-empty {args.next_empty}: at least 1")
    spare_empty = SPARE_EMPTY if args.spare_empty is None else args.spare_empty
    if spare_empty < 0:
        raise SystemExit(f"--spare-empty {spare_empty}: 0 or more")
    result = sim.packing(args.seed, openings, args.repeats, args.next_empty, spare_empty, args.sticky)
    path = record.write(args.name or "sim-packing", command, result, indent=1)
    text = sim.packing_table(result)
    path.with_suffix(".md").write_text(text + "\n")
    print(text)
    return 0


def run_loop_stall(args: argparse.Namespace, command: str) -> int:
    from bench import loop_stall

    if args.cluster:
        _use_operator_source(args)
        result = {
            **loop_stall.run_on_cluster(args.services, args.replicas, seconds=args.seconds),
            "operator_source": args.operator_source or "",
        }
    else:
        result = loop_stall.run(args.services, args.replicas)
    path = record.write(args.name or ("loop-stall-cluster" if args.cluster else "loop-stall"), command, result)
    print(f"results: {path}")
    _print_json(result)
    return 0


def run_collector(args: argparse.Namespace, command: str) -> int:
    from bench import collector

    result = collector.run(args.services)
    path = record.write(args.name or "collector", command, result)
    print(f"results: {path}")
    _print_json(result)
    return 0


def run_room_stall(args: argparse.Namespace, command: str) -> int:
    from bench import room_stall

    result = room_stall.run(args.nodes, args.rounds)
    path = record.write(args.name or "room-stall", command, result)
    print(f"results: {path}")
    _print_json(result)
    return 0


def run_node_tier_stall(args: argparse.Namespace, command: str) -> int:
    from bench import node_tier_stall

    result = node_tier_stall.run(args.spines, args.rounds)
    path = record.write(args.name or "node-tier-stall", command, result)
    print(f"results: {path}")
    _print_json(result)
    return 0


def run_memory(args: argparse.Namespace, command: str) -> int:

    from bench import memory

    source = Path(args.operator_source).resolve() if args.operator_source else memory.REPO
    result = {**memory.run(args.services, args.replicas, args.nodes, source), "operator_source": args.operator_source or ""}
    path = record.write(args.name or ("memory-before" if args.operator_source else "memory"), command, result)
    print(f"results: {path}")
    _print_json(result)
    return 0


def run_optin_creates(args: argparse.Namespace, command: str) -> int:
    from bench import optin_creates

    _use_operator_source(args)
    result = {
        **optin_creates.run(args.background, args.namespaces, args.labelled_by, args.change),
        "operator_source": args.operator_source or "",
    }
    name = "optin-creates" if args.change == "create" else f"optin-{args.change}s"
    path = record.write(args.name or (f"{name}-before" if args.operator_source else name), command, result)
    print(f"results: {path}")
    _print_json(result)
    return 0


def run_uninstall(args: argparse.Namespace, command: str) -> int:
    from bench import uninstall

    result = uninstall.run(args.sizes, args.operator_source)
    path = record.write(args.name or ("uninstall-before" if args.operator_source else "uninstall"), command, result)
    print(f"results: {path}")
    _print_json(result)
    return 0


def run_preemption(args: argparse.Namespace, command: str) -> int:
    from bench import preemption

    result = preemption.run(args.size)
    path = record.write(args.name or ("preemption" if args.size == "full" else "preemption-quick"), command, result, indent=1)
    text = preemption.table(result["rows"])
    path.with_suffix(".md").write_text(text + "\n")
    print(text)
    _print_json(preemption.headline(result))
    return 0
