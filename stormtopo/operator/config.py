"""The operator's configuration, typed and checked once at start: a bad flag is refused with a message
naming it and what is accepted, before anything is started."""

from __future__ import annotations

import argparse
from dataclasses import dataclass

from stormtopo.core.cluster_moves import MAX_MOVING
from stormtopo.core.cooldown import COOLDOWN
from stormtopo.core.preempting import HOLD_MAX
from stormtopo.core.spread import SPREAD_GIVE_UP
from stormtopo.core.stranded import STRANDED_AFTER
from stormtopo.core.volcano_conf import SCHEDULER_CONFIG_KEY, SCHEDULER_CONFIGMAP, VOLCANO_NAMESPACE, configmap_ref
from stormtopo.operator.loops import HANG_SECONDS

HEAL_INTERVAL = 10.0  # seconds between two healing passes
RESYNC_SECONDS = 30.0  # the leader re-queues every StormService and RoleSet from the index
VOLCANO_RECHECK_SECONDS = 30.0  # how soon Volcano's CRDs installed or upgraded after start are noticed
# Every replica re-lists: what a watch down for long missed is forgotten (deletions) or delivered
# (StormServices and RoleSets kopf did not deliver).
RELIST_SECONDS = 300.0
# A stopping replica answers reviews this long after SIGTERM: Kubernetes takes its endpoint out of the
# webhook Service meanwhile (the kubelet's SIGTERM and the endpoint's removal race), and the API server's
# kept-alive connections to it are closed after an answer, never under a review in flight (the API server
# retries no admission call, and a gate that fails closed refuses the create). Under the pod's grace period.
DRAIN_SECONDS = 5.0


@dataclass(frozen=True)
class ServiceRef:
    """The webhook's Service, when the operator runs in a cluster: how the API server reaches it."""

    namespace: str
    name: str
    port: int = 443

    @property
    def hosts(self) -> list[str]:
        return [f"{self.name}.{self.namespace}.svc", f"{self.name}.{self.namespace}.svc.cluster.local"]


@dataclass(frozen=True)
class OperatorConfig:
    kubeconfig: str | None = None
    webhook_host: str = "0.0.0.0"
    webhook_port: int = 9443
    webhook_url_host: str | None = None
    webhook_service: ServiceRef | None = None
    cert_dir: str | None = None
    metrics_host: str = "127.0.0.1"
    metrics_port: int = 8080
    register_webhook: bool = True
    leader_elect: bool = False
    leader_election_namespace: str = "default"
    lease_duration: int = 15
    identity: str = ""
    heal_interval: float = HEAL_INTERVAL
    heal_cooldown: float = COOLDOWN
    heal_make_room: bool = False  # move replicas of opted-in services out of the way of wide ones (core/room.py)
    heal_max_moving: int = MAX_MOVING  # replicas moving at once in the whole cluster
    heal_stranded_after: float = STRANDED_AFTER  # seconds a hard replica's pod waits beside running ones before it is stranded
    exact_preemption: bool = False  # hold a preempting replica and evict the fewest victims itself (core/preempting.py)
    exact_preemption_hold: float = HOLD_MAX  # seconds a replica may be held for it (or for narrowing) at most
    narrow_soft_preemption: bool = True  # a soft replica that must preempt is held hard within one tier (core/narrowing.py)
    exact_preemption_victim_namespace: tuple[str, ...] = ()  # the only namespaces it may take victims in (empty: any)
    exact_preemption_fewest: str = "pods"  # what its victims minimise first: pods (jobs disrupted) or gpus (work lost)
    # Where Volcano's chart keeps vc-scheduler's configuration: read to say when nothing would preempt for a
    # Pending replica (core/volcano_conf.py); "" reads nothing.
    volcano_scheduler_configmap: str = f"{VOLCANO_NAMESPACE}/{SCHEDULER_CONFIGMAP}"
    node_tier: bool = False  # keep a short list of tier-0 HyperNodes current (docs/node-tier.md)
    node_tier_keep_runs: bool = False  # the node tier keeps runs of empty nodes for whole-node replicas
    node_tier_leaf: tuple[str, ...] = ()  # leaves another writer keeps that the node tier may change anyway
    # Periods: production defaults; shorter ones let tests (and impatient clusters) see the same behaviour sooner.
    resync_seconds: float = RESYNC_SECONDS
    hang_seconds: float = HANG_SECONDS
    spread_give_up: float = SPREAD_GIVE_UP
    volcano_recheck_seconds: float = VOLCANO_RECHECK_SECONDS
    drain_seconds: float = DRAIN_SECONDS
    relist_seconds: float = RELIST_SECONDS

    @property
    def webhook_url_base(self) -> str:
        return f"https://{self.webhook_url_host or self.webhook_host}:{self.webhook_port}"


def service_ref(text: str) -> ServiceRef:
    """NAMESPACE/NAME[:PORT], as --webhook-service takes it."""
    ref, colon, port = text.partition(":")
    namespace, slash, name = ref.partition("/")
    if not slash or not namespace or not name or "/" in name or (colon and not port.isdigit()):
        raise argparse.ArgumentTypeError(f"{text!r}: accepted: NAMESPACE/NAME or NAMESPACE/NAME:PORT, e.g. stormtopo/stormtopo-webhook:443")
    return ServiceRef(namespace, name, int(port) if colon else 443)


def _positive(kind: type[int] | type[float]):  # type: ignore[no-untyped-def]
    def parse(text: str) -> int | float:
        try:
            value = kind(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r}: accepted: a positive {kind.__name__}") from None
        if value <= 0:
            raise argparse.ArgumentTypeError(f"{text!r}: accepted: a positive {kind.__name__}")
        return value

    return parse


def _port(text: str) -> int:
    if not text.isdigit() or not 0 < int(text) < 65536:
        raise argparse.ArgumentTypeError(f"{text!r}: accepted: a port from 1 to 65535")
    return int(text)


def build_parser() -> argparse.ArgumentParser:
    """The operator's flags, each defaulting to OperatorConfig's value."""
    d = OperatorConfig()
    p = argparse.ArgumentParser(prog="python -m stormtopo.operator")
    p.add_argument("--kubeconfig", help="kubeconfig file; in-cluster configuration when omitted")
    p.add_argument("--webhook-host", default=d.webhook_host, help="address the webhook listens on")
    p.add_argument("--webhook-port", type=_port, default=d.webhook_port)
    p.add_argument("--webhook-url-host", help="host the API server calls (default: --webhook-host); for a local cluster")
    p.add_argument("--webhook-service", type=service_ref, help="NAMESPACE/NAME[:PORT] of the webhook Service, when running in a cluster")
    p.add_argument("--cert-dir", help="directory with tls.crt, tls.key and ca.crt; a certificate is generated when omitted")
    p.add_argument("--metrics-host", default=d.metrics_host)
    p.add_argument("--metrics-port", type=_port, default=d.metrics_port)
    p.add_argument("--no-register-webhook", action="store_true", help="the webhook configuration is managed elsewhere (Helm)")
    p.add_argument("--leader-elect", action="store_true", help="several replicas: all serve the webhook, the Lease holder reconciles")
    p.add_argument("--leader-election-namespace", default=d.leader_election_namespace, help="namespace of the Lease")
    p.add_argument(
        "--lease-duration", type=_positive(int), default=d.lease_duration, help="seconds without renewal before another replica takes over"
    )
    p.add_argument("--identity", default=d.identity, help="this replica's name in the Lease (default: $POD_NAME or host-pid)")
    p.add_argument("--heal-interval", type=_positive(float), default=d.heal_interval, help="seconds between two healing passes")
    p.add_argument("--heal-cooldown", type=_positive(float), default=d.heal_cooldown, help="seconds before a moved replica may move again")
    p.add_argument(
        "--heal-max-moving",
        type=_positive(int),
        default=d.heal_max_moving,
        help="replicas that healing moves at once in the whole cluster (a recovery after an outage is no synchronised restart)",
    )
    p.add_argument(
        "--heal-stranded-after",
        type=_positive(float),
        default=d.heal_stranded_after,
        help="seconds a pod of a hard replica waits, its other pods running, before the replica counts as stranded "
        "(moved whole to a domain that holds it with stormtopo.io/heal, else a ReplicaStranded Warning)",
    )
    p.add_argument(
        "--heal-make-room",
        action="store_true",
        help="when no domain has room for a wide replica, move a smaller replica of another opted-in service out of the way",
    )
    p.add_argument(
        "--exact-preemption",
        action="store_true",
        help="hold the pods of an opted-in replica that may preempt (priority above 0) until stormtopo has evicted the fewest"
        " victims it needs in one domain, or found it needs none (evicts pods of lower priority)",
    )
    p.add_argument(
        "--exact-preemption-hold",
        type=_positive(float),
        default=d.exact_preemption_hold,
        help="seconds a replica may be held for exact preemption or narrowing at most (its pods not all created, its class"
        " not read yet), after which it goes to Volcano as it is",
    )
    p.add_argument(
        "--narrow-soft-preemption",
        action=argparse.BooleanOptionalAction,
        default=d.narrow_soft_preemption,
        help="hold the pods of a soft replica that may preempt until stormtopo has looked: where it fits nowhere, its PodGroup"
        " is held hard within the lowest tier where one domain's lower-priority work can make room, for at most 120 s, so that"
        " Volcano's gangpreempt takes its victims within one domain (on by default)",
    )
    p.add_argument(
        "--exact-preemption-fewest",
        choices=("pods", "gpus"),
        default=d.exact_preemption_fewest,
        help="with --exact-preemption: the victims taken are the fewest pods (then GPUs), or the fewest GPUs (then pods);"
        " in a fragmented cluster the two differ",
    )
    p.add_argument(
        "--exact-preemption-victim-namespace",
        action="append",
        default=[],
        metavar="NAMESPACE",
        help="with --exact-preemption: a namespace whose pods may be victims; repeat for more. Without it, any namespace"
        " (the chart always names them, and its admission policy refuses evictions elsewhere)",
    )
    p.add_argument(
        "--volcano-scheduler-configmap",
        type=configmap_ref,
        default=d.volcano_scheduler_configmap,
        metavar="NAMESPACE/NAME",
        help=f"the ConfigMap holding vc-scheduler's configuration (key {SCHEDULER_CONFIG_KEY}), read to say in a Pending replica's"
        " Warning when Volcano runs nothing that preempts for it (no gangpreempt); an empty value reads nothing",
    )
    p.add_argument(
        "--node-tier",
        action="store_true",
        help="keep tier-0 HyperNodes for a short list of nodes current, so a replica one node holds lands on one node (writes HyperNodes)",
    )
    p.add_argument(
        "--node-tier-keep-runs",
        action="store_true",
        help="with --node-tier: keep runs of empty nodes for replicas of whole-node pods (more packing, fewer replicas on one node)",
    )
    p.add_argument(
        "--node-tier-leaf",
        action="append",
        default=[],
        metavar="HYPERNODE",
        help="with --node-tier: a leaf that another writer keeps (Volcano's discovery, GitOps, another manager) which the node tier"
        " may change all the same; repeat for more. Without it such leaves are left as they are",
    )
    p.add_argument(
        "--resync-seconds", type=_positive(float), default=d.resync_seconds, help="seconds between two resyncs of every opted-in object"
    )
    p.add_argument(
        "--hang-seconds",
        type=_positive(float),
        default=d.hang_seconds,
        help="one iteration of a loop running longer than this (or ten of its periods) makes /healthz fail",
    )
    p.add_argument(
        "--spread-give-up",
        type=_positive(float),
        default=d.spread_give_up,
        help="seconds a replica let go with its siblings' domains kept out may stay unplaced before it is held again",
    )
    p.add_argument(
        "--volcano-recheck-seconds",
        type=_positive(float),
        default=d.volcano_recheck_seconds,
        help="seconds between two looks for Volcano's CRDs installed or upgraded after start",
    )
    p.add_argument(
        "--relist-seconds",
        type=_positive(float),
        default=d.relist_seconds,
        help="seconds between two re-lists, which deliver what a watch down for long missed",
    )
    p.add_argument(
        "--drain-seconds",
        type=_positive(float),
        default=d.drain_seconds,
        help="seconds a stopping replica still answers admission reviews, not ready and closing each connection after its"
        " answer, so that the API server's next review goes to a replica that stays",
    )
    return p


def parse_args(argv: list[str] | None = None) -> OperatorConfig:
    d = OperatorConfig()
    p = build_parser()
    a = vars(p.parse_args(argv))
    if a["node_tier_keep_runs"] and not a["node_tier"]:
        p.error("--node-tier-keep-runs: accepted only with --node-tier (it changes the node tier's list)")
    if a["node_tier_leaf"] and not a["node_tier"]:
        p.error("--node-tier-leaf: accepted only with --node-tier (it names leaves the node tier may change)")
    a["node_tier_leaf"] = tuple(a["node_tier_leaf"])
    if (a["exact_preemption_victim_namespace"] or a["exact_preemption_fewest"] != "pods") and not a["exact_preemption"]:
        p.error("--exact-preemption-victim-namespace, --exact-preemption-fewest: accepted only with --exact-preemption")
    if a["exact_preemption_hold"] != d.exact_preemption_hold and not (a["exact_preemption"] or a["narrow_soft_preemption"]):
        p.error("--exact-preemption-hold: accepted only with --exact-preemption or --narrow-soft-preemption (nothing else holds)")
    a["exact_preemption_victim_namespace"] = tuple(a["exact_preemption_victim_namespace"])
    a["register_webhook"] = not a.pop("no_register_webhook")  # the flag says what not to do; the config, what to do
    return OperatorConfig(**a)
