"""The placement path's shell: for a replica whose pods or PodGroup changed, read its snapshot, call the
planner (core/replica.py), execute what it returns.

Volcano keeps the chosen HyperNode in scheduler memory and says only "network topology not satisfied";
the planner says it in domain terms. Explanations (every node's free GPUs, a packing search) run in a
queue and a worker process of their own, so a release never waits behind one.

With a spread tier (core/spread.py) the shell also keeps, per StormService, the replicas it let go that
are not placed yet: read and written around the plan with no await between, so two workers never let
two replicas of one service go together.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field, replace

from stormtopo.core.narrowing import narrows
from stormtopo.core.placement import is_held, is_held_for_room
from stormtopo.core.preempting import GROUP_ROUNDS, HOLD_MAX, RoomClaim, RoomReading, kept_claim, room_claim, room_left, unclaimed
from stormtopo.core.replica import (
    Explain,
    ReplicaMemory,
    ReplicaPlan,
    ReplicaSnapshot,
    is_unschedulable,
    plan_explained,
    plan_replica,
    replica_state,
)
from stormtopo.core.request import is_opted_in
from stormtopo.core.spread import SETTLE_SECONDS, SPREAD_GIVE_UP, SpreadMemory
from stormtopo.core.topology.tree import Topology
from stormtopo.core.victims import Fewest
from stormtopo.kube.client import Api
from stormtopo.operator import metrics
from stormtopo.operator.events import Report
from stormtopo.operator.explainer import Explainer
from stormtopo.operator.index import Index, Key, slim_listed_pods
from stormtopo.operator.room import NodeRoom
from stormtopo.operator.scheduler_conf import VolcanoConf
from stormtopo.operator.victim_groups import VictimGroups
from stormtopo.operator.workqueue import WorkQueue
from stormtopo.operator.writer import execute

log = logging.getLogger(__name__)

NODES_TTL = 30.0  # seconds a reading of the nodes is reused for the switch tree and releases
NODES_FRESH = 5.0  # a reading this recent knows every node: one it lacks is not in the cluster
LEAVING_TIMEOUT = 5.0  # seconds the next held replica waits for the last one's victims to show as leaving
GROUP_RETRY = 2.0  # seconds before a preemption whose victims' PodGroups went unread is planned again
# Seconds a held replica's plan waits for the free-room reading's first list (before it takes the room lock); then
# it is planned again shortly (its hold's limit lets it go without the reading).
ROOM_READING_WAIT = 5.0


@dataclass
class PlacementReporter:
    index: Index
    api: Api  # what the planner decides is written, and what the index lacks is read, through this
    report: Report
    explainer: Explainer
    room: NodeRoom  # the free GPUs an explanation plans over
    leading: Callable[[], bool] = lambda: True  # a deposed leader posts no queued explanation
    spread_give_up: float = SPREAD_GIVE_UP  # --spread-give-up (core/spread.py)
    room_hold: float = HOLD_MAX  # --exact-preemption-hold (core/preempting.py)
    exact_preemption: bool = False  # --exact-preemption
    narrowing: bool = False  # --narrow-soft-preemption (core/narrowing.py)
    exact_fewest: Fewest = Fewest.PODS  # --exact-preemption-fewest
    victim_namespaces: frozenset[str] | None = None  # --exact-preemption-victim-namespace (None: any)
    volcano: VolcanoConf | None = None  # --volcano-scheduler-configmap: does anything preempt for a topology job
    _planner: ThreadPoolExecutor = field(default_factory=lambda: ThreadPoolExecutor(1, thread_name_prefix="room-planner"))
    _room_lock: asyncio.Lock = field(default_factory=asyncio.Lock)  # held replicas are planned one at a time
    _claims: dict[Key, RoomClaim] = field(default_factory=dict)  # replica -> the room its victims free (core/preempting.py)
    _memory: dict[Key, ReplicaMemory] = field(default_factory=dict)  # only replicas with something to remember
    _asks: dict[Key, tuple[Explain, Topology]] = field(default_factory=dict)  # explanations waiting for the worker
    _explanations: WorkQueue[Key] | None = None
    _reading_nodes: asyncio.Lock = field(default_factory=asyncio.Lock)
    wake: Callable[[Key], None] | None = None  # queues a replica's placement check (the operator's placements queue)
    # (namespace, StormService) -> its spread, as the planner returned it (only services with something to keep)
    _spread: dict[Key, SpreadMemory] = field(default_factory=dict)
    _rechecks: dict[Key, asyncio.TimerHandle] = field(default_factory=dict)
    _groups: VictimGroups | None = None  # the victims' PodGroups exact preemption reads (victim_groups.py)

    async def replica_changed(self, key: Key) -> None:
        """From the placements queue, a few replicas at a time: a pod of replica `key` (namespace,
        RoleSet) was admitted, bound or deleted, or its PodGroup changed."""
        snapshot = await self._snapshot(key)
        if snapshot is None:
            return
        memory = self._memory.get(key, ReplicaMemory())
        plan = self._plan(snapshot, memory)
        if plan.needs_nodes:  # a pod bound on a node the last reading lacked: read again, once
            await self.read_nodes(NODES_FRESH)
            snapshot = self.index.replica_snapshot(key, time.monotonic(), NODES_FRESH) or snapshot
            plan = self._plan(replace(snapshot, nodes=replace(snapshot.nodes, fresh=True)), memory)
        if plan.needs_all_pods:  # pods created before the opt-in were never admitted: read them all
            pods = await asyncio.to_thread(self.api.pods_of_group, *key)
            snapshot = replace(snapshot, pods=slim_listed_pods(pods), all_pods=True)
            memory = replace(memory, pods_read_at=snapshot.now)
            plan = self._plan(snapshot, memory)
        if plan.needs_room:  # a spread release, or a held replica's preemption: where is there room, and who holds it?
            if any(is_held_for_room(p) for p in snapshot.pods):
                await self._preempt_for(key)
                return
            plan = self._plan(replace(snapshot, free_gpus=await self.room.free_gpus()), memory)
        await self._carry_out(key, snapshot, plan)  # (remembers what the plan let go before its first await)
        if plan.explain is not None:
            self._asks[key] = (plan.explain, snapshot.topology)
            self._explanation_queue().add(key)

    def _plan(self, snapshot: ReplicaSnapshot, memory: ReplicaMemory) -> ReplicaPlan:
        """The planner over the snapshot and the settling replicas as remembered now, not before an await."""
        spread = self._spread.get(_service_of(snapshot), SpreadMemory())
        return plan_replica(
            replace(
                snapshot,
                settling=spread.settling,
                unspread=spread.unspread,
                spread_give_up=self.spread_give_up,
                room_hold=self.room_hold,
                exact_preemption=self.exact_preemption,
                narrowing=self.narrowing,
                exact_fewest=self.exact_fewest,
                wall=time.time(),
            ),
            memory,
        )

    async def _preempt_for(self, key: Key) -> None:
        """A held replica's plan (core/preempting.py), one replica at a time: read the room, plan (the fewest
        victims: a search over every domain up to its budget, on a thread of its own, so a burst of held
        replicas never takes the API calls' threads), evict and let go; then wait, briefly, until the reading
        shows the victims leaving. The room taken is kept from the next held replica's reading until this
        one is placed, so that none takes the same victims again or counts their room as its own."""
        try:  # outside the lock: while the first list is under way (the API server slow), no held replica waits on another
            await asyncio.wait_for(self.room.free_gpus(), ROOM_READING_WAIT)
        except TimeoutError:
            log.info("the free-room reading is not listed yet; %s is planned again shortly", key[1])
            self._recheck_in(key, GROUP_RETRY)
            return
        async with self._room_lock:
            snapshot = await self._snapshot(key)  # read again: the replica before it changed the room
            if snapshot is None or not self.leading():
                return
            memory = self._memory.get(key, ReplicaMemory())
            free = self.room.free_now()  # (listed above: current to the last event of its watch)
            # First without who holds the room: a replica that fits now is let go without it (a plan over every bound
            # GPU pod of the cluster: most of a plan's time at 16,384 nodes).
            reading = self._room_reading(key, free, holders=False)
            for round in range(1, GROUP_ROUNDS + 2):  # the victims' PodGroups read as the plan asks (core/preempting.py)
                snapshot = replace(snapshot, free_gpus=free, room=reading)
                plan = await asyncio.get_running_loop().run_in_executor(self._planner, self._plan, snapshot, memory)
                if plan.needs_room and reading.holders is None:  # it fits nowhere now: who holds the room, then again
                    reading = self._room_reading(key, free)
                    snapshot = replace(snapshot, room=reading)
                    plan = await asyncio.get_running_loop().run_in_executor(self._planner, self._plan, snapshot, memory)
                if not plan.needs_groups or not self.leading():
                    break
                groups = await self._victim_groups().read(plan.needs_groups)
                if groups is None:  # no answer: nothing is evicted on a half-read cluster; planned again shortly
                    log.info("the PodGroups of %s's victims could not be read; its preemption is planned again shortly", key[1])
                    self._recheck_in(key, GROUP_RETRY)
                    return
                reading = replace(reading, groups={**reading.groups, **groups}, groups_read=round >= GROUP_ROUNDS)
            if await self._no_gangpreempt(plan):  # a narrowing only where Volcano runs gangpreempt, as it is now
                snapshot = replace(snapshot, room=replace(reading, gangpreempt=False))
                plan = await asyncio.get_running_loop().run_in_executor(self._planner, self._plan, snapshot, memory)
            if not self.leading():
                return  # deposed while it planned: the new leader plans again
            claim = room_claim(plan.writes, time.monotonic(), self.room_hold)
            kept = kept_claim(self._claims.pop(key, None), claim, plan.memory.room, time.monotonic())
            if kept is not None:
                self._claims[key] = kept
            await self._carry_out(key, snapshot, plan)
            if claim is not None:
                await self._until_leaving(claim.gpus)

    async def _no_gangpreempt(self, plan: ReplicaPlan) -> bool:
        """Whether a plan that narrows a replica's PodGroup (core/narrowing.py) should not: Volcano's configuration,
        read now (one small read per narrowing, rare: a replica that must preempt), runs no gangpreempt."""
        if not self.narrowing or self.volcano is None or not narrows(plan.writes):
            return False
        conf = await self.volcano.scheduler(fresh_within=0.0)
        return conf is not None and not conf.preempts_for_topology

    def _room_reading(self, key: Key, free: Mapping[str, int], holders: bool = True) -> RoomReading:
        """The free-room reading for replica `key`: the room of pods being deleted counts as free (it is on its
        way: no plan takes more for it), less the room this leader took or counts on for another held replica
        not placed yet, and less the victims that one counts on; victims only in the namespaces given
        (`holders` False: who holds the room left unread)."""
        now = time.monotonic()
        settled = {  # placed or gone, as the index has them now: its room is its own, or free
            replica
            for replica in self._claims
            if (found := self.index.replica_snapshot(replica, now)) is None or replica_state(found).complete or not found.live_pods()
        }
        room, self._claims, others = room_left(key, self._claims, settled, free, self.room.releasing_now(), now)
        claimed_nodes = frozenset(node for claim in others for node in claim.gpus)
        if not holders:
            return RoomReading(room, None, {}, self.room.facts_now(), self.victim_namespaces, claimed_elsewhere=claimed_nodes)
        holding = unclaimed(self.room.holders_now(), others)  # victims another replica counts on: not this one's
        facts = self.room.facts_now()
        return RoomReading(room, holding, self.room.gangs_now(), facts, self.victim_namespaces, claimed_elsewhere=claimed_nodes)

    async def _until_leaving(self, claim: Mapping[str, int], timeout: float = LEAVING_TIMEOUT) -> None:
        """Until the reading shows the victims' room leaving (their deletion seen by its watch), or `timeout`."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            releasing = self.room.releasing_now()
            if all(releasing.get(node, 0) >= gpus for node, gpus in claim.items()):
                return
            await asyncio.sleep(0.05)

    async def _snapshot(self, key: Key) -> ReplicaSnapshot | None:
        snapshot = self.index.replica_snapshot(key, time.monotonic(), NODES_FRESH)
        if snapshot is None or not is_opted_in(snapshot.stormservice["metadata"].get("annotations")):
            return snapshot  # (held pods of a service that opted out go free: no node is needed)
        # Nodes are read only where the tree depends on them, or to pin a held pod by hostname.
        if snapshot.nodes.shapes_tree or any(is_held(p) or is_held_for_room(p) for p in snapshot.pods):
            await self.read_nodes(NODES_TTL)
            snapshot = self.index.replica_snapshot(key, time.monotonic(), NODES_FRESH)
        return snapshot

    async def read_nodes(self, older_than: float) -> None:
        """Every node's labels into the index, for the tree and releases: the free-room reading's own mapping (a
        watch of the nodes; their one owner), not a copy, with the version of the labels the tree reads, so that
        no other label's change rebuilds it. At most every `older_than` seconds: at 16,384 nodes a tree rebuilt at
        each node come or gone would cost the event loop tens of ms each (a second with regexMatch leaves). One
        read at a time: the placement workers that find it stale together wait for the one reading."""
        async with self._reading_nodes:
            if time.monotonic() - self.index.nodes_read_at <= older_than:
                return  # another worker just read them
            started = time.monotonic()
            labels = await self.room.node_labels()
            self.index.set_nodes(labels, started, self.room.label_version(self.index.node_label_keys()))
            await self.index.build_tree()  # (over labels that changed, a whole build: not on the loop)

    async def _carry_out(self, key: Key, snapshot: ReplicaSnapshot, plan: ReplicaPlan) -> None:
        self._remember(key, plan.memory_before_writes(self._memory.get(key, ReplicaMemory())))
        service = _service_of(snapshot)
        spread = plan.spread_memory(self._spread.get(service, SpreadMemory()))
        if spread is not None and plan.spread_kept_first:  # before the first await (ReplicaPlan.spread_kept_first)
            self._keep_spread(service, spread)
        metrics.TOPOLOGY_VIOLATIONS.inc(plan.violations)
        if plan.recheck_in is not None and self.wake is not None:  # before the writes: one refused is planned again then
            self._recheck_in(key, min(plan.recheck_in, SETTLE_SECONDS) + 0.5)
        await execute(self.api, plan.all_writes(snapshot.stormservice), self.report)
        if spread is not None and not plan.spread_kept_first:
            self._keep_spread(service, spread)
        self._remember(key, plan.memory)  # (ReplicaPlan.memory_before_writes)
        self._wake_siblings(key, plan)
        if plan.first is not None:
            if plan.first.tier is not None:
                metrics.REPLICAS_BY_TIER.labels(str(plan.first.tier)).inc()
            if plan.first.seconds is not None:
                metrics.PLACEMENT_SECONDS.observe(plan.first.seconds)

    def _remember(self, key: Key, memory: ReplicaMemory) -> None:
        was = self._memory.get(key, ReplicaMemory()).unsatisfiable
        if memory == ReplicaMemory() or key not in self.index.rolesets:  # nothing to keep, or deleted meanwhile
            self._memory.pop(key, None)
        else:
            self._memory[key] = memory
        if was != memory.unsatisfiable:
            metrics.PENDING_GANGS.set(sum(m.unsatisfiable for m in self._memory.values()))

    def _keep_spread(self, service: Key, spread: SpreadMemory) -> None:
        if spread.empty:
            self._spread.pop(service, None)
        else:
            self._spread[service] = spread

    def _wake_siblings(self, key: Key, plan: ReplicaPlan) -> None:
        """Plan again the siblings this replica's placement lets go (this replica's own look again, once the
        sibling it waits for no longer counts or its hold ends, was asked for before the writes)."""
        if self.wake is None:
            return
        for name in plan.wake:
            self.wake((key[0], name))

    def _victim_groups(self) -> VictimGroups:
        if self._groups is None:
            self._groups = VictimGroups(self.api)
        return self._groups

    def _recheck_in(self, key: Key, seconds: float) -> None:
        """Plan the replica again in `seconds` (one timer per replica: the later ask replaces the earlier)."""
        previous = self._rechecks.pop(key, None)
        if previous is not None:
            previous.cancel()
        self._rechecks[key] = asyncio.get_running_loop().call_later(seconds, self._recheck, key)

    def _recheck(self, key: Key) -> None:
        self._rechecks.pop(key, None)
        if self.wake is not None:
            self.wake(key)

    def _explanation_queue(self) -> WorkQueue[Key]:
        if self._explanations is None:
            # One worker: explanations queue behind each other (the worker process takes one at a time).
            self._explanations = WorkQueue("explanations", self._explain, workers=1)
            self._explanations.start()
        return self._explanations

    async def _explain(self, key: Key) -> None:
        ask = self._asks.pop(key, None)
        if ask is None or not self.leading():
            return  # forgotten meanwhile, or no longer this replica's to say
        explain, topology = ask
        free = await self.room.free_gpus(taking_new_pods=False)
        holders = self.room.holders_now()
        volcano = await self.volcano.scheduler() if self.volcano is not None and explain.priority is not None else None
        pending = await self.explainer.explain(explain, topology, free, holders, self.room.gangs_now(), volcano)
        snapshot = self.index.replica_snapshot(key, time.monotonic())
        memory = self._memory.get(key, ReplicaMemory())
        if snapshot is None or snapshot.request is None or not self.leading():
            return  # deleted, opted out or deposed while it was explained
        if replica_state(snapshot).complete or not is_unschedulable(snapshot.podgroup):
            self._remember(key, replace(memory, unsatisfiable=False))  # placed meanwhile: the answer is stale
            return
        await self._carry_out(key, snapshot, plan_explained(key, explain.request, pending, memory, time.monotonic()))

    def forget(self, key: Key) -> None:
        """A replica was deleted: drop what was said and checked about it."""
        self._asks.pop(key, None)
        self._remember(key, ReplicaMemory())
        timer = self._rechecks.pop(key, None)
        if timer is not None:
            timer.cancel()
        for service, spread in list(self._spread.items()):  # (only services whose spread is under way)
            if service[0] == key[0] and spread.concerns(key[1]):
                self._keep_spread(service, spread.without(key[1]))


def _service_of(snapshot: ReplicaSnapshot) -> Key:
    meta = snapshot.stormservice["metadata"]
    return meta.get("namespace", ""), meta["name"]
