"""The steady window (app.analysis.steady) against windows computed by hand on small
synthetic records, and its figures against the requests counted by hand."""

from __future__ import annotations

import math

import numpy as np
import pytest

from app.analysis.metric_defs import E2EL, OUTPUT_THROUGHPUT, REQUEST_THROUGHPUT, TTFT
from app.analysis.steady import (
    LoadTarget,
    load_target,
    longest_stretch,
    steady_metrics,
    steady_window,
    subset_trace,
)
from app.domain import EventKind, RequestRecord, RequestStatus, RunTrace, trace_from_records

MS = 1_000_000


def rec(index: int, sent_ms: float, end_ms: float, tokens: int = 5) -> RequestRecord:
    """A request with two content events of ``tokens`` each: 20 ms after its send and at
    its end."""
    t = np.array([round((sent_ms + 20) * MS), round(end_ms * MS)], np.int64)
    return RequestRecord(
        index=index,
        scheduled_ns=round(sent_ms * MS),
        sent_ns=round(sent_ms * MS),
        end_ns=round(end_ms * MS),
        status=RequestStatus.OK,
        input_tokens=10,
        output_tokens=2 * tokens,
        event_t_ns=t,
        event_bytes=np.full(2, 10, np.int32),
        event_kind=np.full(2, int(EventKind.CONTENT), np.int8),
        event_tokens=np.full(2, tokens, np.int32),
    )


def closed_loop() -> RunTrace:
    """4 slots started 40 ms apart, 5 requests of 100 ms each, the next sent 1 ms after one
    ends: slot k sends at 40k + 101j ms. All 4 in flight (but for 1 ms dips) from slot 3's
    first send (120 ms) to slot 0's last end (0 + 404 + 100 = 504 ms)."""
    recs: list[RequestRecord] = []
    for k in range(4):
        for j in range(5):
            sent = 40 * k + 101 * j
            recs.append(rec(len(recs), sent, sent + 100))
    return trace_from_records(recs)


def open_loop() -> RunTrace:
    """200 requests sent every 10 ms (100 req/s), each 30 ms long."""
    return trace_from_records([rec(i, 10 * i, 10 * i + 30) for i in range(200)])


def ns(*ms: float) -> np.ndarray:
    return np.array([round(m * MS) for m in ms], np.int64)


def test_longest_stretch_by_hand() -> None:
    # c(t): [0,2) 1, [2,4) 2, [4,10) 3, [10,12) 2, [12,15) 1, [15,20) 2, [20,30) 1
    starts, ends = np.array([0, 2, 4, 15]), np.array([10, 12, 20, 30])
    assert longest_stretch(starts, ends, 2, math.inf, gap_ns=0) == (2, 12)
    assert longest_stretch(starts, ends, 2, math.inf, gap_ns=3) == (2, 20)  # dip of 3 joined
    assert longest_stretch(starts, ends, 2, 2, gap_ns=0) == (15, 20)  # [2,4) is shorter
    assert longest_stretch(starts, ends, 4, math.inf, gap_ns=0) is None
    assert longest_stretch(np.zeros(0, np.int64), np.zeros(0, np.int64), 1, 2) is None


def test_longest_stretch_ties_take_the_earliest() -> None:
    starts, ends = np.array([0, 20]), np.array([5, 25])
    assert longest_stretch(starts, ends, 1, math.inf, gap_ns=0) == (0, 5)


def test_load_target_from_the_spec() -> None:
    assert load_target({"request_rate": "inf", "max_concurrency": 4}) == LoadTarget(
        "concurrency", 4.0
    )
    assert load_target({"request_rate": 5.0, "max_concurrency": 4}) == LoadTarget("rate", 5.0)
    assert load_target({"request_rate": None}) is None
    assert load_target({"ramp_up_strategy": "linear", "max_concurrency": 2}) is None
    assert load_target(None) is None


def test_closed_loop_window_by_hand() -> None:
    trace = closed_loop()
    w = steady_window(trace, LoadTarget("concurrency", 4))
    assert w is not None
    assert (w.start_ns, w.end_ns) == (120 * MS, 504 * MS)
    # without the 10 ms dip tolerance, the 1 ms gaps (3 of 4 in flight < 3.6) cut it:
    # gaps at 100, 140, 180, 201, 220 ... ms; the longest run of 4 is [141, 180)
    assert longest_stretch(trace.sent_ns, trace.end_ns, 3.6, math.inf, gap_ns=0) == (
        141 * MS,
        180 * MS,
    )


def test_closed_loop_figures_over_the_requests_started_inside() -> None:
    trace = closed_loop()
    block = steady_metrics(trace, {"max_concurrency": 4, "request_rate": "inf"})
    # sent in [120, 504] ms: slot 0 at 202, 303, 404; slots 1-3: 4 each (141.., 181.., 120..)
    sent = [40 * k + 101 * j for k in range(4) for j in range(5)]
    inside = [s for s in sent if 120 <= s <= 504]
    assert len(inside) == 15
    assert block["requests"] == 15
    m = block["metrics"]
    assert isinstance(m, dict)
    assert m[REQUEST_THROUGHPUT.key] == pytest.approx(15 / 0.384)
    assert m[OUTPUT_THROUGHPUT.key] == pytest.approx(15 * 10 / 0.384)
    assert m[E2EL.key]["p50"] == pytest.approx(100.0)
    assert m[TTFT.key]["p50"] == pytest.approx(20.0)
    window = block["window"]
    assert isinstance(window, dict)
    assert window["duration_s"] == pytest.approx(0.384)
    assert window["kind"] == "concurrency"


def test_open_loop_window_by_hand() -> None:
    # W = 50 / 100 req/s = 0.5 s; a(t) = sends in (t - 0.5 s, t] reaches 45 (90% of 50) at
    # the 45th send (440 ms), never exceeds 50 (< 55), and falls to 44 at 2050 ms (the
    # sends 1560..1990 ms)
    trace = open_loop()
    w = steady_window(trace, LoadTarget("rate", 100.0))
    assert w is not None
    assert (w.start_ns, w.end_ns) == (440 * MS, 2050 * MS)
    block = steady_metrics(trace, {"request_rate": 100.0})
    assert block["requests"] == len([i for i in range(200) if 440 <= 10 * i <= 2050])  # 156
    m = block["metrics"]
    assert isinstance(m, dict)
    assert m[REQUEST_THROUGHPUT.key] == pytest.approx(156 / 1.61)


def test_open_loop_too_fast_is_not_steady() -> None:
    # sent at 200 req/s while 100 were asked: a(t) reaches 100 > 55 sends: over the bound
    # for the whole middle; only the ramp through 45..55 and the tail qualify
    trace = trace_from_records([rec(i, 5 * i, 5 * i + 30) for i in range(200)])
    w = steady_window(trace, LoadTarget("rate", 100.0))
    assert w is not None
    assert w.duration_s < 0.1  # 45..55 sends of the ramp: 50 ms at 5 ms each


def test_no_target_no_window() -> None:
    block = steady_metrics(open_loop(), {"max_concurrency": None})
    assert block["window"] is None
    assert "no fixed" in str(block["reason"])


def test_subset_keeps_each_requests_events() -> None:
    trace = closed_loop()
    keep = np.zeros(trace.n_requests, np.bool_)
    keep[[1, 7]] = True
    sub = subset_trace(trace, keep)
    assert sub.n_requests == 2 and sub.n_events == 4
    assert list(sub.sent_ns) == [trace.sent_ns[1], trace.sent_ns[7]]
    assert list(sub.ev_t_ns) == list(trace.ev_t_ns[2:4]) + list(trace.ev_t_ns[14:16])
    assert list(sub.ev_offsets) == [0, 2, 4]


def test_cli_line() -> None:
    from app.cli.render import steady_text

    block = steady_metrics(closed_loop(), {"max_concurrency": 4})
    line = steady_text(block)
    assert "0.120-0.504 s (0.384 s, 15 requests started inside)" in line
    assert f"{15 / 0.384:.3f} req/s" in line
    assert steady_text({"window": None, "reason": "why"}) == "steady window: none (why)"
