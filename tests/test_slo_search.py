"""SLO capacity search (app.analysis.slo_search): parsing, a step's confidence bound
against independent computations, and the search against an oracle with a known answer."""

from __future__ import annotations

import math

import numpy as np
import pytest

from app.analysis.metric_defs import TPOT, TTFT
from app.analysis.slo_search import (
    FindMax,
    Probe,
    Search,
    Slo,
    SloError,
    find_max_of,
    parse_slo,
    slo_checks,
    upper_bound,
)

MS = 1_000_000


def test_parse_slo() -> None:
    assert parse_slo("tpot:p99:50") == Slo("tpot", 99.0, 50.0)
    assert parse_slo("ttft:99.9:500") == Slo("ttft", 99.9, 500.0)
    assert parse_slo("e2el:P50:2000").text == "e2el:p50:2000"


@pytest.mark.parametrize(
    ("text", "says"),
    [
        ("foo:p99:50", "unknown metric 'foo'"),
        ("tpot:p0:50", "out of range"),
        ("tpot:p101:50", "out of range"),
        ("tpot:pxx:50", "not a number"),
        ("tpot:p99:-5", "positive"),
        ("tpot:p99", "not METRIC:PCT:LIMIT"),
    ],
)
def test_bad_slo_names_the_field(text: str, says: str) -> None:
    with pytest.raises(SloError) as e:
        parse_slo(text)
    assert e.value.field == "slo" and says in str(e.value)


@pytest.mark.parametrize(
    ("data", "field"),
    [
        ({"kind": "tokens", "slos": ["tpot:p99:5"]}, "find_max"),
        ({"kind": "rate", "slos": ["tpot:p99:5"], "confidence": 1.0}, "confidence"),
        ({"kind": "rate", "slos": ["tpot:p99:5"], "confidence": 0}, "confidence"),
        ({"kind": "rate", "slos": []}, "slo"),
        ({"kind": "rate", "slos": ["tpot:p99:5"], "max_steps": 0}, "max_steps"),
        ({"kind": "concurrency", "slos": ["tpot:p99:5"], "start": 1.5}, "find_max_start"),
    ],
)
def test_bad_find_max_names_the_field(data: dict[str, object], field: str) -> None:
    with pytest.raises(SloError) as e:
        find_max_of(data)
    assert e.value.field == field


def test_find_max_round_trip() -> None:
    fm = FindMax("rate", (Slo("ttft", 99, 500), Slo("tpot", 90, 50)), 0.9, 8, 2.0, 64.0)
    assert find_max_of(fm.to_dict()) == fm


def test_upper_bound_small_sample_against_a_plain_bootstrap() -> None:
    rng = np.random.default_rng(3)
    x = rng.gamma(2.0, 10.0, 400)
    point, up = upper_bound(x, 90, 0.95, seed=1)
    assert point == pytest.approx(np.percentile(x, 90))
    # an independent bootstrap: 4,000 resamples drawn the obvious way
    draws = np.percentile(rng.choice(x, size=(4000, x.size), replace=True), 90, axis=1)
    assert up == pytest.approx(float(np.quantile(draws, 0.95)), rel=0.03)
    assert up > point
    # a higher confidence asks more
    assert upper_bound(x, 90, 0.99, seed=1)[1] >= up


def test_upper_bound_large_sample_is_the_order_statistic() -> None:
    x = np.arange(100_000, dtype=np.float64)  # past the bootstrap's size
    _, up = upper_bound(x, 50, 0.95, seed=0)
    # rank ceil(N q + 1.645 sqrt(N q (1-q))) - 1 = ceil(50000 + 260.1) - 1 = 50260
    assert up == 50260.0


def test_slo_checks_on_per_request_values() -> None:
    tpot_ns = np.array([10.0, 10.0, 10.0, 10.0, np.nan]) * MS
    ttft_ns = np.array([100.0, 200.0, 300.0, 400.0, 500.0]) * MS
    valid = np.array([True, True, True, True, False])
    fm = FindMax("concurrency", (Slo("tpot", 99, 10.0), Slo("ttft", 50, 200.0)))
    checks = slo_checks({TPOT.key: tpot_ns, TTFT.key: ttft_ns}, valid, fm)
    assert checks[0]["ok"] is True and checks[0]["value_ms"] == 10.0  # constant: bound = 10
    assert checks[0]["samples"] == 4
    assert checks[1]["value_ms"] == pytest.approx(250.0)  # p50 of 100..400
    assert checks[1]["ok"] is False
    fm2 = FindMax("concurrency", (Slo("user_ttft", 99, 10.0),))
    (none,) = slo_checks({}, valid, fm2)
    assert none["ok"] is False and none["value_ms"] is None


def oracle(true_max: float, fm: FindMax) -> Search:
    """The search against a server whose SLO holds exactly up to ``true_max``."""
    s = Search(fm)
    while (load := s.next_load()) is not None:
        ok = load <= true_max
        check = {"slo": "tpot:p99:1", "ok": ok, "value_ms": 0.5 if ok else 2.0, "limit_ms": 1.0}
        s.record(Probe(load, [check], throughput=load, error_rate=0.0))
    return s


@pytest.mark.parametrize("true_max", [1, 2, 7, 12, 13, 100, 500])
def test_concurrency_search_brackets_the_answer(true_max: int) -> None:
    fm = FindMax("concurrency", (Slo("tpot", 99, 1.0),), max_steps=20)
    s = oracle(true_max, fm)
    assert s.passing == true_max and s.failing == true_max + 1
    # doubling to the first failure, then bisection: about 2 log2(true_max) steps
    assert len(s.probes) <= 2 * math.ceil(math.log2(true_max + 1)) + 1


def test_concurrency_search_12_in_ten_steps() -> None:
    s = oracle(12, FindMax("concurrency", (Slo("tpot", 99, 1.0),)))
    assert [p.load for p, _ in s.probes] == [1, 2, 4, 8, 16, 12, 14, 13]
    assert s.answer()["interval"] == [12, 13]


def test_rate_search_within_the_resolution() -> None:
    s = oracle(37.0, FindMax("rate", (Slo("tpot", 99, 1.0),), max_steps=20))
    lo, hi = s.passing, s.failing
    assert lo is not None and hi is not None
    assert lo <= 37.0 < hi and hi / lo <= 1.05


def test_start_failing_and_never_failing() -> None:
    s = oracle(0.5, FindMax("rate", (Slo("tpot", 99, 1.0),)))
    assert s.passing is None and s.failing == 1.0 and len(s.probes) == 1
    s = oracle(1e9, FindMax("concurrency", (Slo("tpot", 99, 1.0),), max_load=16))
    assert s.passing == 16 and s.failing is None
    assert "every load up to 16" in s.stop_reason()


def test_over_saturation_stops_going_up() -> None:
    # throughput flat from 4 on: 8 passes its SLO but is over-saturated
    s = Search(FindMax("concurrency", (Slo("tpot", 99, 1.0),)))
    ok = {"slo": "tpot:p99:1", "ok": True, "value_ms": 0.5, "limit_ms": 1.0}
    while (load := s.next_load()) is not None:
        s.record(Probe(load, [ok], throughput=min(load, 4.0), error_rate=0.0))
    # going up, 8 grew 2x over the passing 4 and gained nothing: over-saturated, the upper
    # end; bisection below it reads the SLOs only (6 and 7 hold them)
    assert [p.load for p, _ in s.probes] == [1, 2, 4, 8, 6, 7]
    assert (s.passing, s.failing) == (7, 8)
    assert any("over-saturated" in v.why for _, v in s.probes)
