"""A results JSON of `python -m bench full` or `large` as Markdown tables (bench/results/NAME.md), and the
placement plot."""

from __future__ import annotations

from pathlib import Path
from typing import Any

MODE_TITLES = {
    "baseline": "no topology (AIBrix + Volcano gang)",
    "hard": "stormtopo hard, tier 1",
    "soft": "stormtopo soft",
    "diy": "Volcano DIY pod annotations (vc-controller-manager)",
}


def table(out: dict[str, Any], results_name: str) -> str:
    m, v = out["machine"], out["versions"]
    lines = [
        f"Run of `{out['command']}` ({results_name}, commit {out['commit']}): {out['nodes']} fake GPU nodes "
        f"(8 GPUs each, 3 tiers), {out['placement']['baseline']['replicas']} StormServices per mode, {out['seconds']} s in all.",
        "",
        f"Machine: {m['cpu']}, {m['cores']} cores, {m['memory_gib']} GiB; Python {v['python']}; {v['go']}.",
        "Components: " + ", ".join(f"{k} {c}" for k, c in v["components"].items()) + ".",
        "",
        "| placement | within tier 1 (of feasible) | tier distribution | KV time vs optimal | at optimum | pending |",
        "|---|---|---|---|---|---|",
    ]
    for mode, s in out["placement"].items():
        dist = ", ".join(f"{k}: {v}" for k, v in s["tier_distribution"].items())
        pending = s["tier_distribution"].get("pending", 0)
        lines.append(
            f"| {MODE_TITLES.get(mode, mode)} | {s['tier1_fraction']} | {dist} | {s['kv_time_vs_optimal']}x "
            f"(node-level {s['kv_time_vs_node_optimal']}x) | {s['at_optimum_fraction']} | {pending} |"
        )
    if "critical_path" not in out:
        return "\n".join(lines)
    cp, wh = out["critical_path"], out["webhook"]
    lines += [
        "",
        "| critical path | value |",
        "|---|---|",
        f"| StormService creation → PodGroup carries the constraint, median | {cp['podgroup_constraint_s_median']} s |",
        f"| StormService creation → AIBrix's first pod, median | {cp['first_pod_s_median']} s |",
        f"| ratio (below 1: scheduling never waits for stormtopo), median / max of {cp['samples']} | "
        f"{cp['ratio_median']} / {cp['ratio_max']} |",
        f"| pod admission with / without the webhook, p50 ({wh['count']} each, interleaved) | "
        f"{wh['with_webhook_ms']['p50']} / {wh['without_webhook_ms']['p50']} ms = {wh['p50_ratio']}x |",
        f"| pod admission with / without the webhook, p99 | {wh['with_webhook_ms']['p99']} / "
        f"{wh['without_webhook_ms']['p99']} ms = {wh['p99_ratio']}x |",
    ]
    if "expressions" in out:
        ex = out["expressions"]
        lines += [
            "",
            f"| the same request as ({ex['replicas']} replicas, each within one leaf) | all pods bound, median of {ex['rounds']} |",
            "|---|---|",
            *[f"| {k.replace('_', ' ')} | {v} s |" for k, v in ex["bound_s_median"].items()],
            f"| ratio subgroups / per replica | {ex['subgroups_vs_per_replica']}x |",
        ]
    return "\n".join(lines)


def plot(out: dict[str, Any], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    modes = list(out["placement"])
    buckets = ["tier0", "tier1", "tier2", "tier3", "pending"]
    colors = ["#2ca02c", "#98df8a", "#ffbb78", "#d62728", "#bbbbbb"]
    fig, (left, right) = plt.subplots(1, 2, figsize=(12, 4.5))
    bottoms = [0.0] * len(modes)
    for bucket, color in zip(buckets, colors, strict=True):
        values = [out["placement"][m]["tier_distribution"].get(bucket, 0) for m in modes]
        left.bar([MODE_TITLES.get(m, m) for m in modes], values, bottom=bottoms, color=color, label=bucket)
        bottoms = [b + v for b, v in zip(bottoms, values, strict=True)]
    left.set_title(f"Tier each replica spans ({out['nodes']} nodes)")
    left.set_ylabel("replicas")
    left.legend(fontsize=8)
    left.tick_params(axis="x", labelsize=7, rotation=12)
    ratios = [out["placement"][m]["kv_time_vs_optimal"] or 0 for m in modes]
    right.bar([MODE_TITLES.get(m, m) for m in modes], ratios, color="#1f77b4")
    right.axhline(1.0, color="#333333", linestyle="--", linewidth=1)
    right.set_title("Modeled KV-transfer time vs offline optimum (1.0 = optimal)")
    right.tick_params(axis="x", labelsize=7, rotation=12)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
