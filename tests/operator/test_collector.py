"""The collector's passes (operator/collector.py): a full pass that took more than the limit of CPU freezes what
survived it, so the next walk only what was made after; a middle pass that slow asks for a full pass (run by a
thread of its own), never freezes itself (only a full pass collects the cycles that died in the oldest
generation); shorter passes, passes long only in wall time (the thread waiting for a core), and the young
generation's passes do nothing. Every pass is timed."""

from __future__ import annotations

import os
import threading
import time
from typing import Any

import pytest

from stormtopo.operator import collector


def test_a_slow_full_pass_freezes_what_survived_it_and_a_slow_middle_pass_asks_for_one(monkeypatch: pytest.MonkeyPatch) -> None:
    wall, cpu = [0.0], [0.0]
    froze: list[bool] = []
    monkeypatch.setattr(collector.time, "perf_counter", lambda: wall[0])
    monkeypatch.setattr(collector.time, "thread_time", lambda: cpu[0])
    monkeypatch.setattr(collector.gc, "freeze", lambda: froze.append(True))
    passes = collector.Passes(slow=0.005)

    def collect(generation: int, seconds: float, waiting: float = 0.0) -> None:
        info: dict[str, Any] = {"generation": generation, "collected": 0, "uncollectable": 0}
        passes("start", info)
        wall[0] += seconds + waiting
        cpu[0] += seconds
        passes("stop", info)

    collect(2, 0.004)
    collect(0, 0.5)  # the young generation's: what survived one pass is mostly what the next event replaces
    collect(2, 0.001, waiting=0.1)  # long only because its thread waited for a core: nothing to gain by a freeze
    collect(1, 0.004)
    assert (passes.passes, passes.freezes, froze, passes.full_due) == ([1, 1, 2], 0, [], False)
    assert passes.longest == pytest.approx([0.5, 0.004, 0.101])
    collect(1, 0.03)  # slow: a full pass asked for, nothing frozen (its dead cycles are the full pass's to collect)
    assert (passes.freezes, froze, passes.full_due) == (0, [], True) and passes.longest[1] == pytest.approx(0.03)
    collect(2, 0.7)
    assert (passes.freezes, len(froze), max(passes.longest)) == (1, 1, pytest.approx(0.7))
    passes("stop", {"generation": 2})  # installed while a pass ran: its start never seen, nothing judged
    passes("start", {"generation": 1})
    passes("stop", {"generation": 2})  # (a stop of another generation than the start seen: nothing judged)
    passes("stop", {"generation": 7})
    assert (passes.passes, passes.freezes) == ([1, 2, 3], 1)


def test_a_full_pass_is_run_each_time_one_is_asked_for_and_the_loop_survives_a_failure(monkeypatch: pytest.MonkeyPatch) -> None:
    ran: list[int] = []
    done = threading.Event()

    def collect() -> int:
        ran.append(1)
        if len(ran) == 2:
            raise RuntimeError("boom")  # logged; the loop goes on, and asks again
        if len(ran) > 1:
            passes.passes[2] += 1  # a full pass (the first call found one running: it did nothing)
        if len(ran) == 4:
            done.set()
        return 0

    monkeypatch.setattr(collector.gc, "collect", collect)
    woken, wake = os.pipe()
    passes = collector.Passes(slow=-1.0, wake=wake)
    thread = threading.Thread(target=collector.full_passes, args=(passes, woken, 0.0), daemon=True)
    thread.start()
    try:
        slow_middle = {"generation": 1}
        passes("start", slow_middle)
        passes("stop", slow_middle)  # (slow: any CPU time is over -1 s)
        deadline = time.monotonic() + 10
        while len(ran) < 3 and time.monotonic() < deadline:
            time.sleep(0.01)
        time.sleep(0.05)
        assert ran == [1, 1, 1] and not passes.full_due  # asked again until one ran, then no more
        passes("start", slow_middle)
        passes("stop", slow_middle)
        assert done.wait(10) and len(ran) == 4
    finally:
        os.close(wake)  # its writing end closed: the loop ends
        thread.join(10)
        os.close(woken)
    assert not thread.is_alive()


def test_installed_once_by_identity_and_timing_real_passes() -> None:
    import gc

    other = collector.Passes(slow=float("inf"))  # alike in every field: still not the operator's
    gc.callbacks.append(other)
    thresholds = gc.get_threshold()
    passes = collector.install(slow=float("inf"))  # (nothing of the test process frozen)
    try:
        assert collector.install(slow=float("inf")) is passes and [c for c in gc.callbacks if c is passes] == [passes]
        assert gc.get_threshold() == (thresholds[0], collector.MIDDLE_EVERY, collector.FULL_EVERY)
        counted = list(passes.passes)
        gc.collect(1)
        gc.collect()
        assert passes.passes[1] > counted[1] and passes.passes[2] > counted[2]  # (and any young pass meanwhile)
    finally:
        gc.callbacks.remove(passes)
        gc.callbacks.remove(other)
        passes.slow = collector.SLOW_PASS
        gc.set_threshold(*thresholds)


def test_the_readings_stay_frozen_out_of_every_pass_as_events_change_them() -> None:
    """Once frozen, the index and the free-room reading stay out of the collector's passes whatever events change
    them: a dict of strings and tuples is untracked by a full pass, then tracked again in the youngest generation
    by its next new key and walked whole by every pass after, 100,000 entries or not (collector.LongLived)."""
    import gc
    from typing import cast

    from bench.memory import admitted_pod, delivered, node_of, roleset_of, stormservice_of
    from stormtopo.operator.index import Index
    from stormtopo.operator.loops import Loops
    from stormtopo.operator.room import NodeRoom

    index, room = Index(cast(Any, None)), NodeRoom(cast(Any, None), Loops())
    for n in range(64):
        room._on_node("ADDED", node_of(n))
    rolesets = []
    for kind, obj in delivered(40, 5, 64):  # 40 StormServices, 200 RoleSets, 400 admitted pods
        index.observe(kind, "ADDED", obj)
        if kind == "Pod":
            room._on_pod("ADDED", obj)
        rolesets += [obj] if kind == "RoleSet" else []
    for roleset in rolesets[:45]:  # deletions a re-list must not revive: index._deleted_since
        index.observe("RoleSet", "DELETED", roleset)
    gc.collect()  # full passes: the first untracks the tuples of strings, the second the dicts holding only such
    gc.collect()
    gc.freeze()
    try:
        service = stormservice_of(41, "team-new")
        roleset = roleset_of(service, 0)
        pod = admitted_pod(roleset, "prefill", "node-00001", 4)
        for kind, obj in (("StormService", service), ("RoleSet", roleset), ("Pod", pod)):
            index.observe(kind, "ADDED", obj)
        index.observe("RoleSet", "DELETED", rolesets[50])
        room._on_pod("ADDED", pod)
        room._on_node("ADDED", node_of(64))
        walked = {id(o) for o in gc.get_objects()}  # every generation the passes collect (not the frozen)
        kept = {
            f"{type(owner).__name__}.{name}": (len(part), id(part))
            for owner in (index, room)
            for name, part in vars(owner).items()
            if isinstance(part, (dict, set, list)) and len(part) >= 40
        }
        assert len(kept) > 10 and not [name for name, (_, at) in kept.items() if at in walked], kept
    finally:
        gc.unfreeze()
