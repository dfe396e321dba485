"""`stormtopo demo`: the feature request's scenario on a local control plane, with and without stormtopo.

8 GPU nodes under switches s0..s6, most of them busy. The same 1P1D StormService is deployed once
without and once with `hard` / tier 1; both placements are shown as trees, with the tier each
prefill-decode pair crosses and its modeled KV-cache transfer time, and drawn into a PNG.
"""

from __future__ import annotations

import tempfile
from dataclasses import dataclass
from pathlib import Path

import yaml
from rich.columns import Columns
from rich.console import Console
from rich.table import Table

from stormtopo.core.topology.fabric import parse_topology
from stormtopo.core.topology.tree import Topology
from stormtopo.core.vocabulary import HIGHEST_TIER, MODE
from stormtopo.devenv import cluster
from stormtopo.devenv.client import DevCluster
from stormtopo.devenv.components import REPO_ROOT
from stormtopo.devenv.workloads import filler_pod, stormservice
from stormtopo.kvtransfer import KVModel, crossed_tier, parse_kv_model
from stormtopo.view.picture import PairPlacement, draw
from stormtopo.view.tree import topology_tree

TOPOLOGY_FILE = REPO_ROOT / "examples" / "topology" / "aibrix-1730.yaml"
DEFAULT_KV_CONFIG = Path(__file__).resolve().parent / "data" / "kv_transfer.yaml"
NAMESPACE = "demo"
# A busy cluster: most GPUs are taken; what is free is scattered, as after hours of churn.
BUSY = {"node0": 7, "node1": 8, "node2": 7, "node3": 8, "node4": 8, "node5": 6, "node6": 8, "node7": 8}
SCENARIOS: tuple[tuple[str, str, dict[str, str]], ...] = (
    ("pd-plain", "without stormtopo", {}),
    ("pd-hard", "with stormtopo: hard, tier 1", {MODE: "hard", HIGHEST_TIER: "1"}),
)


@dataclass(frozen=True)
class Outcome:
    name: str
    title: str
    prefill: str
    decode: str
    tier: int
    domain: str
    kv_seconds: float
    free: dict[str, int]  # free GPUs per node while this run's replica was placed
    total: dict[str, int]


def run(state_dir: Path | None = None, kv_config: Path = DEFAULT_KV_CONFIG, picture: Path | None = None, keep: bool = False) -> int:
    console = Console()
    kv = parse_kv_model(yaml.safe_load(kv_config.read_text()))
    topology = parse_topology(TOPOLOGY_FILE.read_text())
    state = state_dir or Path(tempfile.mkdtemp(prefix="stormtopo-demo-"))
    picture = picture or Path("build") / "demo" / "placement.png"
    console.print(f"[bold]Starting a local control plane[/] in {state} (etcd, kube-apiserver, Volcano, AIBrix, kwok, stormtopo)")
    cluster.up(state, TOPOLOGY_FILE)
    try:
        client = DevCluster(state)
        client.create_namespace(NAMESPACE)
        for node, gpus in BUSY.items():
            client.create(filler_pod(f"busy-{node}", NAMESPACE, node, gpus))
        client.bound_pods(NAMESPACE, "stormtopo.io/filler=true", len(BUSY))
        # One run at a time, from the same busy cluster: each tree shows its own run, not the sum of both.
        outcomes = []
        for i, (name, title, annotations) in enumerate(SCENARIOS):
            outcomes.append(_deploy(client, topology, kv, name, title, annotations))
            if i + 1 < len(SCENARIOS):
                _remove(client, name)
        _show(console, topology, outcomes, kv)
        picture.parent.mkdir(parents=True, exist_ok=True)
        draw(
            topology,
            [PairPlacement(o.title, o.prefill, o.decode, f"{o.domain} (tier {o.tier})", o.kv_seconds * 1000) for o in outcomes],
            picture,
        )
        console.print(f"Picture: {picture.resolve()}")
    finally:
        if keep:
            console.print(f"Cluster left running: KUBECONFIG={state / 'kubeconfig'}; stop it with `stormtopo dev down --state-dir {state}`")
        else:
            cluster.down(state)
            console.print("Stopped every process the demo started.")
    return 0


def _deploy(client: DevCluster, topology: Topology, kv: KVModel, name: str, title: str, annotations: dict[str, str]) -> Outcome:
    client.create(stormservice(name, NAMESPACE, annotations=annotations))
    pods = client.bound_pods(NAMESPACE, f"storm-service-name={name}", 2, timeout=60)
    node = {p["metadata"]["labels"]["role-name"]: p["spec"]["nodeName"] for p in pods}
    span = topology.span([node["prefill"], node["decode"]])
    tier = crossed_tier(span, topology.tiers)
    domain = "one node" if span.tier == 0 else (span.hypernode or "no common switch")
    free, total = client.gpu_capacity()
    return Outcome(name, title, node["prefill"], node["decode"], tier, domain, kv.seconds(tier), free, total)


def _remove(client: DevCluster, name: str) -> None:
    client.delete_stormservice(NAMESPACE, name)
    client.wait(lambda: not client.pods(NAMESPACE, f"storm-service-name={name}"), 120, f"the pods of {name} gone")


def _show(console: Console, topology: Topology, outcomes: list[Outcome], kv: KVModel) -> None:
    trees = []
    for o in outcomes:
        marks: dict[str, list[str]] = {}
        marks.setdefault(o.prefill, []).append(f"P {o.name}")
        marks.setdefault(o.decode, []).append(f"D {o.name}")
        trees.append(topology_tree(topology, o.free, o.total, marks, title=f"{o.name}: {o.title}", highlight=[o.domain]))
    console.print(Columns(trees, equal=True, expand=True))
    table = Table(title=f"Modeled KV-cache transfer of one {kv.prompt_tokens}-token request ({kv.request_bytes / 1e9:.2f} GB)")
    for column in ("StormService", "prefill", "decode", "crosses", "link", "KV transfer"):
        table.add_column(column)
    for o in outcomes:
        link = kv.link(o.tier)
        table.add_row(
            f"{o.name} ({o.title})",
            o.prefill,
            o.decode,
            f"{o.domain}, tier {o.tier}",
            f"{link.bandwidth_gbps:g} GB/s",
            f"{o.kv_seconds * 1000:.1f} ms",
        )
    console.print(table)
    for o in outcomes:
        console.print(
            f"{o.name}: prefill on {o.prefill}, decode on {o.decode}, crosses {o.domain} (tier {o.tier}), "
            f"KV transfer {o.kv_seconds * 1000:.1f} ms; {sum(o.free.values())} GPUs free in its run",
            soft_wrap=True,
        )
    if len(outcomes) == 2 and outcomes[1].kv_seconds > 0:
        console.print(
            f"stormtopo's placement moves the KV cache {outcomes[0].kv_seconds / outcomes[1].kv_seconds:.1f}x faster per request."
        )
