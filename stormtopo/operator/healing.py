"""Healing's shell: every few seconds, for each StormService that opted in and has a replica wider than
its request (or a move under way), read what the planner needs, plan (core/healing.py), execute.

Nothing is read for a service until its own placement record shows a wide replica: a cluster where
every replica landed within its request costs one pass over the index. A service that needs a look
costs a read of the StormService itself (the move table on the API server, not the index's copy,
decides what may move), a list of its own pods and of its namespace's PodDisruptionBudgets; one
reading of every node's free GPUs is shared by the whole pass, taken in the explanation worker's
process so that its parsing never delays an admission. A service whose wide replicas had nowhere to
go is not read again for NO_ROOM_RECHECKS passes (a service with nowhere to go does not cost an API
read every pass), unless a pod of an opted-in service has left a node since: that pass reads it
again, over a fresh reading of the free GPUs (a freed leaf is seen at the next pass, before a new
arrival takes it, rather than within three passes and a cached reading); at most once a quiet spell,
so that a churning cluster does not read every stuck service every pass.

A move is begun only once its record is on the StormService, written conditionally on the version
the plan was made from: two leaders, or a pass planned from a stale read, cannot both begin one.
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from stormtopo.core.healing import (
    COOLDOWN,
    MAX_MOVING,
    MOVE_DEADLINE,
    NO_ROOM_RECHECK,
    STRANDED_AFTER,
    Block,
    HealMemory,
    HealPlan,
    HealSnapshot,
    MakeRoom,
    Replica,
    Why,
    making_room_under_way,
    may_need_healing,
    moving_in_cluster,
    pending_since,
    placed_since,
    plan_healing,
    plan_refused,
    plan_stranded,
    resident,
    room_made_for,
    room_of,
    set_aside,
    wants_healing,
    wide_replica,
)
from stormtopo.core.placement import merge_placements
from stormtopo.core.room import Resident, resident_key, room_by_moving
from stormtopo.core.topology.node_tier import node_tier_members
from stormtopo.core.vocabulary import AIBRIX, MOVES_ANNOTATION, ROLESET_LABEL, STORMSERVICE_LABEL
from stormtopo.core.writes import EvictPod, RecordMove, Write
from stormtopo.kube.client import Api, ApiError, Conflict
from stormtopo.operator import metrics
from stormtopo.operator.events import Report
from stormtopo.operator.index import Index, Key
from stormtopo.operator.room import NodeRoom
from stormtopo.operator.writer import execute

log = logging.getLogger("stormtopo.healing")

REFUSED_STATUSES = (403, 422)  # RBAC, or an admission webhook or policy: not a budget, not an outage
WIDE_TRIED = 2  # wide replicas a pass looks for a resident to move for (each search ~0.1 s at 1,000 nodes)
DONORS_TRIED = 3  # residents offered in turn to one wide replica, when the first ones' own plans refuse


def is_budget_refusal(exc: ApiError) -> bool:
    """The Eviction API's answers when a PodDisruptionBudget forbids it: 429 with the budget's message,
    or 500 for a pod under several budgets. Anything else (RBAC, API priority and fairness, a server
    error) is no refusal: the move stays under way and the next pass resumes it."""
    return "disruption budget" in exc.body.lower() or "poddisruptionbudget" in exc.body.lower()


def status_message(exc: ApiError) -> str:
    """The API server's own words, not its Status object."""
    try:
        return str(json.loads(exc.body).get("message") or exc.body)
    except (ValueError, AttributeError):
        return exc.body


@dataclass
class Healer:
    index: Index
    api: Api
    report: Report
    room: NodeRoom  # every node's free and allocatable GPUs, followed by watch (room.py)
    read_nodes: Callable[[], Awaitable[None]]  # the tree is only as current as the last reading of the nodes
    cooldown: float = COOLDOWN
    recheck: float = NO_ROOM_RECHECK  # seconds: NO_ROOM_RECHECKS times the interval its loop runs at
    make_room_enabled: bool = False  # --heal-make-room
    leading: Callable[[], bool] = lambda: True
    max_moving: int = MAX_MOVING  # --heal-max-moving: replicas moving at once in the whole cluster
    stranded_after: float = STRANDED_AFTER  # --heal-stranded-after
    _noticed: dict[Key, HealMemory] = field(default_factory=dict)  # what was said of stranded replicas of services not healing
    _noticed_pods: dict[Key, frozenset[str]] = field(default_factory=dict)  # the waiting pods it was said for
    _memory: dict[Key, HealMemory] = field(default_factory=dict)
    _free: dict[str, int] | None = None  # this pass's reading
    _no_room: list[tuple[Key, Replica, int]] = field(default_factory=list)  # this pass's wide replicas with nowhere to go
    _freed_seen: int = -1  # the index's count of admitted pods gone from their nodes, at the last pass
    _fresh: bool = False  # this pass: pods left their nodes since the last (room may have been freed)
    _woken: dict[Key, float] = field(default_factory=dict)  # service -> when a freed node last ended its quiet
    _started: set[Key] = field(default_factory=set)  # this pass: services that began a move (the index may not show it yet)

    async def check(self) -> None:
        """One pass over the StormServices (a loop of the operator runs it every --heal-interval)."""
        if not self.leading():
            return
        self._free = None
        self._no_room = []
        self._started = set()
        self._fresh, self._freed_seen = self.index.pods_freed != self._freed_seen, self.index.pods_freed
        tiers, topology = self.index.cluster_tiers(), self.index.topology()
        now = time.time()
        # Services room is being made for (from the lenders' move records): read every pass until it is there.
        awaited = {(ns, name) for (ns, name, _), at in room_made_for(self.index.stormservices.values()).items() if now - at < MOVE_DEADLINE}
        for key, stormservice in list(self.index.stormservices.items()):
            if not may_need_healing(stormservice, tiers, topology) and not self._stranded(key, now):
                self._memory.pop(key, None)
                self._noticed.pop(key, None)
                self._noticed_pods.pop(key, None)
                continue
            if not self.room.listed():
                break  # the free-room reading's first list is under way: this pass waits for none of it
            if not wants_healing(stormservice):  # stranded, and not asking for healing: said where it would fit
                waiting = self._waiting(key)
                if self._noticed_pods.get(key) == waiting:
                    continue  # said already for these pods: no read every pass for as long as they wait
                self._noticed_pods[key] = waiting
                try:
                    await self.notice_stranded(key)
                except Exception:
                    log.exception("checking %s/%s for a stranded replica failed; trying again at the next pass", *key)
                continue
            if now < self._memory.get(key, HealMemory()).quiet_until and key not in awaited:
                if not self._fresh or now - self._woken.get(key, float("-inf")) < self.recheck:
                    continue  # (unless room is being made for it, or may have been freed: once a quiet spell)
                self._woken[key] = now
            try:
                await self.heal(key)
            except Exception:  # one service's failure is logged; the others still get their pass
                log.exception("healing %s/%s failed; trying again at the next pass", *key)
        if self._no_room and self.make_room_enabled:
            try:
                await self.make_room()
            except Exception:
                log.exception("making room failed; trying again at the next pass")
        for gone in set(self._memory) - set(self.index.stormservices):
            del self._memory[gone]
        for gone in set(self._noticed) - set(self.index.stormservices):
            del self._noticed[gone]
        self._noticed_pods = {k: v for k, v in self._noticed_pods.items() if k in self.index.stormservices}
        self._woken = {k: t for k, t in self._woken.items() if now - t < self.recheck}
        metrics.HEALING_PASSES.inc()

    async def heal(self, key: Key, make_room: MakeRoom | None = None, allocatable: dict[str, int] | None = None) -> HealPlan | None:
        """Plan one service and carry the plan out; None if there was nothing to plan or its records
        could not be written (the service changed since it was read)."""
        snapshot = await self.snapshot(key, make_room, allocatable)
        if snapshot is None:
            return None
        # The packing search is CPU work: on a thread, the loop still answers admissions between slices.
        plan = await asyncio.to_thread(plan_healing, snapshot, self._memory.get(key, HealMemory()))
        self._memory[key] = plan.memory
        if plan.moving is not None:
            self._started.add(key)
        tier = snapshot.healing_tier
        if tier is not None and plan.moving is None and make_room is None:
            for verdict in plan.verdicts:
                if verdict.block is Block.NO_ROOM and verdict.why in (Why.SOFT_WIDE, Why.VIOLATION):
                    self._no_room.append((key, next(r for r in snapshot.replicas if r.name == verdict.replica), tier))
        return plan if await self.carry_out(key, snapshot, plan) else None

    def _waiting(self, key: Key) -> frozenset[str]:
        """The pods of the service that wait unbound (from the index)."""
        return frozenset(
            p["metadata"]["name"]
            for r in self.index.rolesets_of(*key)
            for p in self.index.pods_of(key[0], r["metadata"]["name"])
            if not (p.get("spec") or {}).get("nodeName")
        )

    def _stranded(self, key: Key, now: float) -> bool:
        """From the index, no API read: a replica of the service has a pod waiting past the threshold beside
        running ones (core/healing.py, Why.STRANDED; the plan judges the rest on a fresh read)."""
        return any(
            (since := pending_since(self.index.pods_of(key[0], r["metadata"]["name"]))) is not None and now - since >= self.stranded_after
            for r in self.index.rolesets_of(*key)
        )

    async def notice_stranded(self, key: Key) -> None:
        snapshot = await self.snapshot(key)
        if snapshot is None:
            return
        writes, self._noticed[key] = plan_stranded(snapshot, self._noticed.get(key, HealMemory()))
        await execute(self.api, writes, self.report)

    async def make_room(self) -> None:
        """For this pass's wide replicas with nowhere to go (at most WIDE_TRIED of them), one replica of
        another service that lends room moved out of the way (core/room.py): at most one such move under
        way in the cluster, and at most one per wide replica within its cool-down, both read from the move
        records on the StormServices (a new leader knows them as the last one did). A resident its own
        plan refuses (the lender's budget, not ready, Volcano might put it back) is skipped for the next."""
        services = self.index.stormservices
        now = time.time()
        if making_room_under_way(services.values(), now):
            return
        made = room_made_for(services.values())
        waiting = [(k, r, t) for k, r, t in self._no_room if now - made.get((*k, r.name), float("-inf")) >= self.cooldown]
        if not waiting or self._free is None:
            return
        residents = await self._residents({key for key, _, _ in self._no_room}, now)
        if not residents:
            return
        allocatable, nodes = await self.room.allocatable_gpus(), await self.room.node_facts()
        topology = self.index.topology()
        listed = frozenset(node_tier_members(self.index.hypernodes.values()).values())  # the node tier's short list
        for key, replica, tier in waiting[:WIDE_TRIED]:
            skip: set[str] = set()
            for _ in range(DONORS_TRIED):
                free = room_of(self._free, nodes, replica)  # where the wide replica's pods could run at all
                room = await asyncio.to_thread(
                    room_by_moving, replica.wanted(), replica.gpus_by_node(), tier, residents, free, allocatable, topology, skip, listed
                )
                if room is None:
                    break
                order = MakeRoom(room.resident.replica, wide_replica(*key, replica.name), room.frees.switch.name)
                plan = await self.heal((room.resident.namespace, room.resident.stormservice), order, allocatable)
                if plan is not None and plan.moving is not None and plan.moving.why is Why.MAKE_ROOM:
                    log.info(
                        "%s moves to %s to make room in %s for %s", room.resident.replica, room.to.switch.name, order.frees, order.wide
                    )
                    return  # its record (the lender's move, "for" this replica) now limits the next pass
                skip.add(resident_key(room.resident))

    async def _residents(self, waiting: set[Key], now: float) -> list[Resident]:
        """Replicas of other services that lend room and may make it: read from the index on the loop,
        judged on a thread (tens of microseconds each, thousands of them)."""
        tiers, topology = self.index.cluster_tiers(), self.index.topology()
        found = [
            (stormservice, roleset, self.index.pods_of(key[0], roleset["metadata"]["name"]))
            for key, stormservice in list(self.index.stormservices.items())
            if key not in waiting
            for roleset in self.index.rolesets_of(*key)
        ]

        def judge() -> list[Resident]:
            return [r for svc, rs, pods in found if (r := resident(svc, rs, pods, tiers, topology, now, self.cooldown))]

        return await asyncio.to_thread(judge)

    async def snapshot(self, key: Key, make_room: MakeRoom | None = None, allocatable: dict[str, int] | None = None) -> HealSnapshot | None:
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
        if self._free is None:
            self._free = self._set_aside(await self.room.free_gpus(taking_new_pods=True))
        rolesets = self.index.rolesets_of(namespace, name)
        replicas = tuple(
            Replica(r, tuple(p for p in pods if (p["metadata"].get("labels") or {}).get(ROLESET_LABEL) == r["metadata"]["name"]))
            for r in rolesets
        )
        podgroups = {r["metadata"]["name"]: pg for r in rolesets if (pg := self.index.podgroups.get((namespace, r["metadata"]["name"])))}
        return HealSnapshot(
            stormservice,
            replicas,
            self.index.cluster_tiers(),
            self.index.topology(),
            self._free,
            tuple(budgets),
            time.time(),
            self.cooldown,
            podgroups,
            self.recheck,
            make_room,
            allocatable or {},
            moving_elsewhere=self._moving_elsewhere(key),
            max_moving=self.max_moving,
            nodes=await self.room.node_facts(),
            stranded_after=self.stranded_after,
        )

    def _moving_elsewhere(self, key: Key) -> int:
        """Replicas of other services moving now: their records (from the index), and this pass's moves
        that the index may not show yet (counted twice rather than not at all: the cap is a ceiling)."""
        others = [s for k, s in self.index.stormservices.items() if k != key]
        return moving_in_cluster(others, time.time()) + len(self._started - {key})

    def _set_aside(self, free: dict[str, int], only: Key | None = None) -> dict[str, int]:
        """The pass's reading of free GPUs, less the targets of moves under way (of every service, or
        of `only`) whose pods are not placed yet: from the index, no API read."""
        topology = self.index.topology()
        for key, stormservice in self.index.stormservices.items():
            if only is not None and key != only:
                continue
            rolesets = self.index.rolesets_of(*key)
            placed = {
                r["metadata"]["name"]: placed_since(self.index.pods_of(key[0], r["metadata"]["name"]), stormservice, r["metadata"]["name"])
                for r in rolesets
            }
            free = set_aside(free, topology, stormservice, rolesets, placed)
        return free

    async def carry_out(self, key: Key, snapshot: HealSnapshot, plan: HealPlan) -> bool:
        """In order: the records (conditional: none lands, nothing else is done), the Events, the
        PodGroups held or let go, then the evictions, only while this replica still leads: together,
        or one after another where a PodDisruptionBudget covers a pod (plan.one_at_a_time). An eviction
        a budget refuses ends the move: said, recorded, backed off. False: nothing was done (its records
        could not be written)."""
        records = [w for w in plan.writes if isinstance(w, RecordMove)]
        if records and not await self._record(records, snapshot.stormservice):
            return False  # the StormService changed since it was read (or the write was refused): plan again
        if plan.moving is not None and self._free is not None:
            self._free = self._set_aside(self._free, key)  # its target is taken for the rest of this pass
        for settled in plan.settled:
            if settled.unavailable is not None:
                metrics.MOVE_UNAVAILABLE_SECONDS.observe(settled.unavailable)
        rest: list[Write] = [w for w in plan.writes if not isinstance(w, RecordMove | EvictPod)]
        await execute(self.api, rest, self.report)
        evictions = [w for w in plan.writes if isinstance(w, EvictPod)]
        if plan.moving is not None:
            metrics.REPLICA_MOVES.labels(str(plan.moving.why)).inc()
        if not evictions:
            return True
        evicted = 0
        failed: list[tuple[EvictPod, BaseException]] = []
        if plan.one_at_a_time:  # a PodDisruptionBudget covers a pod: the first refusal ends the move
            for write in evictions:
                if self._deposed(key):
                    return True
                try:
                    await execute(self.api, [write], self.report)
                    evicted += 1
                except Exception as exc:
                    failed.append((write, exc))
                    break
        else:
            if self._deposed(key):
                return True
            # All at once: one at a time, Volcano may place a re-created pod while the replica's last old
            # pod still runs, and a gang is placed around its running pods (back into the old domain).
            outcomes = await asyncio.gather(*(execute(self.api, [w], self.report) for w in evictions), return_exceptions=True)
            failed = [(w, o) for w, o in zip(evictions, outcomes, strict=True) if isinstance(o, BaseException)]
            evicted = len(evictions) - len(failed)
        refused = [(w, o) for w, o in failed if plan.moving is not None and isinstance(o, ApiError) and is_budget_refusal(o)]
        for write, error in failed:
            if (write, error) not in refused:
                log.warning("evicting pod %s/%s failed: %s", write.namespace, write.name, error)
        forbidden = [(w, e) for w, e in failed if isinstance(e, ApiError) and e.status in REFUSED_STATUSES and (w, e) not in refused]
        if forbidden:  # said once a pass, whatever the number of pods: the move stays under way
            self._refused(snapshot.stormservice, "eviction", f"evicting pod {forbidden[0][0].name}", forbidden[0][1])
        if not refused:
            if failed:
                raise failed[0][1]  # logged by the pass; the move stays under way and is resumed
            return True
        write, error = refused[0]
        metrics.EVICTIONS_REFUSED.inc(len(refused))
        memory = self._memory.get(key, HealMemory())
        writes, memory = plan_refused(snapshot, plan, write.name, status_message(error), memory, evicted=evicted)
        self._memory[key] = memory
        await execute(self.api, writes, self.report)  # the record merged into what our own write left
        return True

    def _refused(self, stormservice: Mapping[str, Any], what: str, doing: str, exc: ApiError) -> None:
        metrics.HEALING_WRITES_REFUSED.labels(what).inc()
        message = f"healing moves nothing: {doing} was refused by the API server: {status_message(exc)[:400]}"
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
        except ApiError as exc:
            if exc.status not in REFUSED_STATUSES:
                raise
            self._refused(stormservice, "record", f"writing its move record ({MOVES_ANNOTATION})", exc)
            return False
        if updated:
            self.index.observe("StormService", "MODIFIED", updated)
        return True


def record_moves(api: Api, writes: list[RecordMove]) -> dict[str, Any]:
    """One write of the move table, conditional on the version the plan read (Conflict otherwise):
    the records merged into the table as it was then."""
    first = writes[0]
    current = api.get(AIBRIX, "stormservices", first.namespace, first.stormservice)
    if current is None:
        return {}
    meta = current["metadata"]
    if first.resource_version and meta.get("resourceVersion") != first.resource_version:
        raise Conflict(409, "PATCH", f"stormservices/{first.stormservice}", "changed since the plan was made")
    value = (meta.get("annotations") or {}).get(MOVES_ANNOTATION)
    for write in writes:
        value = merge_placements(value, write.replica, write.record, write.live)
    return api.annotate_stormservice(first.namespace, first.stormservice, MOVES_ANNOTATION, value or "{}", meta.get("resourceVersion"))
