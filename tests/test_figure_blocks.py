"""The run-page builders that walk every event in blocks (so a 10M-event run's finalize
stays within its memory budget) give exactly what a plain per-request computation gives:
ITL samples, ITL by position (sorted, ties in event order), the distribution pair, the
throughput histogram. Each is checked against a Python loop over the requests."""

from __future__ import annotations

import numpy as np
import pytest

from app.analysis import metrics as am
from app.domain import EventKind, RequestRecord, RequestStatus, trace_from_records
from app.figures import common as fg
from app.figures import runs as fr


def _trace(seed: int, *, max_tokens: int = 1, n: int = 40):  # type: ignore[no-untyped-def]
    """Requests with 0-30 chunks of 1..max_tokens tokens; some failed, some never sent."""
    rng = np.random.default_rng(seed)
    recs = []
    for i in range(n):
        k = int(rng.integers(0, 30))
        sent = int(rng.integers(0, 10_000_000))
        times = (sent + np.cumsum(rng.integers(1, 5_000_000, k))).tolist()
        tokens = rng.integers(1, max_tokens + 1, k).tolist()
        ok = bool(rng.random() > 0.2)
        recs.append(
            RequestRecord(
                index=i,
                scheduled_ns=sent,
                sent_ns=sent if rng.random() > 0.05 else -1,
                end_ns=(times[-1] if times else sent) + 1,
                status=RequestStatus.OK if ok else RequestStatus.ERROR,
                error=None if ok else "boom",
                input_tokens=10,
                output_tokens=sum(tokens),
                event_t_ns=np.array(times, np.int64),
                event_bytes=np.ones(k, np.int32),
                event_kind=np.full(k, EventKind.CONTENT, np.int8),
                event_tokens=np.array(tokens, np.int32),
            )
        )
    return recs, trace_from_records(recs)


def _naive_points(recs: list[RequestRecord]) -> list[tuple[int, float]]:
    """(position, per-token ITL ms) of every non-first chunk of each valid request, in
    request and event order."""
    out = []
    for r in recs:
        if r.status != RequestStatus.OK or r.sent_ns < 0:
            continue
        t, k = r.event_t_ns.tolist(), r.event_tokens.tolist()
        pos = 0
        for j in range(len(t)):
            pos += k[j]
            if j:
                out.append((pos, (t[j] - t[j - 1]) / k[j] / 1e6))
    return out


@pytest.fixture(params=[3, 1 << 19])
def block(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> int:
    size = int(request.param)
    monkeypatch.setattr(am, "EVENT_BLOCK", size)
    monkeypatch.setattr(fr, "EVENT_BLOCK", size)
    return size


@pytest.mark.parametrize("seed", range(6))
@pytest.mark.parametrize("max_tokens", [1, 3])
def test_itl_by_position_is_the_stable_sort_of_every_point(
    seed: int, max_tokens: int, block: int
) -> None:
    recs, trace = _trace(seed, max_tokens=max_tokens)
    want = sorted(_naive_points(recs), key=lambda p: p[0])  # sorted() is stable
    pos, itl = fr.itl_by_position(trace)
    assert pos.tolist() == [p for p, _ in want]
    assert itl.tolist() == [v for _, v in want]  # exactly: the same float operations


def test_itl_by_position_sorts_when_answers_are_too_long_to_count(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    recs, trace = _trace(1, max_tokens=3)
    monkeypatch.setattr(fr, "POSITION_SORT_LIMIT", 2)
    pos, itl = fr.itl_by_position(trace)
    want = sorted(_naive_points(recs), key=lambda p: p[0])
    assert pos.tolist() == [p for p, _ in want] and itl.tolist() == [v for _, v in want]


@pytest.mark.parametrize("seed", range(6))
@pytest.mark.parametrize("max_tokens", [1, 3])
def test_itl_samples_ms_are_the_pooled_samples(seed: int, max_tokens: int, block: int) -> None:
    recs, trace = _trace(seed, max_tokens=max_tokens)
    want: list[float] = []
    for r in recs:  # SPEC: a chunk of k tokens after a gap g gives k samples g/k, ...
        if r.status != RequestStatus.OK or r.sent_ns < 0 or len(r.event_t_ns) < 2:
            continue
        t, k = r.event_t_ns.tolist(), r.event_tokens.tolist()
        want += [0.0] * (k[0] - 1)  # ... the first chunk's k1 tokens give k1 - 1 zeros
        for j in range(1, len(t)):
            want += [(t[j] - t[j - 1]) / k[j] / 1e6] * k[j]
    got = am.itl_samples_ms(trace)
    assert got.tolist() == pytest.approx(want, rel=1e-12, abs=0)


def test_distribution_pair_equals_the_two_figures() -> None:
    rng = np.random.default_rng(3)
    x = rng.lognormal(2.0, 1.0, 50_001)
    x[::97] = np.nan
    x[5] = np.inf
    want = (fg.cdf_figure(x, title="T: CDF"), fg.histogram_figure(x, title="T: histogram"))
    assert fg.distribution_figures(x.copy(), title="T") == want
    assert fg.distribution_figures(np.array([np.nan]), title="T")[0]["data"] == []


def test_throughput_histogram_in_blocks_equals_one_histogram(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    rng = np.random.default_rng(4)
    t = np.sort(rng.uniform(0.0, 10.0, 100_003))
    k = rng.integers(1, 9, t.shape[0]).astype(np.int32)
    monkeypatch.setattr(fg, "BLOCK", 1000)
    counts, edges = fg._weighted_histogram(t, k, 200, (0.0, 10.0))
    want, want_edges = np.histogram(t, bins=200, range=(0.0, 10.0), weights=k.astype(float))
    assert counts.tolist() == want.tolist() and edges.tolist() == want_edges.tolist()


def test_itl_position_figure_of_sorted_points_equals_the_unsorted_path() -> None:
    rng = np.random.default_rng(5)
    pos = rng.integers(1, 700, 30_000)
    itl = rng.exponential(5.0, pos.shape[0])
    order = np.argsort(pos, kind="stable")
    want = fg.itl_position_figure(pos.astype(float), itl, max_points=400)
    got = fg.itl_position_figure(
        pos[order].astype(np.int32), itl[order], max_points=400, sorted_by_position=True
    )
    assert got == want
