"""The collector's full passes (operator/collector.py): a pass that took more than the limit of CPU freezes what
survived it, so the next walks only what was made after; shorter passes, passes long only in wall time (the
thread waiting for a core), and younger generations freeze nothing."""

from __future__ import annotations

from typing import Any

import pytest

from stormtopo.operator import collector


def test_a_slow_full_pass_freezes_what_survived_it_and_nothing_else_does(monkeypatch: pytest.MonkeyPatch) -> None:
    wall, cpu = [0.0], [0.0]
    froze: list[bool] = []
    monkeypatch.setattr(collector.time, "perf_counter", lambda: wall[0])
    monkeypatch.setattr(collector.time, "thread_time", lambda: cpu[0])
    monkeypatch.setattr(collector.gc, "freeze", lambda: froze.append(True))
    passes = collector.Passes(slow=0.02)

    def full_pass(seconds: float, generation: int = 2, waiting: float = 0.0) -> None:
        info: dict[str, Any] = {"generation": generation, "collected": 0, "uncollectable": 0}
        passes("start", info)
        wall[0] += seconds + waiting
        cpu[0] += seconds
        passes("stop", info)

    full_pass(0.01)
    full_pass(0.5, generation=1)  # a young generation's pass: not a full one, not counted
    full_pass(0.005, waiting=0.1)  # long only because its thread waited for a core: nothing to gain by a freeze
    assert (passes.full, passes.freezes, froze) == (2, 0, []) and passes.longest == pytest.approx(0.105)
    full_pass(0.7)
    assert (passes.full, passes.freezes, len(froze)) == (3, 1, 1) and passes.longest == pytest.approx(0.7)
    full_pass(0.015)
    assert (passes.full, passes.freezes, len(froze)) == (4, 1, 1)
    passes("stop", {"generation": 2})  # installed while a pass ran: its start never seen, nothing judged
    assert (passes.full, passes.freezes) == (4, 1)


def test_installed_once_by_identity_and_timing_real_passes() -> None:
    import gc

    other = collector.Passes(slow=float("inf"))  # alike in every field: still not the operator's
    gc.callbacks.append(other)
    thresholds = gc.get_threshold()
    passes = collector.install(slow=float("inf"))  # (nothing of the test process frozen)
    try:
        assert collector.install(slow=float("inf")) is passes and [c for c in gc.callbacks if c is passes] == [passes]
        assert gc.get_threshold() == (*thresholds[:2], collector.FULL_EVERY)
        full = passes.full
        gc.collect()
        assert passes.full == full + 1
    finally:
        gc.callbacks.remove(passes)
        gc.callbacks.remove(other)
        passes.slow = collector.SLOW_PASS
        gc.set_threshold(*thresholds)
