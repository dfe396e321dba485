"""The operator process: kopf handlers, the admission webhook and the metrics endpoint."""

from __future__ import annotations

import asyncio
import hashlib
import logging
import os
import signal
import ssl
import tempfile
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import kopf
from aiohttp import web
from prometheus_client import generate_latest

from stormtopo.core.cooldown import NO_ROOM_RECHECKS
from stormtopo.core.victims import Fewest
from stormtopo.core.vocabulary import AIBRIX
from stormtopo.kube.client import Api, NotFound
from stormtopo.operator import collector, handlers, healing, metrics, webhook
from stormtopo.operator.config import VOLCANO_RECHECK_SECONDS, OperatorConfig, parse_args
from stormtopo.operator.events import IDLE_BEAT, EventRecorder
from stormtopo.operator.explainer import Explainer
from stormtopo.operator.index import Index
from stormtopo.operator.leader import Leadership
from stormtopo.operator.loops import Loop, Loops, backoff, run_every
from stormtopo.operator.node_tier import NODE_TIER_INTERVAL, NODE_TIER_MIN_GAP, NODE_TIER_OFF_INTERVAL, NodeTier
from stormtopo.operator.optin import OptedInList
from stormtopo.operator.reconciliation import Reconciler
from stormtopo.operator.replica import NODES_TTL, PlacementReporter
from stormtopo.operator.room import NodeRoom
from stormtopo.operator.scheduler_conf import VolcanoConf

log = logging.getLogger("stormtopo.operator")


def _certificates(config: OperatorConfig) -> tuple[str, str, bytes]:
    if config.cert_dir:
        d = Path(config.cert_dir)
        return str(d / "tls.crt"), str(d / "tls.key"), (d / "ca.crt").read_bytes()
    # Imported only here: with --cert-dir (as the Helm chart runs it) the operator never loads
    # cryptography: 8 MB less resident after imports (55 -> 47 MB, measured).
    from stormtopo import certificates

    hosts = [config.webhook_url_host or config.webhook_host, "localhost"]
    if config.webhook_service:
        hosts += config.webhook_service.hosts
    ca = certificates.new_ca("stormtopo-webhook-ca")
    serving = certificates.new_serving_cert(ca, "stormtopo-webhook", hosts)
    d = Path(tempfile.mkdtemp(prefix="stormtopo-webhook-"))
    (d / "tls.crt").write_bytes(serving.cert_pem)
    (d / "tls.key").write_bytes(serving.key_pem)
    (d / "tls.key").chmod(0o600)
    return str(d / "tls.crt"), str(d / "tls.key"), ca.cert_pem


class CertificateReloader:
    """Keeps a serving SSLContext on the certificate files as they change on disk.

    A mounted Secret (helm upgrade, cert-manager renewal) changes under a running pod. Loading the new
    pair into the same SSLContext takes effect at the next handshake: no restart, no dropped listener.
    Files are compared by content, not mtime: kubelet swaps a symlink, which can keep old mtimes."""

    def __init__(self, context: ssl.SSLContext, cert_file: str, key_file: str, interval: float = 5.0) -> None:
        self.context = context
        self.cert_file = cert_file
        self.key_file = key_file
        self.interval = interval
        self.loaded = self._digest()
        self.reloads = 0

    def _digest(self) -> str:
        digest = hashlib.sha256()
        for name in (self.cert_file, self.key_file):
            digest.update(Path(name).read_bytes())
        return digest.hexdigest()

    def reload_if_changed(self) -> bool:
        """Load the files if they differ from what is loaded; a half-written pair is retried next time."""
        try:
            current = self._digest()
            if current == self.loaded:
                return False
            self.context.load_cert_chain(self.cert_file, self.key_file)
        except (OSError, ssl.SSLError) as exc:  # e.g. the certificate replaced but not yet its key
            log.warning("webhook certificate %s not reloaded yet: %s", self.cert_file, exc)
            return False
        self.loaded = current
        self.reloads += 1
        log.info("webhook certificate reloaded from %s", self.cert_file)
        return True

    async def check(self) -> None:
        """One look at the files (run every `interval` by the operator's loops)."""
        await asyncio.to_thread(self.reload_if_changed)

    async def run(self) -> None:
        await run_every(Loop("certificate-reloader", self.interval, time.monotonic()), self.interval, self.check)


def detect_volcano(index: Index) -> list[dict[str, Any]] | None:
    """Volcano's PodGroup fields, and its HyperNodes listed (for the event loop to load: Index.prime); None while
    the HyperNode CRD is missing. API calls: run on a thread.

    Without Volcano installed yet (day one) the operator still starts: the webhook serves, requests
    that need a missing field get the "Volcano too old" Event, and this runs again until it is there."""
    index.detect_volcano_fields()  # a missing PodGroup CRD reads as no topology fields
    try:
        return index.list_hypernodes()
    except NotFound:
        log.warning("HyperNode CRD (topology.volcano.sh) not installed: is Volcano? Checking again soon")
        return None


class VolcanoWatch:
    """Re-detect Volcano's capabilities (an upgrade adds fields) and load HyperNodes once their CRD
    appears. A failure (the API server restarting) propagates to the loop, which retries."""

    def __init__(self, index: Index, primed: bool) -> None:
        self.index = index
        self.primed = primed

    async def check(self) -> None:
        if self.primed:
            await asyncio.to_thread(self.index.detect_volcano_fields)
            return
        listed = await asyncio.to_thread(detect_volcano, self.index)
        if listed is not None:  # loaded here, on the event loop, which the index belongs to
            self.index.prime(listed)
            await self.index.build_tree()
            self.primed = True
            log.info("Volcano's HyperNode CRD found: %d HyperNodes loaded", len(self.index.hypernodes))


async def watch_volcano(index: Index, primed: bool, interval: float = VOLCANO_RECHECK_SECONDS) -> None:
    """VolcanoWatch on its own, forever (the operator runs it among its loops)."""
    await run_every(Loop("volcano-detection", interval, time.monotonic()), interval, VolcanoWatch(index, primed).check)


def health_response(loops: Loops) -> web.Response:
    """/healthz: every loop's last completed iteration, as JSON; 500 when one is stuck or has died, so
    that the kubelet restarts a replica that has quietly stopped working."""
    ok, report = loops.health()
    return web.json_response({"ok": ok, "loops": report}, status=200 if ok else 500)


async def run(config: OperatorConfig) -> None:
    """The operator, in its steps: the cluster's state, the loops and handlers that keep it, the
    webhook, the probes, and kopf's watches; on the way out, the Lease handed over first."""
    if config.kubeconfig:
        os.environ["KUBECONFIG"] = config.kubeconfig  # kopf's own login reads it too
    collector.install()  # slow passes: a full one freezes what survived it, a middle one asks for one (operator/collector.py)
    api = Api(config.kubeconfig)
    index = Index(api)
    loops = Loops(hang=config.hang_seconds)  # every background task, supervised; cancelled on the way out
    await _start_volcano_detection(index, loops, config.volcano_recheck_seconds)
    registry = kopf.OperatorRegistry()
    leadership = Leadership(api if config.leader_elect else None, config.leader_election_namespace, config.identity, config.lease_duration)
    metrics.watch(loops, lambda: leadership.is_leader)
    events = EventRecorder(api, leadership.identity)
    opted_in = OptedInList(api)
    opted_in.follow(loops)  # every replica's pod webhook asks what the lists hold
    explainer = Explainer()  # its own process: see explainer.py
    room = NodeRoom(api, loops)  # every node's free GPUs, by watch, from the first time the leader needs them
    reporter = PlacementReporter(
        index,
        api,
        events,
        explainer,
        room,
        leading=lambda: leadership.is_leader,
        spread_give_up=config.spread_give_up,
        room_hold=config.exact_preemption_hold,
        exact_preemption=config.exact_preemption,
        narrowing=config.narrow_soft_preemption,
        exact_fewest=Fewest(config.exact_preemption_fewest),
        victim_namespaces=frozenset(config.exact_preemption_victim_namespace) or None,
        volcano=VolcanoConf(api, config.volcano_scheduler_configmap),
    )
    operator = handlers.register(
        registry, index, Reconciler(index, api, events, opted_in), reporter, leadership, loops, config.resync_seconds, config.relist_seconds
    )
    loops.supervise("event-poster", IDLE_BEAT, events.run)
    loops.supervise("event-loop-lag", 1.0, metrics.measure_event_loop_lag)
    healer = healing.Healer(
        index,
        api,
        events,
        room,
        lambda: reporter.read_nodes(NODES_TTL),
        config.heal_cooldown,
        recheck=NO_ROOM_RECHECKS * config.heal_interval,
        make_room_enabled=config.heal_make_room,
        leading=lambda: leadership.is_leader,
        max_moving=config.heal_max_moving,
        stranded_after=config.heal_stranded_after,
    )
    loops.every("healing", config.heal_interval, healer.check)
    if config.node_tier:
        bound_or_gone = asyncio.Event()  # an opted-in pod bound or gone: the list is rendered again at once
        index.on_pods_moved = bound_or_gone.set
        node_tier = NodeTier(
            index,
            api,
            room,
            leading=lambda: leadership.is_leader,
            keep_runs=config.node_tier_keep_runs,
            named_leaves=frozenset(config.node_tier_leaf),
            report=events,
            read_nodes=lambda: reporter.read_nodes(NODES_TTL),
        )
        loops.every("node-tier", NODE_TIER_INTERVAL, node_tier.check, wake=bound_or_gone, min_gap=NODE_TIER_MIN_GAP)
    else:
        # Turned off (or never on): what an earlier run's node tier wrote is put back, once, by the leader.
        node_tier_off = NodeTier(index, api, room, leading=lambda: leadership.is_leader, enabled=False, report=events)
        loops.every("node-tier", NODE_TIER_OFF_INTERVAL, node_tier_off.check)
    draining = asyncio.Event()
    ca, webhook_runner = await _serve_webhook(config, index, opted_in, loops, draining.is_set, leadership.leader_known)
    ready = asyncio.Event()
    probes_runner = await _serve_probes(config, loops, ready)
    kopf_ready = asyncio.Event()
    stop = asyncio.Event()

    async def step_down() -> None:
        # What only the leader does ends before the Lease is handed over: a healing pass, a node-tier
        # render or a reconcile still running would decide beside the next leader for the whole drain.
        await loops.stop(LEADING_LOOPS)
        await operator.stop_queues()
        await leadership.release()

    async def stop_work() -> None:
        await loops.stop()
        await operator.close()
        if probes_runner.server is not None:  # a scrape's kept-alive connection is a task kopf would wait 5 s for
            await probes_runner.cleanup()

    drain = Drain(config.drain_seconds, draining, ready, webhook_runner, stop, step_down, stop_work)
    registration = asyncio.create_task(_register_when_watching(config, api, ca, kopf_ready, ready, index, drain))
    try:
        await kopf.operator(registry=registry, clusterwide=True, standalone=True, ready_flag=kopf_ready, stop_flag=stop)
    finally:
        # SIGTERM (after the drain) or cancellation: stop leading and hand the Lease over at once.
        draining.set()
        registration.cancel()
        ready.clear()
        await leadership.release()
        explainer.close()
        await loops.stop()
        await operator.close()
        await room.close()
        await opted_in.close()
        await _close_webhook(webhook_runner)
        if probes_runner.server is not None:
            await probes_runner.cleanup()


class Drain:
    """SIGTERM, as Kubernetes stops a pod: the Lease handed over at once (`step_down`) and not ready (its
    endpoint leaves the webhook Service), the webhook answering for `seconds` more and closing each
    connection after its answer, then closed; only then is kopf stopped. kopf's own stop cancels every
    task of the loop after 5 s, the webhook's connections included: a review in flight would end in EOF,
    which the API server does not retry (and the gate fails closed). Installed once kopf has put its own
    handler in place, so that this one replaces it."""

    def __init__(
        self,
        seconds: float,
        draining: asyncio.Event,
        ready: asyncio.Event,
        webhook: web.AppRunner,
        stop: asyncio.Event,
        step_down: Callable[[], Awaitable[None]],
        stop_work: Callable[[], Awaitable[None]],
    ) -> None:
        self.seconds = seconds
        self.step_down = step_down
        self.stop_work = stop_work
        self.draining = draining
        self.ready = ready
        self.webhook = webhook
        self.stop = stop
        self.task: asyncio.Task[None] | None = None

    def install(self) -> None:
        asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, self.begin)

    def begin(self) -> None:
        if self.task is None:
            self.task = asyncio.get_running_loop().create_task(self.run())

    async def run(self) -> None:
        self.draining.set()
        self.ready.clear()
        log.info("SIGTERM: answering admission reviews for %.0f s more, each connection closed after its answer", self.seconds)
        try:
            await self.step_down()
            await asyncio.sleep(self.seconds)
            await _close_webhook(self.webhook)
        except Exception:  # whatever happens, the operator must stop
            log.exception("closing the webhook failed; stopping all the same")
        finally:
            self.stop.set()
            # kopf waits up to 5 s for every task of the loop to end before it cancels them: ours (the
            # loops, the work queues' workers) never end by themselves, so they are stopped now.
            await self.stop_work()


async def _start_volcano_detection(index: Index, loops: Loops, interval: float) -> None:
    try:
        listed = await asyncio.to_thread(detect_volcano, index)
        if listed is not None:
            index.prime(listed)
            await index.build_tree()  # the first, whole, before the webhook serves: on a thread
        primed = listed is not None
    except Exception:  # the API server not reachable yet: serve anyway, detect later
        log.exception("detecting Volcano's CRDs failed; retrying in %.0f s", interval)
        primed = False
    loops.every("volcano-detection", interval, VolcanoWatch(index, primed).check)


async def _serve_webhook(
    config: OperatorConfig,
    index: Index,
    opted_in: OptedInList,
    loops: Loops,
    draining: Callable[[], bool],
    leader_known: Callable[[], bool] = lambda: True,
) -> tuple[bytes, web.AppRunner]:
    """The admission webhook over TLS, its certificate reloaded as it changes; returns the CA bundle."""
    cert, key, ca = _certificates(config)
    tls = webhook.tls_context(cert, key)
    reloader = CertificateReloader(tls, cert, key)
    loops.every("certificate-reloader", reloader.interval, reloader.check)
    # shutdown_timeout: a review still in flight once the drain is over is not waited for past CLOSE_WAIT
    # (aiohttp's default, 60 s, would outlast the pod's grace period and skip every step after it).
    runner = web.AppRunner(
        webhook.build_app(
            index,
            opted_in,
            draining=draining,
            exact_preemption=config.exact_preemption,
            narrowing=config.narrow_soft_preemption,
            leader_known=leader_known,
        ),
        access_log=None,
        shutdown_timeout=CLOSE_WAIT,
    )
    await runner.setup()
    # reuse_port: replicas on one host can share the webhook port, as endpoints behind one Service do.
    await web.TCPSite(runner, config.webhook_host, config.webhook_port, ssl_context=tls, reuse_port=True).start()
    return ca, runner


CLOSE_WAIT = 1.0  # seconds the webhook's open connections get to deliver their review and be answered
LEADING_LOOPS = ("healing", "node-tier", "resync")  # what only the leader does, stopped before its Lease goes


async def _close_webhook(runner: web.AppRunner) -> None:
    """Stop listening first, then let every connection still open (each closes after its answer while
    draining) deliver its review and be answered, for up to CLOSE_WAIT: closing a connection the API
    server has just opened would fail its review (EOF), which the API server does not retry."""
    if runner.server is None:
        return  # closed already (the drain)
    for site in list(runner.sites):
        await site.stop()
    deadline = time.monotonic() + CLOSE_WAIT
    while runner.server is not None and runner.server.connections and time.monotonic() < deadline:
        await asyncio.sleep(0.05)
    await runner.cleanup()


async def _serve_probes(config: OperatorConfig, loops: Loops, ready: asyncio.Event) -> web.AppRunner:
    """/readyz (once registered and watching), /healthz (every loop alive) and /metrics."""

    async def readyz(_: web.Request) -> web.Response:
        return web.Response(text="ok") if ready.is_set() else web.Response(status=503, text="starting")

    async def healthz(_: web.Request) -> web.Response:
        return health_response(loops)

    async def prometheus(_: web.Request) -> web.Response:
        return web.Response(body=generate_latest(), content_type="text/plain")

    probes = web.Application()
    probes.router.add_get("/readyz", readyz)
    probes.router.add_get("/healthz", healthz)
    probes.router.add_get("/metrics", prometheus)
    runner = web.AppRunner(probes, access_log=None)
    await runner.setup()
    await web.TCPSite(runner, config.metrics_host, config.metrics_port).start()
    return runner


CAUGHT_UP_KINDS = (("StormService", "stormservices"), ("RoleSet", "rolesets"))


async def catch_up(index: Index, api: Api) -> None:
    """The first complete list of what the gate and the placement path read (StormServices, RoleSets),
    a page at a time, into the index: ready means caught up, not merely watching. A failure (the API
    server away) is logged and retried after a backoff, for as long as it takes: never ready before."""
    failures = 0
    while True:
        try:
            added = 0
            for kind, plural in CAUGHT_UP_KINDS:
                pages = api.pages(api.path(AIBRIX, plural))
                while (page := await asyncio.to_thread(next, pages, None)) is not None:
                    added += index.catch_up(kind, page)
                    await asyncio.sleep(0)  # the webhooks and probes share this loop
            index.caught_up = True
            log.info("caught up: %d StormServices and RoleSets listed that the watch had not delivered yet", added)
            return
        except Exception as exc:
            failures += 1
            delay = backoff(failures)
            log.warning("the first list of StormServices and RoleSets failed (%s); retrying in %.0f s", exc, delay)
            await asyncio.sleep(delay)


async def _register_when_watching(
    config: OperatorConfig, api: Api, ca: bytes, kopf_ready: asyncio.Event, ready: asyncio.Event, index: Index, drain: Drain
) -> None:
    """Once kopf watches and the index has caught up: register the admission objects (unless Helm
    manages them), then say ready."""
    await kopf_ready.wait()
    drain.install()  # kopf's handler is in place by now: SIGTERM drains the webhook before kopf stops
    await catch_up(index, api)
    if config.register_webhook:
        ref = config.webhook_service
        service = (ref.namespace, ref.name, ref.port) if ref else None
        label_policy = await asyncio.to_thread(webhook.served_label_policy, api)
        configuration = webhook.configuration(ca, url_base=config.webhook_url_base, service=service, label_policy=label_policy)
        await asyncio.to_thread(webhook.register, api, configuration)
    # Everything loaded so far (kopf, aiohttp, the modules, the first lists) lives as long as the
    # process: out of the collector's reach, a full collection no longer scans it. Measured during
    # bench --admission: full collections of 20-141 ms, each stalling every admission in flight.
    collector.freeze()
    if drain.task is None:  # not ready again once SIGTERM has come
        ready.set()
    log.info("stormtopo operator ready; webhook on %s:%s", config.webhook_host, config.webhook_port)


def main(argv: list[str] | None = None) -> None:
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    # kopf logs every handler run at INFO; at thousands of events that is most of the operator's CPU.
    logging.getLogger("kopf.objects").setLevel(logging.WARNING)
    asyncio.run(run(parse_args(argv)))
