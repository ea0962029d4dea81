"""tokentrace's metrics: SPEC worked examples A and B, chunking, edge cases."""

from __future__ import annotations

import json
import math
from collections.abc import Sequence

import numpy as np
import pytest

from app.analysis.metrics import (
    SUMMARY_ONLY_REASON,
    compute_metrics,
    itl_samples,
    per_request_metrics,
)
from app.domain import EventKind, RequestRecord, RequestStatus, RunTrace, trace_from_records

MS = 1_000_000
C, R, RO, U, OTH = (
    EventKind.CONTENT,
    EventKind.REASONING,
    EventKind.ROLE,
    EventKind.USAGE,
    EventKind.OTHER,
)


def rec(
    index: int,
    sent_ms: float | None,
    events: Sequence[tuple[float, int, EventKind]] = (),
    *,
    status: RequestStatus = RequestStatus.OK,
    end_ms: float | None = None,
    out: int | None = None,
    inp: int | None = None,
    error: str | None = None,
) -> RequestRecord:
    """A request with events (time ms, tokens, kind); times become integer ns."""
    t = np.array([round(e[0] * MS) for e in events], np.int64)
    if end_ms is None:
        end_ms = events[-1][0] if events else sent_ms
    return RequestRecord(
        index=index,
        scheduled_ns=0 if sent_ms is None else round(sent_ms * MS),
        sent_ns=None if sent_ms is None else round(sent_ms * MS),
        end_ns=None if end_ms is None else round(end_ms * MS),
        status=status,
        error=error,
        input_tokens=inp,
        output_tokens=out,
        event_t_ns=t,
        event_bytes=np.full(len(events), 10, np.int32),
        event_kind=np.array([int(e[2]) for e in events], np.int8),
        event_tokens=np.array([e[1] for e in events], np.int32),
    )


def tokens_at(*times_ms: float) -> list[tuple[float, int, EventKind]]:
    return [(t, 1, C) for t in times_ms]


def example_a() -> RunTrace:
    return trace_from_records(
        [
            rec(0, 0, tokens_at(100, 140, 180, 220)),
            rec(1, 10, tokens_at(160)),
            rec(2, 20, tokens_at(200, 300, 400)),
            rec(3, 30, [], status=RequestStatus.TIMEOUT, end_ms=500, error="timed out"),
        ]
    )


# --------------------------------------------------------------------------- example A


def test_example_a_per_request() -> None:
    prm = per_request_metrics(example_a())
    np.testing.assert_allclose(prm.ttft_ns[:3], [100 * MS, 150 * MS, 180 * MS])
    np.testing.assert_allclose(prm.e2e_ns[:3], [220 * MS, 150 * MS, 380 * MS])
    assert prm.tpot_ns[0] == 40 * MS  # (220-100)/3, not 220/4 = 55
    assert math.isnan(prm.tpot_ns[1])  # n = 1: no TPOT, not 0
    assert prm.tpot_ns[2] == 100 * MS
    assert all(math.isnan(v[3]) for v in (prm.ttft_ns, prm.e2e_ns, prm.tpot_ns, prm.ttfot_ns))
    assert list(prm.n_tokens) == [4, 1, 3, 0]


def test_example_a_run_metrics() -> None:
    m = compute_metrics(example_a(), slos_ms={"ttft": 150, "e2el": 300})
    assert m.window is not None
    assert (m.window.start_ns, m.window.end_ns) == (0, 500 * MS)
    ttft, e2e, tpot, itl = (m.dist(k) for k in ("ttft_ms", "e2el_ms", "tpot_ms", "itl_ms"))
    assert ttft.count == 3 and ttft.percentiles[50.0] == 150 and ttft.percentiles[95.0] == 177
    assert e2e.percentiles[50.0] == 220 and e2e.percentiles[95.0] == 364
    assert tpot.count == 2 and tpot.percentiles[50.0] == 70 and tpot.percentiles[95.0] == 97
    assert itl.count == 5 and itl.percentiles[50.0] == 40 and itl.percentiles[95.0] == 100
    assert m.counts.error_rate == 0.25
    assert m.counts.sent == 4 and m.counts.ok == 3 and m.counts.failed == 1
    assert m.counts.failed_by_status == {"timeout": 1}
    assert m.counts.error_reasons == [("timed out", 1)]
    assert m.rate("request_throughput_req_s") == pytest.approx(6.0)
    assert m.rate("output_throughput_tok_s") == pytest.approx(16.0)
    assert m.good_requests == 2
    assert m.rate("goodput_req_s") == pytest.approx(4.0)


def test_example_a_explicit_window() -> None:
    trace = example_a()
    m = compute_metrics(trace, window_ns=(0, 500 * MS))
    assert m.window is not None and m.window.source == "explicit"
    assert m.rate("request_throughput_req_s") == pytest.approx(6.0)
    assert m.rate("goodput_req_s") is None and m.good_requests is None  # no SLOs in force
    with pytest.raises(ValueError):
        compute_metrics(trace, window_ns=(10, 5))


def test_to_dict_is_json_with_units() -> None:
    d = compute_metrics(example_a(), slos_ms={"ttft": 150}).to_dict()
    text = json.dumps(d)
    assert "NaN" not in text
    for key in ("ttft_ms", "ttfot_ms", "e2el_ms", "tpot_ms", "itl_ms", "itl_chunk_ms"):
        dist = d[key]
        assert isinstance(dist, dict) and {"p50", "p99", "ci95", "mean"} <= set(dist)
    assert d["output_throughput_tok_s"] == pytest.approx(16.0)
    assert d["request_throughput_req_s"] == pytest.approx(6.0)
    assert d["goodput_req_s"] is not None
    assert d["error_rate"] == 0.25
    assert d["aggregation"] == {
        "ttft_ms": "per_request",
        "user_ttft_ms": "per_request",
        "ttfot_ms": "per_request",
        "ttftc_ms": "per_request",
        "e2el_ms": "per_request",
        "tpot_ms": "per_request",
        "itl_ms": "per_token_pooled",
        "itl_chunk_ms": "per_chunk_pooled",
    }
    window = d["window"]
    assert isinstance(window, dict) and window["duration_s"] == 0.5


# --------------------------------------------------------------------------- example B


def example_b() -> RunTrace:
    rows = [  # request_id, start, first_token, end (s), input, output
        ("r1", 0.00, 0.42, 3.10, 1024, 80),
        ("r2", 0.15, 0.71, 4.36, 4096, 96),
        ("r3", 0.40, 0.88, 2.92, 512, 64),
    ]
    recs = [
        rec(
            i,
            start * 1000,
            [(first * 1000, 1, C), (end * 1000, n - 1, C)],
            end_ms=end * 1000,
            out=n,
            inp=inp,
        )
        for i, (_, start, first, end, inp, n) in enumerate(rows)
    ]
    return trace_from_records(recs, summary_only=True)


def test_example_b_summary_only() -> None:
    trace = example_b()
    prm = per_request_metrics(trace)
    np.testing.assert_allclose(prm.ttft_ns / 1e9, [0.42, 0.56, 0.48], rtol=1e-12)
    assert [round(v / 1e9, 6) for v in prm.tpot_ns] == [0.033924, 0.038421, 0.032381]
    m = compute_metrics(trace)
    ttft = m.dist("ttft_ms")
    assert ttft.percentiles[50.0] == pytest.approx(480.0, abs=1e-9)
    assert ttft.percentiles[95.0] == pytest.approx(552.0, abs=1e-9)
    assert m.window is not None and m.window.duration_s == pytest.approx(4.36)
    assert m.output_tokens_total == 240
    assert m.rate("output_throughput_tok_s") is not None
    assert round(m.rate("output_throughput_tok_s"), 2) == 55.05
    assert m.input_tokens_total == 1024 + 4096 + 512
    # per-token views say "no per-token data", never compute ITL from two events
    assert m.summary_only
    for key in ("itl_ms", "itl_chunk_ms"):
        dist = m.dist(key)
        assert dist.count == 0 and dist.percentiles[50.0] is None
        assert dist.reason == SUMMARY_ONLY_REASON
    assert m.itl_no_data_reason == SUMMARY_ONLY_REASON
    assert m.to_dict()["itl_ms"] == m.dist("itl_ms").to_dict()


def test_example_b_single_token_row_has_no_tpot() -> None:
    recs = [rec(0, 0, [(420, 1, C)], end_ms=420, out=1)]
    prm = per_request_metrics(trace_from_records(recs, summary_only=True))
    assert math.isnan(prm.tpot_ns[0])
    assert prm.ttft_ns[0] == 420 * MS


# --------------------------------------------------------------------------- chunking


def test_multi_token_chunks_read_per_token_gap() -> None:
    # 4 tokens per chunk, chunks 40 ms apart: per-token ITL 10 ms, per-chunk ITL 40 ms
    events = [(100 + 40 * j, 4, C) for j in range(4)]  # 16 tokens
    trace = trace_from_records([rec(0, 0, events)])
    prm = per_request_metrics(trace)
    assert prm.n_tokens[0] == 16
    assert prm.tpot_ns[0] == pytest.approx(120 * MS / 15)
    samples = itl_samples(trace)
    assert samples.per_token is not None
    # first chunk: 3 zero gaps; chunks 2..4: 4 samples of 10 ms each
    assert sorted(samples.per_token / MS) == [0.0] * 3 + [10.0] * 12
    assert samples.per_token.size == 16 - 1
    assert samples.per_token.mean() == pytest.approx(prm.tpot_ns[0])
    assert list(samples.per_chunk() / MS) == [40.0, 40.0, 40.0]
    m = compute_metrics(trace)
    assert m.dist("itl_ms").percentiles[50.0] == pytest.approx(10.0)
    assert m.dist("itl_chunk_ms").percentiles[50.0] == pytest.approx(40.0)
    assert m.dist("itl_ms").mean == pytest.approx(m.dist("tpot_ms").mean)


def test_mixed_chunk_sizes_per_token_samples() -> None:
    events = [(50, 2, C), (80, 3, C), (90, 1, C)]  # gaps 30 ms / 3 tokens, 10 ms / 1 token
    samples = itl_samples(trace_from_records([rec(0, 0, events)]))
    assert samples.per_token is not None
    assert sorted(samples.per_token / MS) == [0.0, 10.0, 10.0, 10.0, 10.0]


def test_non_token_chunks_are_not_tokens() -> None:
    events = [
        (5, 0, OTH),  # keep-alive comment
        (20, 0, RO),  # role-only chunk
        (50, 2, R),  # reasoning: token-bearing, not output text
        (70, 0, C),  # empty content delta
        (90, 1, C),  # first content
        (130, 1, C),
        (140, 0, U),  # usage-only chunk
        (150, 0, OTH),  # [DONE]
    ]
    trace = trace_from_records([rec(0, 10, events, end_ms=150)])
    prm = per_request_metrics(trace)
    assert prm.ttft_ns[0] == 40 * MS  # first token-bearing (reasoning) chunk
    assert prm.ttfot_ns[0] == 80 * MS  # first content chunk
    assert prm.e2e_ns[0] == 120 * MS  # last token chunk, not usage / [DONE]
    assert prm.n_tokens[0] == 4
    assert prm.tpot_ns[0] == pytest.approx(80 * MS / 3)
    samples = itl_samples(trace)
    assert list(samples.per_chunk() / MS) == [40.0, 40.0]


def test_output_tokens_override_event_counts() -> None:
    # usage says 5 tokens although the tokenizer split the text in 3 chunks of 1
    trace = trace_from_records([rec(0, 0, tokens_at(10, 20, 30), out=5)])
    prm = per_request_metrics(trace)
    assert prm.n_tokens[0] == 5
    assert prm.tpot_ns[0] == pytest.approx(20 * MS / 4)


def test_single_chunk_with_many_tokens() -> None:
    trace = trace_from_records([rec(0, 0, [(100, 5, C)])])
    prm = per_request_metrics(trace)
    # all 5 tokens seen at once (a non-streamed answer): no gap was observed, so no TPOT
    # and no ITL sample, rather than a TPOT of 0
    assert math.isnan(prm.tpot_ns[0])
    assert prm.ttft_ns[0] == prm.e2e_ns[0] == 100 * MS
    samples = itl_samples(trace)
    assert samples.per_token is not None and samples.per_token.size == 0
    assert samples.per_chunk().size == 0
    # beside a streamed request (2 chunks: 1 token at 10 ms, 3 tokens at 40 ms): only its
    # samples, 1 - 1 = 0 zeros from the first chunk and 3 of 30/3 ms from the second
    both = trace_from_records([rec(0, 0, [(100, 5, C)]), rec(1, 0, [(10, 1, C), (40, 3, C)])])
    per_token = itl_samples(both).per_token
    assert per_token is not None and list(per_token / MS) == [10.0, 10.0, 10.0]


# --------------------------------------------------------------------------- edge cases


def test_empty_run_is_no_data() -> None:
    m = compute_metrics(trace_from_records([]), slos_ms={"ttft": 100})
    assert m.window is None
    assert m.counts.sent == 0 and m.counts.error_rate is None
    assert m.rate("request_throughput_req_s") is None and m.rate("output_throughput_tok_s") is None
    assert m.rate("goodput_req_s") is None
    for dist in m.distributions.values():
        assert dist.count == 0 and dist.mean is None
        assert all(v is None for v in dist.percentiles.values())
    json.dumps(m.to_dict())


def test_all_failed_run() -> None:
    recs = [
        rec(0, 0, [], status=RequestStatus.ERROR, end_ms=5, error="HTTP 500"),
        rec(1, 1, tokens_at(10), status=RequestStatus.CANCELLED, end_ms=20),
        rec(2, None, [], status=RequestStatus.CANCELLED),
    ]
    m = compute_metrics(trace_from_records(recs))
    assert m.counts.sent == 2 and m.counts.not_sent == 1
    # the cancelled request was sent (in the denominator, SPEC §2) but is no error: 1 / 2
    assert m.counts.failed == 1 and m.counts.cancelled == 1 and m.counts.ok == 0
    assert m.counts.error_rate == 0.5
    assert m.counts.failed_by_status == {"error": 1}
    assert dict(m.counts.error_reasons) == {"HTTP 500": 1}
    assert m.dist("ttft_ms").count == 0 and m.dist("itl_ms").count == 0
    assert m.rate("request_throughput_req_s") == 0.0
    assert m.output_tokens_total == 0


def test_failed_requests_never_latency_samples() -> None:
    recs = [
        rec(0, 0, tokens_at(10, 20)),
        rec(1, 0, tokens_at(1, 2, 3), status=RequestStatus.TIMEOUT),
    ]
    trace = trace_from_records(recs)
    prm = per_request_metrics(trace)
    assert math.isnan(prm.ttft_ns[1]) and math.isnan(prm.tpot_ns[1])
    m = compute_metrics(trace)
    assert m.dist("ttft_ms").count == 1
    assert m.dist("itl_ms").count == 1 and m.dist("itl_ms").max == 10.0
    assert m.output_tokens_total == 2


def test_ok_request_without_tokens() -> None:
    recs = [rec(0, 0, [(5, 0, RO), (9, 0, U)], end_ms=10), rec(1, 0, tokens_at(30, 50))]
    trace = trace_from_records(recs)
    prm = per_request_metrics(trace)
    assert math.isnan(prm.ttft_ns[0]) and math.isnan(prm.e2e_ns[0])
    m = compute_metrics(trace, slos_ms={"ttft": 1000})
    assert m.counts.ok == 2 and m.dist("ttft_ms").count == 1
    assert m.good_requests == 1  # a request with no token cannot meet a TTFT SLO


def test_goodput_tpot_undefined_meets_tpot_slo() -> None:
    recs = [
        rec(0, 0, tokens_at(100)),  # n = 1: TPOT undefined
        rec(1, 0, tokens_at(100, 200)),  # TPOT 100 ms
        rec(2, 0, tokens_at(100, 120)),  # TPOT 20 ms
    ]
    m = compute_metrics(trace_from_records(recs), slos_ms={"tpot": 50})
    assert m.good_requests == 2
    m2 = compute_metrics(trace_from_records(recs), slos_ms={"tpot": 50, "ttft": 99})
    assert m2.good_requests == 0


def test_bad_slo_key_raises() -> None:
    with pytest.raises(ValueError):
        compute_metrics(example_a(), slos_ms={"itl": 10})
    with pytest.raises(ValueError):
        compute_metrics(example_a(), slos_ms={"ttft": 0})


def test_window_default_uses_last_event_or_end() -> None:
    recs = [rec(0, 100, tokens_at(300, 400), end_ms=450), rec(1, 50, tokens_at(600), end_ms=None)]
    m = compute_metrics(trace_from_records(recs))
    assert m.window is not None
    assert (m.window.start_ns, m.window.end_ns) == (50 * MS, 600 * MS)


def test_total_token_throughput() -> None:
    recs = [rec(0, 0, tokens_at(100, 200), inp=10, end_ms=1000), rec(1, 0, tokens_at(50), inp=6)]
    m = compute_metrics(trace_from_records(recs))
    assert m.rate("total_token_throughput_tok_s") == pytest.approx((10 + 6 + 2 + 1) / 1.0)


def test_ci_reported_and_optional() -> None:
    m = compute_metrics(example_a())
    ci = m.dist("ttft_ms").ci95[50.0]
    assert ci is not None and ci[0] <= 150 <= ci[1]
    assert m.dist("ttft_ms").ci_method == "bootstrap"
    assert compute_metrics(example_a(), ci=False).dist("ttft_ms").ci95[50.0] is None


# --------------------------------------------------------------------------- vs a reference


def _random_trace(seed: int, n_req: int, max_tokens: int) -> tuple[RunTrace, list[RequestRecord]]:
    rng = np.random.default_rng(seed)
    recs = []
    for i in range(n_req):
        sent = float(rng.uniform(0, 1000))
        n_chunks = int(rng.integers(0, max_tokens))
        t = sent + np.cumsum(rng.gamma(2.0, 5.0, n_chunks))
        k = rng.integers(1, 4, n_chunks)
        status = RequestStatus.OK if rng.random() > 0.1 else RequestStatus.ERROR
        events = [(float(a), int(b), C) for a, b in zip(t, k, strict=True)]
        recs.append(rec(i, sent, events, status=status))
    return trace_from_records(recs), recs


def _reference_itl(recs: list[RequestRecord]) -> tuple[list[float], list[float]]:
    per_token: list[float] = []
    per_chunk: list[float] = []
    for r in recs:
        if r.status is not RequestStatus.OK:
            continue
        t, k = r.event_t_ns, r.event_tokens
        if len(t) == 1:
            continue  # every token in one chunk: no gap seen, no sample
        for j in range(len(t)):
            if j == 0:
                per_token += [0.0] * (int(k[0]) - 1)
            else:
                g = float(t[j] - t[j - 1])
                per_chunk.append(g)
                per_token += [g / int(k[j])] * int(k[j])
    return per_token, per_chunk


@pytest.mark.parametrize("n_req,max_tokens", [(40, 30), (400, 150)])
def test_pooled_itl_matches_loop_reference(n_req: int, max_tokens: int) -> None:
    trace, recs = _random_trace(n_req, n_req, max_tokens)
    per_token, per_chunk = _reference_itl(recs)
    m = compute_metrics(trace)
    for key, ref in (("itl_ms", per_token), ("itl_chunk_ms", per_chunk)):
        dist = m.dist(key)
        assert dist.count == len(ref)
        assert dist.mean == pytest.approx(np.mean(ref) / MS, rel=1e-9)
        assert dist.std == pytest.approx(np.std(ref) / MS, rel=1e-6)
        for p, v in dist.percentiles.items():
            assert v == pytest.approx(np.percentile(ref, p) / MS, rel=1e-9)
    if n_req == 400:
        assert m.dist("itl_chunk_ms").ci_method == "order-statistic"
