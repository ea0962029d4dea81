"""Definition profiles (tokentrace, vLLM, GuideLLM, AIPerf) on a small hand-computed trace."""

from __future__ import annotations

import json
from collections.abc import Sequence

import numpy as np
import pytest

from app.analysis.profiles import (
    ALL_PROFILES,
    PROFILES,
    ProfileMetric,
    ProfileResult,
    compare_profiles,
    profile_metrics,
)
from app.domain import EventKind, RequestRecord, RequestStatus, RunTrace, trace_from_records

MS = 1_000_000
C, R, RO, U = EventKind.CONTENT, EventKind.REASONING, EventKind.ROLE, EventKind.USAGE


def rec(
    index: int,
    sent_ms: int,
    events: Sequence[tuple[int, int, EventKind]],
    *,
    end_ms: int,
    out: int | None = None,
    inp: int | None = None,
    status: RequestStatus = RequestStatus.OK,
) -> RequestRecord:
    return RequestRecord(
        index=index,
        scheduled_ns=sent_ms * MS,
        sent_ns=sent_ms * MS,
        end_ns=end_ms * MS,
        status=status,
        input_tokens=inp,
        output_tokens=out,
        event_t_ns=np.array([e[0] * MS for e in events], np.int64),
        event_bytes=np.full(len(events), 10, np.int32),
        event_kind=np.array([int(e[2]) for e in events], np.int8),
        event_tokens=np.array([e[1] for e in events], np.int32),
    )


def trace_p() -> RunTrace:
    """Times in ms.

    R1 sent 0: role@20, content@50 (1 tok), content@90 (4 tok), content@110 (1 tok),
       usage@115; usage says 6 tokens; stream ends 120.
    R2 sent 10: role@30, reasoning@60 (2 tok), content@100 (2 tok); 4 tokens; ends 105.
    R3 sent 20: error after one content chunk @40; ends 50 (never a latency sample).
    Window: first send 0 .. last end/event 120 -> 0.12 s. Input tokens 100 + 50.
    """
    return trace_from_records(
        [
            rec(
                0,
                0,
                [(20, 0, RO), (50, 1, C), (90, 4, C), (110, 1, C), (115, 0, U)],
                end_ms=120,
                out=6,
                inp=100,
            ),
            rec(1, 10, [(30, 0, RO), (60, 2, R), (100, 2, C)], end_ms=105, out=4, inp=50),
            rec(2, 20, [(40, 1, C)], end_ms=50, status=RequestStatus.ERROR, inp=7),
        ]
    )


def stat(m: ProfileMetric, key: str) -> float | None:
    table: dict[str, float | None] = {
        "mean": m.mean,
        "p50": m.percentiles.get(50.0),
        "p90": m.percentiles.get(90.0),
        "p95": m.percentiles.get(95.0),
        "max": m.percentiles.get(100.0),
    }
    return table[key]


def check(res: ProfileResult, expected: dict[str, dict[str, float]]) -> None:
    for name, stats in expected.items():
        metric = res.metrics[name]
        for key, want in stats.items():
            got = metric.value if key == "value" else stat(metric, key)
            assert got == pytest.approx(want, rel=1e-12), f"{res.profile} {name} {key}"


def test_tokentrace_profile() -> None:
    res = profile_metrics(trace_p(), "tokentrace")
    check(
        res,
        {
            # TTFT: R1 50-0 = 50, R2 60-10 = 50 (reasoning is a token)
            "ttft": {"mean": 50, "p50": 50},
            # TTFOT: first content: R1 50, R2 100-10 = 90
            "ttfot": {"mean": 70, "p50": 70, "max": 90},
            # per token: R1 [10,10,10,10 (40/4), 20], R2 [0 (first chunk's 2nd token), 20, 20]
            # pooled sorted [0,10,10,10,10,20,20,20]: mean 100/8, p50 pos 3.5 -> 10, p95 -> 20
            "itl": {"mean": 12.5, "p50": 10, "p95": 20},
            # per chunk: R1 [40, 20], R2 [40] -> [20, 40, 40]
            "itl_chunk": {"mean": 100 / 3, "p50": 40},
            # TPOT: R1 (110-50)/5 = 12, R2 (100-60)/3 = 13.33; p50 (12+13.33)/2
            "tpot": {"mean": (12 + 40 / 3) / 2, "p50": (12 + 40 / 3) / 2},
            # E2E: R1 110, R2 90
            "e2el": {"p50": 100, "max": 110},
            "request_throughput": {"value": 2 / 0.12},
            "output_throughput": {"value": 10 / 0.12},
            "total_token_throughput": {"value": 160 / 0.12},
        },
    )
    assert res.percentile_method == "linear"


def test_vllm_profile_033() -> None:
    res = profile_metrics(trace_p(), "vllm")
    check(
        res,
        {
            "ttft": {"mean": 50, "p50": 50},  # role-only chunks skipped
            # ITL per chunk, pooled: [40, 20] + [40]; 4 tokens in one chunk read as one gap
            "itl": {"mean": 100 / 3, "p50": 40, "max": 40},
            # TPOT (E2EL - TTFT)/(n-1): (110-50)/5 = 12, (90-50)/3 = 13.33
            "tpot": {"p50": (12 + 40 / 3) / 2},
            "e2el": {"mean": 100},
            "request_throughput": {"value": 2 / 0.12},
            "output_throughput": {"value": 10 / 0.12},
        },
    )


def test_vllm_profile_legacy_counts_role_chunk() -> None:
    res = profile_metrics(trace_p(), "vllm-legacy")
    check(
        res,
        {
            # first chunk with choices is the role chunk: R1 20, R2 30-10 = 20
            "ttft": {"mean": 20, "p50": 20},
            # gaps between choice chunks: R1 [30, 40, 20], R2 [30, 40] -> mean 160/5
            "itl": {"mean": 32, "p50": 30, "max": 40},
            # E2EL ends at the last data message (usage included): R1 115, R2 90
            "e2el": {"mean": 102.5},
            # TPOT: (115-20)/5 = 19, (90-20)/3 = 23.33
            "tpot": {"mean": (19 + 70 / 3) / 2},
        },
    )


def test_guidellm_profile_weighted_cdf() -> None:
    res = profile_metrics(trace_p(), "guidellm")
    check(
        res,
        {
            "ttft": {"mean": 50, "p50": 50},
            # TTFOT: [50, 90]: CDF 0.5 at 50 -> p50 is 50 (no interpolation)
            "ttfot": {"mean": 70, "p50": 50, "p95": 90},
            # ITL per request: R1 (110-50)/5 = 12 weight 5; R2 (100-60)/3 = 13.33 weight 3
            # weighted mean (60 + 40)/8 = 12.5; CDF 5/8 at 12 -> p50 12, p90 13.33
            "itl": {"mean": 12.5, "p50": 12, "p90": 40 / 3},
            # TPOT (last - start)/n: R1 110/6 weight 6; R2 90/4 = 22.5 weight 4
            # weighted mean (110 + 90)/10 = 20; CDF 0.6 at 18.33 -> p50 18.33, p95 22.5
            "tpot": {"mean": 20, "p50": 110 / 6, "p95": 22.5},
            # request latency to stream end: R1 120, R2 105-10 = 95
            "e2el": {"mean": 107.5, "p50": 95, "p95": 120},
            "output_throughput": {"value": 10 / 0.12},
        },
    )
    assert res.percentile_method == "weighted-cdf"


def test_aiperf_profile() -> None:
    res = profile_metrics(trace_p(), "aiperf")
    check(
        res,
        {
            "ttft": {"mean": 50},
            # time to second token: R1 90-50, R2 100-60
            "ttst": {"mean": 40, "p50": 40},
            # AIPerf "ITL" = (latency - TTFT)/(OSL - 1): R1 60/5 = 12, R2 40/3
            "itl": {"mean": (12 + 40 / 3) / 2},
            "inter_chunk_latency": {"mean": 100 / 3, "p50": 40},
            "e2el": {"mean": 100},
            "request_throughput": {"value": 2 / 0.12},
        },
    )


def test_uniform_structure_side_by_side() -> None:
    results = compare_profiles(trace_p(), ALL_PROFILES)
    assert set(results) == set(ALL_PROFILES)
    assert set(PROFILES) <= set(ALL_PROFILES)
    common = {"ttft", "itl", "e2el", "request_throughput", "output_throughput"}
    for res in results.values():
        assert common <= set(res.metrics)
        d = res.to_dict()
        json.dumps(d)
        metrics = d["metrics"]
        assert isinstance(metrics, dict)
        for m in metrics.values():
            assert {"definition", "mean", "p50", "p90", "p95", "p99", "p99_9", "max"} <= set(m)
            assert m["definition"]


def test_summary_only_profiles_have_no_chunk_itl() -> None:
    recs = [rec(0, 0, [(100, 1, C), (500, 9, C)], end_ms=500, out=10)]
    trace = trace_from_records(recs, summary_only=True)
    vllm = profile_metrics(trace, "vllm")
    assert vllm.metrics["itl"].count == 0 and vllm.metrics["itl"].reason
    assert vllm.metrics["tpot"].mean == pytest.approx(400 / 9)
    aiperf = profile_metrics(trace, "aiperf")
    assert aiperf.metrics["inter_chunk_latency"].count == 0
    assert aiperf.metrics["itl"].mean == pytest.approx(400 / 9)
    guide = profile_metrics(trace, "guidellm")
    assert guide.metrics["itl"].mean == pytest.approx(400 / 9)  # needs first/last only
    assert profile_metrics(trace, "tokentrace").metrics["itl"].count == 0


def test_empty_trace_every_profile() -> None:
    for res in compare_profiles(trace_from_records([]), ALL_PROFILES).values():
        assert res.metrics["ttft"].count == 0 and res.metrics["ttft"].mean is None
        assert res.metrics["request_throughput"].value is None
        json.dumps(res.to_dict())


def test_unknown_profile() -> None:
    with pytest.raises(ValueError):
        profile_metrics(trace_p(), "genai-perf")


def test_guidellm_profile_ties_as_guidellm_081() -> None:
    """Issue 24.5: ten requests, TTFT 10, 20, ... 100 ms (one token each). GuideLLM 0.8.1
    sums probabilities of 0.1: nine of them make 0.8999999999999999 < 0.9, so its p90 is the
    tenth TTFT, 100 ms; twelve requests with TTFT 10 .. 120: six twelfths make
    0.49999999999999994, so p50 is the seventh, 70 ms (tokentrace's linear p50 is 65)."""
    ten = [rec(i, 0, [(10 * (i + 1), 1, C)], end_ms=200, out=1) for i in range(10)]
    g = profile_metrics(trace_from_records(ten), "guidellm").metrics["ttft"]
    assert g.percentiles[90.0] == pytest.approx(100.0)
    assert g.percentiles[50.0] == pytest.approx(50.0)
    twelve = [rec(i, 0, [(10 * (i + 1), 1, C)], end_ms=200, out=1) for i in range(12)]
    trace = trace_from_records(twelve)
    assert profile_metrics(trace, "guidellm").metrics["ttft"].percentiles[50.0] == pytest.approx(
        70.0
    )
    assert profile_metrics(trace, "tokentrace").metrics["ttft"].percentiles[50.0] == pytest.approx(
        65.0
    )
