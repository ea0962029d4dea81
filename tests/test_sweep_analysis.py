"""Sweep planning, achieved rate, saturation and max goodput (pure functions)."""

from __future__ import annotations

import numpy as np
import pytest

from app.analysis.sweep import (
    StepSummary,
    achieved_rate,
    auto_rates,
    max_goodput,
    meets_slo,
    saturation_reason,
)


def _step(load: float, achieved: float | None = None, *, err: float = 0.0, ttft99: float = 100.0,
          tput: float = 1000.0, kind: str = "rate") -> StepSummary:  # fmt: skip
    return StepSummary(
        index=0,
        load=load,
        load_kind=kind,  # type: ignore[arg-type]
        achieved_rps=load if achieved is None else achieved,
        request_throughput_rps=load,
        output_throughput_tok_s=tput,
        goodput_rps=load * 0.9,
        error_rate=err,
        latency_ms={"ttft_ms": {"p50": ttft99 / 2, "p99": ttft99}, "tpot_ms": {"p99": 20.0}},
    )


def test_auto_rates() -> None:
    assert auto_rates(1.0, 9.0, 5) == [1.0, 3.0, 5.0, 7.0, 9.0]
    assert auto_rates(2.0, 2.0, 4) == [2.0]
    assert auto_rates(3.0, 1.0, 4) == [3.0]
    with pytest.raises(ValueError):
        auto_rates(0.0, 5.0, 3)
    with pytest.raises(ValueError):
        auto_rates(1.0, 5.0, 0)


def _schedule(rate: float, n: int, service_s: float, capacity: float | None) -> tuple:
    sent = (np.arange(n) / rate * 1e9).astype(np.int64)
    if capacity is None:
        end = sent + int(service_s * 1e9)
    else:  # a single queue served at `capacity` req/s
        end = np.zeros(n, np.int64)
        free = 0
        for i, s in enumerate(sent):
            start = max(int(s), free)
            free = start + int(1e9 / capacity)
            end[i] = free + int(service_s * 1e9)
    return sent, end, np.ones(n, np.bool_)


def test_achieved_rate_keeps_up_and_falls_behind() -> None:
    sent, end, ok = _schedule(10.0, 40, 0.8, None)
    assert achieved_rate(sent, end, ok, closed_loop=False) == pytest.approx(10.0, rel=0.02)
    sent, end, ok = _schedule(10.0, 40, 0.1, capacity=5.0)
    got = achieved_rate(sent, end, ok, closed_loop=False)
    assert got is not None and got == pytest.approx(5.0, rel=0.15)
    assert achieved_rate(sent[:1], end[:1], ok[:1], closed_loop=False) is None
    assert achieved_rate(sent, end, np.zeros(40, np.bool_), closed_loop=False) == 0.0


def _closed(n: int, conc: int, service_s: float) -> tuple:
    """``n`` requests through ``conc`` slots, each taking ``service_s``: the slot frees, the
    next request is sent at once."""
    slot_free = [0] * conc
    sent = np.zeros(n, np.int64)
    end = np.zeros(n, np.int64)
    for i in range(n):
        k = int(np.argmin(slot_free))
        sent[i] = slot_free[k]
        end[i] = sent[i] + int(service_s * 1e9)
        slot_free[k] = int(end[i])
    return sent, end, np.ones(n, np.bool_)


def test_achieved_rate_closed_loop_is_the_runs_throughput() -> None:
    # 64 requests at concurrency 64, all sent at t=0, each 0.71 s: one wave, 64 / 0.71 s
    # = 90.1 req/s. The send window is 0 s: the open-loop rule would divide by ~0.
    sent, end, ok = _closed(64, 64, 0.71)
    assert achieved_rate(sent, end, ok, closed_loop=True) == pytest.approx(64 / 0.71)
    # concurrency 16, 64 requests of 0.5 s: 4 waves, 2.0 s, 32 req/s (not the send window's)
    sent, end, ok = _closed(64, 16, 0.5)
    assert achieved_rate(sent, end, ok, closed_loop=True) == pytest.approx(32.0)
    # 3 of them failed: 61 successes over the same 2.0 s
    ok[[3, 20, 40]] = False
    assert achieved_rate(sent, end, ok, closed_loop=True) == pytest.approx(30.5)
    # an open-loop step whose sends all left within one unqueued latency (the unlimited
    # probe) falls back to the closed-loop rule: 64 sends in 10 ms, 1 s each -> 64/1.01 s
    sent = np.linspace(0, 10_000_000, 64).astype(np.int64)
    end = sent + 1_000_000_000
    got = achieved_rate(sent, end, np.ones(64, np.bool_), closed_loop=False)
    assert got == pytest.approx(64 / 1.01)


def test_saturation_reasons() -> None:
    assert saturation_reason([_step(4), _step(8, 7.5)]) is None
    low = saturation_reason([_step(4), _step(8, 5.0)])
    assert low is not None and "achieved 5.00 req/s at 8 req/s offered" in low
    err = saturation_reason([_step(4, err=0.2)])
    assert err is not None and "errors climbed to 20.0%" in err
    flat = [_step(4, kind="concurrency", tput=1000), _step(8, kind="concurrency", tput=1020)]
    reason = saturation_reason(flat)
    assert reason is not None and "throughput stopped rising" in reason
    rising = [_step(4, kind="concurrency", tput=1000), _step(8, kind="concurrency", tput=1800)]
    assert saturation_reason(rising) is None
    assert saturation_reason([]) is None


def test_max_goodput_picks_the_highest_load_meeting_the_slo() -> None:
    steps = [_step(2, ttft99=80), _step(4, ttft99=120), _step(8, ttft99=400), _step(3, ttft99=90)]
    best = max_goodput(steps, {"ttft": 150})
    assert best.load == 4 and best.step == 1 and best.goodput_rps == pytest.approx(3.6)
    assert max_goodput(steps, {"ttft": 10}).step is None
    assert max_goodput(steps, {}).reason.startswith("no SLO set")
    assert meets_slo(_step(2, err=0.5), {"ttft": 1000}, max_error_rate=0.05) is False
    assert meets_slo(_step(2), {"e2el": 1000}, max_error_rate=0.05) is False  # no e2el data
    assert meets_slo(_step(2), {}, max_error_rate=0.05) is None
