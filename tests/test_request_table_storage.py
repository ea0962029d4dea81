"""app.storage.request_table and the runs-list ``sweep_steps`` filter on SQLite and
PostgreSQL: hand-made requests with known columns, orders and neighbours written out here."""

from __future__ import annotations

import numpy as np
import pytest

from app.client.spec import RunSpec
from app.domain import PerRequestMetrics, RequestRecord, RequestStatus
from app.storage import compare_repo, request_table
from app.storage import repository as repo
from app.storage.db import make_engine, session_factory, session_scope
from app.storage.request_table import TableQuery

MS = 1_000_000
# idx: (status, ttft ms, e2e ms, output tokens); None: no value stored
ROWS = {
    0: ("ok", 30.0, 300.0, 10),
    1: ("error", None, None, None),
    2: ("ok", 10.0, 500.0, 20),
    3: ("ok", 30.0, 200.0, 5),
    4: ("timeout", None, 900.0, None),
    5: ("ok", 20.0, 250.0, 8),
}


def _nan(v: float | None) -> float:
    return np.nan if v is None else v * MS


@pytest.fixture
def sessions(db_url: str):  # type: ignore[no-untyped-def]
    engine = make_engine(db_url)
    yield session_factory(engine)
    engine.dispose()


def _seed(sessions) -> str:  # type: ignore[no-untyped-def]
    recs = [
        RequestRecord(
            index=i,
            scheduled_ns=i * 100 * MS,
            sent_ns=i * 100 * MS,
            end_ns=i * 100 * MS + int(_nan(e2e)) if e2e is not None else None,
            status=RequestStatus(st),
            output_tokens=out,
        )
        for i, (st, _t, e2e, out) in ROWS.items()
    ]
    metrics = PerRequestMetrics(
        ttft_ns=np.array([_nan(r[1]) for r in ROWS.values()]),
        ttfot_ns=np.array([_nan(r[1]) for r in ROWS.values()]),
        e2e_ns=np.array([_nan(r[2]) for r in ROWS.values()]),
        tpot_ns=np.full(len(ROWS), np.nan),
        n_tokens=np.array([-1 if r[3] is None else r[3] for r in ROWS.values()], np.int64),
    )
    with session_scope(sessions) as s:
        run_id = repo.create_run(s, RunSpec(base_url="http://x.test", model="m", num_prompts=6))
        repo.insert_requests(s, run_id, recs, metrics)
    return run_id


def _idx(sessions, run_id: str, q: TableQuery) -> list[int]:  # type: ignore[no-untyped-def]
    with session_scope(sessions) as s:
        return [r["idx"] for r in request_table.table_rows(s, run_id, q, limit=100, offset=0)]


def test_sorts_filters_and_neighbours(sessions) -> None:  # type: ignore[no-untyped-def]
    run_id = _seed(sessions)
    # TTFT descending: 30 (0), 30 (3) tie by index, 20 (5), 10 (2), then no TTFT: 1, 4
    assert _idx(sessions, run_id, TableQuery(sort="ttft", desc=True)) == [0, 3, 5, 2, 1, 4]
    assert _idx(sessions, run_id, TableQuery(sort="ttft")) == [2, 5, 0, 3, 1, 4]
    # E2E ascending: 200 (3), 250 (5), 300 (0), 500 (2), 900 (4), none (1)
    assert _idx(sessions, run_id, TableQuery(sort="e2e")) == [3, 5, 0, 2, 4, 1]
    assert _idx(sessions, run_id, TableQuery(desc=True)) == [5, 4, 3, 2, 1, 0]
    assert _idx(sessions, run_id, TableQuery(status="failed")) == [1, 4]
    assert _idx(sessions, run_id, TableQuery(status="timeout")) == [4]
    ranged = TableQuery(sort="e2e", desc=True, ranges=(("ttft", 15.0, 30.0),))
    assert _idx(sessions, run_id, ranged) == [0, 5, 3]  # TTFT 15..30 ms: 0, 3, 5
    both = TableQuery(ranges=(("e2e", None, 300.0), ("output_tokens", 8, None)))
    assert _idx(sessions, run_id, both) == [0, 5]
    with session_scope(sessions) as s:
        assert request_table.count_rows(s, run_id, ranged) == 3
        q = TableQuery(sort="ttft", desc=True)
        n = request_table.neighbours(s, run_id, 5, q)
        assert (n.position, n.total, n.prev_idx, n.next_idx) == (2, 6, 3, 2)
        first = request_table.neighbours(s, run_id, 0, q)
        assert (first.prev_idx, first.next_idx) == (None, 3)
        last = request_table.neighbours(s, run_id, 4, q)
        assert (last.prev_idx, last.next_idx) == (1, None)
        out = request_table.neighbours(s, run_id, 1, TableQuery(status="ok"))
        assert (out.position, out.prev_idx, out.next_idx) == (None, None, None)
        cols = request_table.live_columns(s, run_id)
    order = np.argsort(cols.sent_ns)  # live_columns has no order: line it up by send time
    assert cols.ok[order].tolist() == [True, False, True, True, False, True]
    ttft = cols.values["ttft"][order]
    assert np.allclose(ttft, [_nan(r[1]) for r in ROWS.values()], equal_nan=True)
    assert cols.output_tokens[order].tolist() == [10, -1, 20, 5, -1, 8]


def test_bad_table_query_is_refused() -> None:
    with pytest.raises(ValueError, match="sort must be one of"):
        TableQuery(sort="bogus")
    with pytest.raises(ValueError):
        TableQuery(status="nope")
    with pytest.raises(ValueError, match="no range filter"):
        TableQuery(ranges=(("idx", 1.0, None),))


def test_runs_without_sweep_steps(sessions) -> None:  # type: ignore[no-untyped-def]
    spec = RunSpec(base_url="http://x.test", model="m", num_prompts=1)
    with session_scope(sessions) as s:
        plain = repo.create_run(s, spec)
        step = repo.create_run(s, spec)
        sweep = compare_repo.create_sweep(s, spec={}, mode="rates", loads=[1.0])
        compare_repo.add_step(s, sweep, step_idx=0, run_id=step, load=1.0, load_kind="rate")
    with session_scope(sessions) as s:
        assert {r.id for r in repo.list_runs(s)} == {plain, step}
        assert [r.id for r in repo.list_runs(s, sweep_steps=False)] == [plain]
        assert repo.count_runs(s, sweep_steps=False) == 1 and repo.count_runs(s) == 2
        assert repo.run_sources(s) == ["bench"]
        assert repo.sweep_step_counts(s) == [(sweep, 1)]
        assert repo.sweep_step_counts(s, model="other") == []


@pytest.mark.parametrize("sort", ["idx", "status", "ttft", "e2e", "output_tokens", "tpot"])
@pytest.mark.parametrize("desc", [False, True])
def test_neighbours_walk_the_table_order(sessions, sort: str, desc: bool) -> None:  # type: ignore[no-untyped-def]
    """Every row's previous/next and position agree with the table's own order (ties and
    missing values included), with and without a filter."""
    run_id = _seed(sessions)
    for q in (TableQuery(sort=sort, desc=desc), TableQuery(sort=sort, desc=desc, status="ok")):
        order = _idx(sessions, run_id, q)
        with session_scope(sessions) as s:
            for pos, idx in enumerate(order):
                n = request_table.neighbours(s, run_id, idx, q)
                assert n.position == pos and n.total == len(order)
                assert n.prev_idx == (order[pos - 1] if pos else None)
                assert n.next_idx == (order[pos + 1] if pos + 1 < len(order) else None)
