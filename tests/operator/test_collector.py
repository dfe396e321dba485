"""The collector's full passes (operator/collector.py): a pass longer than the limit freezes what survived it, so the
next walks only what was made after; shorter passes, and younger generations, freeze nothing."""

from __future__ import annotations

from typing import Any

import pytest

from stormtopo.operator import collector


def test_a_slow_full_pass_freezes_what_survived_it_and_nothing_else_does(monkeypatch: pytest.MonkeyPatch) -> None:
    clock = [0.0]
    froze: list[bool] = []
    monkeypatch.setattr(collector.time, "perf_counter", lambda: clock[0])
    monkeypatch.setattr(collector.gc, "freeze", lambda: froze.append(True))
    passes = collector.Passes(slow=0.02)

    def full_pass(seconds: float, generation: int = 2) -> None:
        info: dict[str, Any] = {"generation": generation, "collected": 0, "uncollectable": 0}
        passes("start", info)
        clock[0] += seconds
        passes("stop", info)

    full_pass(0.01)
    full_pass(0.5, generation=1)  # a young generation's pass: not a full one, not counted
    assert (passes.full, passes.freezes, froze) == (1, 0, [])
    full_pass(0.7)
    assert (passes.full, passes.freezes, len(froze)) == (2, 1, 1) and passes.longest == pytest.approx(0.7)
    full_pass(0.015)
    assert (passes.full, passes.freezes, len(froze)) == (3, 1, 1) and passes.longest == pytest.approx(0.7)


def test_installed_once_and_timing_real_passes() -> None:
    import gc

    passes = collector.install(slow=float("inf"))  # (nothing of the test process frozen)
    try:
        assert collector.install(slow=float("inf")) is passes and gc.callbacks.count(passes) == 1
        full = passes.full
        gc.collect()
        assert passes.full == full + 1
    finally:
        gc.callbacks.remove(passes)
        passes.slow = collector.SLOW_PASS
