"""Diagnosis rules: each fires on the case it names and stays quiet otherwise."""

from __future__ import annotations

import numpy as np
import pytest

from app.analysis import diagnosis as dg
from app.analysis.sweep import StepSummary


def _step(load: float, achieved: float | None, ttft50: float, tput: float = 1000.0,
          tpot50: float = 10.0, kind: str = "rate") -> StepSummary:  # fmt: skip
    return StepSummary(
        index=0,
        load=load,
        load_kind=kind,  # type: ignore[arg-type]
        achieved_rps=achieved,
        request_throughput_rps=achieved,
        output_throughput_tok_s=tput,
        goodput_rps=None,
        error_rate=0.0,
        latency_ms={"ttft_ms": {"p50": ttft50, "p99": ttft50 * 2}, "tpot_ms": {"p50": tpot50}},
    )


def test_decode_memory_bound() -> None:
    note = dg.decode_memory_bound(7.5, 7.0, device="H200")
    assert note is not None and note.rule == "decode-memory-bound"
    assert "within 10% of the weight-read floor" in note.text and "memory-bound" in note.text
    assert dg.decode_memory_bound(7.0 * 1.11, 7.0) is None  # 11% above the floor
    assert dg.decode_memory_bound(None, 7.0) is None
    assert dg.decode_memory_bound(7.0, None) is None
    assert dg.decode_memory_bound(7.0, 0.0) is None
    below = dg.decode_memory_bound(5.0, 7.0)
    assert below is not None and below.rule == "roofline-below-floor"


def test_prefill_bound_fires_when_ttft_grows_with_input() -> None:
    rng = np.random.default_rng(1)
    inp = rng.integers(100, 4000, 200)
    ttft = 20 + inp * 0.05 + rng.normal(0, 5, 200)
    note = dg.prefill_bound(inp, ttft)
    assert note is not None and "prefill-bound" in note.text


def test_prefill_bound_quiet_cases() -> None:
    rng = np.random.default_rng(2)
    inp = rng.integers(100, 4000, 200)
    assert dg.prefill_bound(inp, 50 + rng.normal(0, 5, 200)) is None  # no relation
    fixed = np.full(200, 512)
    assert dg.prefill_bound(fixed, 50 + rng.normal(0, 5, 200)) is None  # lengths do not vary
    assert dg.prefill_bound(inp[:10], (inp * 0.05)[:10]) is None  # too few requests
    tiny = 50 + inp * 0.0001  # perfectly correlated but only 1% slower: not worth a note
    assert dg.prefill_bound(inp, tiny) is None
    assert dg.prefill_bound(np.full(50, -1), np.arange(50.0)) is None  # unknown lengths


def test_kv_bound() -> None:
    rng = np.random.default_rng(3)
    ctx = rng.integers(500, 8000, 300)
    assert dg.kv_bound(ctx, 8 + ctx / 1000 + rng.normal(0, 0.2, 300)) is not None
    assert dg.kv_bound(ctx, 8 + rng.normal(0, 0.2, 300)) is None


def test_queue_builds() -> None:
    sent = np.arange(100) * 1e8
    rising = 20 + np.arange(100) * 2.0
    note = dg.queue_builds(sent, rising)
    assert note is not None and "queued" in note.text
    assert dg.queue_builds(sent, 20 + np.arange(100) * 0.1) is None
    assert dg.queue_builds(sent[:10], rising[:10]) is None


def test_high_error_rate() -> None:
    assert dg.high_error_rate(0.2, 100) is not None
    assert dg.high_error_rate(0.05, 100) is None
    assert dg.high_error_rate(None, 0) is None


def test_queueing_saturation_names_the_load() -> None:
    steps = [_step(2, 2.0, 50), _step(4, 3.9, 55), _step(8, 7.8, 60), _step(16, 9.0, 400)]
    note = dg.queueing_saturation(steps)
    assert note is not None
    assert note.text.startswith("achieved rate fell below offered above 8 req/s while TTFT rose")
    assert "queueing — the server saturated" in note.text


def test_queueing_saturation_quiet_cases() -> None:
    keeps_up = [_step(2, 2.0, 50), _step(16, 15.5, 300)]
    assert dg.queueing_saturation(keeps_up) is None  # TTFT rose but the rate kept up
    falls_fast = [_step(2, 2.0, 50), _step(16, 9.0, 60)]
    assert dg.queueing_saturation(falls_fast) is None  # fell, but no queueing in TTFT
    assert dg.queueing_saturation([_step(2, 1.0, 50)]) is None
    conc = [_step(1, 1, 50, kind="concurrency"), _step(8, 2, 500, kind="concurrency")]
    assert dg.queueing_saturation(conc) is None  # concurrency sweeps have no offered rate
    first = dg.queueing_saturation([_step(2, 1.0, 50), _step(4, 1.0, 200)])
    assert first is not None and "above 2 req/s" in first.text


def test_throughput_falls() -> None:
    steps = [_step(1, 1, 10, 500), _step(2, 2, 10, 900), _step(4, 3, 10, 700)]
    note = dg.throughput_falls(steps)
    assert note is not None and "scheduling or overload" in note.text
    flat = [_step(1, 1, 10, 500), _step(2, 2, 10, 900), _step(4, 3, 10, 850)]
    assert dg.throughput_falls(flat) is None  # 5.6% below the peak
    assert dg.throughput_falls(steps[:2]) is None


def test_tpot_grows_with_load() -> None:
    assert dg.tpot_grows_with_load([_step(1, 1, 10, tpot50=10), _step(8, 8, 10, tpot50=16)])
    assert dg.tpot_grows_with_load([_step(1, 1, 10, tpot50=10), _step(8, 8, 10, tpot50=12)]) is None


def test_run_notes_collects_applicable_rules() -> None:
    n = 100
    notes = dg.run_notes(
        input_tokens=np.full(n, 512),
        output_tokens=np.full(n, 64),
        sent_ns=np.arange(n) * 1e7,
        ttft_ms=np.full(n, 30.0),
        tpot_ms=np.full(n, 7.2),
        error_rate=0.0,
        sent=n,
        tpot_p50_ms=7.2,
        weight_floor_ms=7.0,
    )
    assert [x.rule for x in notes] == ["decode-memory-bound"]
    quiet = dg.run_notes(
        input_tokens=np.full(n, 512),
        output_tokens=np.full(n, 64),
        sent_ns=np.arange(n) * 1e7,
        ttft_ms=np.full(n, 30.0),
        tpot_ms=np.full(n, 7.2),
        error_rate=0.0,
        sent=n,
    )
    assert quiet == []


def test_spearman() -> None:
    assert dg.spearman([1, 2, 3, 4], [10, 20, 30, 40]) == pytest.approx(1.0)
    assert dg.spearman([1, 2, 3, 4], [4, 3, 2, 1]) == pytest.approx(-1.0)
    assert dg.spearman([1, 1, 1], [1, 2, 3]) is None
