"""Healing's shell, in the placement path's shape: every few seconds, for each StormService, what the
index holds of it is read and the pass's planner (core/heal_pass.py) says whether to look at it; a
service looked at is read from the API, planned (core/healing.py), and the plan executed: its move
records, its Events and PodGroups, then its evictions (operator/writer.py, the writer and its evictor).
The shell keeps only what the planners return (HealerMemory) and hands the pass's state (HealPass)
from one service to the next.

A cluster where every replica landed within its request costs one pass over the index. A service
looked at costs a read of the StormService itself (the move table on the API server, not the index's
copy, decides what may move), a list of its own pods and of its namespace's PodDisruptionBudgets; one
reading of every node's free GPUs (operator/room.py, shared with making room and the node tier) is
shared by the whole pass.

A move is begun only once its record is on the StormService, written conditionally on the version
the plan was made from: two leaders, or a pass planned from a stale read, cannot both begin one.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field, replace
from typing import Any

from stormtopo.core.cluster_moves import MAX_MOVING
from stormtopo.core.cooldown import COOLDOWN, NO_ROOM_RECHECK
from stormtopo.core.evictions import EvictionFailure, Failure, plan_evicted
from stormtopo.core.heal_pass import (
    HealerMemory,
    HealPass,
    Look,
    ServiceRead,
    ServiceReading,
    begin_pass,
    plan_look,
    plan_notice,
    plan_service,
)
from stormtopo.core.heal_plan import HealMemory, HealPlan
from stormtopo.core.heal_snapshot import HealSnapshot
from stormtopo.core.lending import MakeRoom
from stormtopo.core.replica_pods import Replica
from stormtopo.core.room import Resident
from stormtopo.core.room_search import WIDE_TRIED, RoomSearch, lenders, made_room, next_offer, wide_waiting
from stormtopo.core.stranded import STRANDED_AFTER
from stormtopo.core.topology.node_tier import node_tier_members
from stormtopo.core.topology.tree import Topology
from stormtopo.core.vocabulary import AIBRIX, MOVES_ANNOTATION, STORMSERVICE_LABEL
from stormtopo.core.writes import EvictPod, RecordMove, Write
from stormtopo.kube.client import Api, ApiError, BudgetRefused, Conflict, Forbidden, Invalid
from stormtopo.operator import metrics
from stormtopo.operator.events import Report
from stormtopo.operator.index import Index, Key
from stormtopo.operator.loops import yielding
from stormtopo.operator.room import NodeRoom
from stormtopo.operator.writer import evict, execute, record_moves

__all__ = ["Healed", "Healer", "record_moves"]

log = logging.getLogger("stormtopo.healing")

REFUSED = (Forbidden, Invalid)  # RBAC, or an admission webhook or policy: not a budget, not an outage


def failure_of(error: BaseException) -> Failure:
    """What the API's answer to an eviction was, for core/evictions.py to decide on. Anything but a budget's
    refusal or a refusal proper (RBAC, API priority and fairness, a server error) leaves the move under way, and
    the next pass resumes it."""
    if isinstance(error, ApiError) and error.namespace_terminating:
        return Failure.TERMINATING
    if isinstance(error, BudgetRefused):
        return Failure.BUDGET
    return Failure.REFUSED if isinstance(error, REFUSED) else Failure.OTHER


def _message(error: BaseException) -> str:
    return error.message if isinstance(error, ApiError) else str(error)


@dataclass(frozen=True)
class Healed:
    """One service healed: its plan (None: nothing planned, or its records could not be written), the
    pass as it goes on, and the error that cut it short, if one did (the pass's state survives it)."""

    plan: HealPlan | None
    heal_pass: HealPass
    error: Exception | None = None


@dataclass
class Healer:
    index: Index
    api: Api
    report: Report
    room: NodeRoom  # every node's free and allocatable GPUs, followed by watch (room.py)
    read_nodes: Callable[[], Awaitable[None]]  # hands the index the free-room reading's node labels, for the tree
    cooldown: float = COOLDOWN
    recheck: float = NO_ROOM_RECHECK  # seconds: NO_ROOM_RECHECKS times the interval its loop runs at
    make_room_enabled: bool = False  # --heal-make-room
    leading: Callable[[], bool] = lambda: True
    max_moving: int = MAX_MOVING  # --heal-max-moving: replicas moving at once in the whole cluster
    stranded_after: float = STRANDED_AFTER  # --heal-stranded-after
    _memory: HealerMemory = field(default_factory=HealerMemory)  # as the planners returned it (core/heal_pass.py)

    async def check(self) -> None:
        """One pass over the StormServices (a loop of the operator runs it every --heal-interval)."""
        if not self.leading():
            return
        services = self.index.stormservices_in_play()  # (never a tenant that did not opt in)
        heal_pass, self._memory = await asyncio.to_thread(  # every lender's records read: off the loop
            begin_pass, self._memory, services.values(), self.index.pods_freed, time.time(), self.recheck, self.stranded_after
        )
        tiers, topology = self.index.cluster_tiers(), self.index.topology()
        async for key, stormservice in yielding(services.items()):
            if not self.leading():  # lost during the pass (each read may wait 30 s on a slow API server):
                return  # another replica may lead now, and decides from its own reading
            reading = self._reading(key, stormservice)
            look, self._memory = plan_look(heal_pass, self._memory, reading, tiers, topology)
            if look is Look.READ_ROOM:  # (asking starts the reading: only once a service needs it)
                heal_pass = replace(heal_pass, listed=self.room.listed())
                look, self._memory = plan_look(heal_pass, self._memory, reading, tiers, topology)
            if look is Look.NOT_YET:
                break
            if look is Look.NOTICE:
                try:
                    heal_pass = await self.notice_stranded(key, heal_pass)
                except Exception:
                    log.exception("checking %s/%s for a stranded replica failed; trying again at the next pass", *key)
                    self._memory = self._memory.unnoticed(key)  # else the next pass is quiet while these pods wait
            elif look is Look.HEAL:
                healed = await self.heal(key, heal_pass)
                heal_pass = healed.heal_pass
                if healed.error is not None:  # one service's failure is logged; the others still get their pass
                    log.error("healing %s/%s failed; trying again at the next pass", *key, exc_info=healed.error)
        if heal_pass.no_room and self.make_room_enabled and self.leading():
            try:
                await self.make_room(heal_pass)
            except Exception:
                log.exception("making room failed; trying again at the next pass")
        self._memory = self._memory.kept(services.keys(), heal_pass.now, self.recheck)
        metrics.HEALING_PASSES.inc()

    async def heal(
        self, key: Key, heal_pass: HealPass, make_room: MakeRoom | None = None, allocatable: dict[str, int] | None = None
    ) -> Healed:
        """Read one service, plan it and carry the plan out."""
        try:
            read = await self.read(key, heal_pass, make_room, allocatable)
            if read is None:
                return Healed(None, heal_pass)
            # The packing search is CPU work: on a thread, the loop still answers admissions between slices.
            planned = await asyncio.to_thread(plan_service, heal_pass, read, self._memory.of(key))
            snapshot, plan, heal_pass = planned.snapshot, planned.plan, planned.heal_pass
            self._memory = self._memory.healed(key, plan.memory)
            if not self.leading():  # deposed while it read: the next leader decides from its own reading
                return Healed(None, heal_pass)
            # The move's target is taken for the rest of the pass: as the index has it once recorded.
            taken: list[tuple[list[ServiceReading], Topology]] = []

            def recorded() -> None:
                if plan.moving is not None:
                    taken.append((self._readings(only=key), self.index.topology()))

            try:
                done = await self.carry_out(key, snapshot, plan, recorded)
            finally:
                heal_pass = heal_pass.moved(*taken[0]) if taken else heal_pass
            if not done:
                return Healed(None, heal_pass)
        except Exception as error:
            return Healed(None, heal_pass, error)
        return Healed(plan, heal_pass)

    def _reading(self, key: Key, stormservice: Mapping[str, Any]) -> ServiceReading:
        """A StormService with its RoleSets and their admitted pods, from the index (no API read)."""
        replicas = tuple((r, tuple(self.index.pods_of(key[0], r["metadata"]["name"]))) for r in self.index.rolesets_of(*key))
        return ServiceReading(key, stormservice, replicas, self.index.roleset_prefix_shared(*key))

    def _readings(self, only: Key) -> list[ServiceReading]:
        stormservice = self.index.stormservices.get(only)
        return [self._reading(only, stormservice)] if stormservice is not None else []

    async def _all_readings(self) -> tuple[ServiceReading, ...]:
        """Every StormService in play, read from the index: what the pass's free room sets aside for moves."""
        return tuple([self._reading(key, stormservice) async for key, stormservice in yielding(self.index.stormservices_in_play().items())])

    async def notice_stranded(self, key: Key, heal_pass: HealPass) -> HealPass:
        read = await self.read(key, heal_pass)
        if read is None:
            return heal_pass
        writes, memory, heal_pass = plan_notice(heal_pass, read, self._memory.stranded.get(key, HealMemory()))
        self._memory = self._memory.noticed(key, memory)
        await execute(self.api, writes, self.report)
        return heal_pass

    async def make_room(self, heal_pass: HealPass) -> None:
        """For this pass's wide replicas with nowhere to go, one replica of another service that lends
        room moved out of the way (core/room.py, core/heal_pass.py): each resident the search offers is
        read and planned as its own service; one its own plan refuses is followed by the next."""
        now = time.time()
        priorities = dict(self.index.cluster_tiers().priority_values)
        waiting = wide_waiting(heal_pass.no_room, self.index.stormservices_in_play().values(), now, self.cooldown, priorities)
        if not waiting or heal_pass.free is None:
            return
        residents = await self._residents({key for key, _, _ in heal_pass.no_room}, now)
        if not residents:
            return
        allocatable, nodes = await self.room.allocatable_gpus(), await self.room.node_facts()
        listed = frozenset(node_tier_members(self.index.hypernodes.values()).values())  # the node tier's short list
        search = RoomSearch(waiting[:WIDE_TRIED], tuple(residents), allocatable, nodes, self.index.topology(), listed, priorities)
        while heal_pass.free is not None and (offer := await asyncio.to_thread(next_offer, search, heal_pass.free)) is not None:
            healed = await self.heal(offer.lender, heal_pass, offer.order, allocatable)
            if healed.error is not None:
                raise healed.error
            heal_pass = healed.heal_pass
            if made_room(healed.plan):
                room = offer.room
                log.info(
                    "%s moves to %s to make room in %s for %s",
                    room.resident.replica,
                    room.to.switch.name,
                    offer.order.frees,
                    offer.order.wide,
                )
                return  # its record (the lender's move, "for" this replica) now limits the next pass
            search = offer.refused()

    async def _residents(self, waiting: set[Key], now: float) -> list[Resident]:
        """Replicas of other services that lend room and may make it: read from the index on the loop,
        judged on a thread (tens of microseconds each, thousands of them)."""
        tiers, topology = self.index.cluster_tiers(), self.index.topology()
        found = [
            (stormservice, roleset, self.index.pods_of(key[0], roleset["metadata"]["name"]))
            async for key, stormservice in yielding(self.index.stormservices_in_play().items())
            if key not in waiting and self.index.roleset_prefix_shared(*key) is None  # else its pods are not movable
            for roleset in self.index.rolesets_of(*key)
        ]
        return await asyncio.to_thread(lenders, found, tiers, topology, now, self.cooldown)

    async def read(
        self, key: Key, heal_pass: HealPass, make_room: MakeRoom | None = None, allocatable: dict[str, int] | None = None
    ) -> ServiceRead | None:
        """What the planner needs of one service, read now; the pass's reading of free room is taken at
        its first service read."""
        if self.index.known_nodes(fresh=False).shapes_tree:  # HyperNodes select nodes by pattern or label
            await self.read_nodes()
        namespace, name = key
        stormservice = await asyncio.to_thread(self.api.get, AIBRIX, "stormservices", namespace, name)
        if stormservice is None:
            return None
        self.index.observe("StormService", "MODIFIED", stormservice)
        pods = await asyncio.to_thread(
            self.api.raw_list, f"/api/v1/namespaces/{namespace}/pods", labelSelector=f"{STORMSERVICE_LABEL}={name}"
        )
        budgets = await asyncio.to_thread(self.api.disruption_budgets, namespace)
        free: dict[str, int] | None = None
        readings: tuple[ServiceReading, ...] = ()
        if heal_pass.free is None:
            free, readings = await self.room.free_gpus(taking_new_pods=True), await self._all_readings()
        rolesets = self.index.rolesets_of(namespace, name)
        replicas = tuple(Replica.of(r, pods) for r in rolesets)
        podgroups = {r["metadata"]["name"]: pg for r in rolesets if (pg := self.index.podgroups.get((namespace, r["metadata"]["name"])))}
        others = tuple(self.index.stormservices_in_play().items())  # the moves in the cluster, as the index has them now
        snapshot = HealSnapshot(
            stormservice,
            replicas,
            self.index.cluster_tiers(),
            self.index.topology(),
            {},  # the pass's free room (plan_service)
            tuple(budgets),
            time.time(),
            self.cooldown,
            podgroups,
            self.recheck,
            make_room,
            allocatable or {},
            max_moving=self.max_moving,
            nodes=await self.room.node_facts(),
            stranded_after=self.stranded_after,
        )
        return ServiceRead(key, snapshot, others, free, readings)

    async def carry_out(self, key: Key, snapshot: HealSnapshot, plan: HealPlan, recorded: Callable[[], None] = lambda: None) -> bool:
        """The plan's records, then (`recorded` told) the rest of it (execute_plan). False: nothing was done
        (its records could not be written)."""
        if not await self.record_plan(snapshot, plan):
            return False
        recorded()
        await self.execute_plan(key, snapshot, plan)
        return True

    async def record_plan(self, snapshot: HealSnapshot, plan: HealPlan) -> bool:
        """The plan's move records, conditional on the version it was planned from: False if they could
        not be written (the StormService changed since it was read, or the write was refused: plan again)."""
        records = [w for w in plan.writes if isinstance(w, RecordMove)]
        return not records or await self._record(records, snapshot.stormservice)

    async def execute_plan(self, key: Key, snapshot: HealSnapshot, plan: HealPlan) -> None:
        """Once its records landed: the Events, the PodGroups held or let go, then the evictions (the
        writer's evictor, operator/writer.py). An eviction a budget refuses ends the move: said,
        recorded, backed off (plan_refused); any other failure is raised, and the move stays under way."""
        for settled in plan.settled:
            if settled.unavailable is not None:
                metrics.MOVE_UNAVAILABLE_SECONDS.observe(settled.unavailable)
        rest: list[Write] = [w for w in plan.writes if not isinstance(w, RecordMove | EvictPod)]
        await execute(self.api, rest, self.report)
        evictions = [w for w in plan.writes if isinstance(w, EvictPod)]
        if plan.moving is not None:
            metrics.REPLICA_MOVES.labels(str(plan.moving.why)).inc()
        if not evictions:
            return
        outcome = await evict(self.api, evictions, plan.one_at_a_time, lambda: not self._deposed(key), self.report)
        if outcome is None:
            return  # no longer leading: the next leader resumes the move
        failures = [EvictionFailure(write.name, failure_of(error), _message(error)) for write, error in outcome.failed]
        after = plan_evicted(snapshot, plan, failures, outcome.evicted, self._memory.of(key))
        if after.quiet:
            log.info("%s/%s: its namespace is being deleted; the move ends with it", *key)
            return
        for failure in after.logged:
            log.warning("evicting pod %s/%s failed: %s", snapshot.stormservice["metadata"].get("namespace"), failure.pod, failure.message)
        if after.say_refused is not None:  # said once a pass, whatever the number of pods: the move stays under way
            error = next(e for w, e in outcome.failed if w.name == after.say_refused.pod)
            assert isinstance(error, ApiError)
            self._refused(snapshot.stormservice, "eviction", f"evicting pod {after.say_refused.pod}", error)
        if after.resume is not None:
            raise next(e for w, e in outcome.failed if w.name == after.resume.pod)  # logged by the pass; resumed at the next
        if after.memory is not None:
            metrics.EVICTIONS_REFUSED.inc(after.refused_by_budget)
            self._memory = self._memory.healed(key, after.memory)
            await execute(self.api, list(after.writes), self.report)  # the record merged into what our own write left

    def _refused(self, stormservice: Mapping[str, Any], what: str, doing: str, exc: ApiError) -> None:
        metrics.HEALING_WRITES_REFUSED.labels(what).inc()
        message = f"healing moves nothing: {doing} was refused by the API server: {exc.message[:400]}"
        log.warning("%s/%s: %s", stormservice["metadata"].get("namespace"), stormservice["metadata"]["name"], message)
        self.report(stormservice, "Warning", "HealingRefused", message)

    def _deposed(self, key: Key) -> bool:
        if self.leading():
            return False
        log.warning("no longer leading: the move of %s/%s stops here; the next leader resumes it", *key)
        return True

    async def _record(self, writes: list[RecordMove], stormservice: Mapping[str, Any]) -> bool:
        """Write a plan's move records over the version it was planned from, in one write; the index
        learns the result at once. A write refused (RBAC, an admission policy) is said on the StormService:
        nothing moves, and the user sees why, not only the log."""
        try:
            updated = await asyncio.to_thread(record_moves, self.api, writes)
        except Conflict:
            log.info(
                "%s/%s changed since it was read; its moves are planned again at the next pass", writes[0].namespace, writes[0].stormservice
            )
            return False
        except REFUSED as exc:
            self._refused(stormservice, "record", f"writing its move record ({MOVES_ANNOTATION})", exc)
            return False
        if updated:
            self.index.observe("StormService", "MODIFIED", updated)
        return True
