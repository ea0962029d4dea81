"""Storage layer: event packing, repository round trips on SQLite and PostgreSQL, migrations."""

from __future__ import annotations

import datetime as dt
import math
from pathlib import Path

import numpy as np
import pytest
from sqlalchemy import Engine, inspect, select, text
from sqlalchemy.orm import Session

from app.client.spec import RunSpec
from app.domain import (
    ClockSource,
    EventKind,
    PerRequestMetrics,
    RequestRecord,
    RequestStatus,
    RunStatus,
    RunTrace,
    trace_from_records,
)
from app.protocol import packing
from app.protocol.packing import pack_events, unpack_events, unpack_many
from app.storage.db import (
    downgrade_database,
    make_engine,
    migrations_dir,
    session_factory,
    session_scope,
    upgrade_database,
)
from app.storage.models import Base, Request, Run
from app.storage.repository import (
    NotFoundError,
    count_requests,
    count_runs,
    create_run,
    delete_run,
    find_run,
    finish_run,
    get_request_events,
    get_run,
    insert_requests,
    list_runs,
    load_records,
    load_trace,
    run_spec,
    set_note,
    set_tags,
    start_run,
    update_run,
)

# ------------------------------------------------------------------------------ helpers


def _events(
    rng: np.random.Generator, n: int, *, start: int = 0
) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    gaps = rng.integers(1_000_000, 20_000_000, n)
    t = start + np.cumsum(gaps).astype(np.int64)
    nbytes = rng.integers(20, 300, n).astype(np.int32)
    kind = np.full(n, EventKind.CONTENT, np.int8)
    tokens = np.ones(n, np.int32)
    if n > 3:
        kind[0] = EventKind.ROLE
        tokens[0] = 0
        kind[1] = EventKind.REASONING
        kind[-1] = EventKind.USAGE
        tokens[-1] = 0
        tokens[2] = 4  # several tokens in one chunk
    return t, nbytes, kind, tokens


def make_records(n: int = 12, *, seed: int = 0, warmup: int = 2) -> list[RequestRecord]:
    rng = np.random.default_rng(seed)
    out: list[RequestRecord] = []
    for i in range(n):
        sent = i * 5_000_000
        if i % 5 == 3:  # failed: no events
            out.append(
                RequestRecord(
                    index=i,
                    scheduled_ns=sent - 100,
                    sent_ns=sent,
                    end_ns=sent + 900_000_000,
                    status=RequestStatus.TIMEOUT if i % 2 else RequestStatus.ERROR,
                    error="timed out" if i % 2 else "HTTP 500: boom",
                    http_status=None if i % 2 else 500,
                    input_tokens=128,
                    warmup=i < warmup,
                )
            )
            continue
        if i % 7 == 6:  # never sent
            out.append(
                RequestRecord(
                    index=i,
                    scheduled_ns=sent,
                    sent_ns=None,
                    end_ns=None,
                    status=RequestStatus.CANCELLED,
                )
            )
            continue
        n_ev = int(rng.integers(1, 40))
        t, b, k, tok = _events(rng, n_ev, start=sent)
        out.append(
            RequestRecord(
                index=i,
                scheduled_ns=sent - 10,
                sent_ns=sent,
                end_ns=int(t[-1]) + 1000,
                status=RequestStatus.OK,
                http_status=200,
                input_tokens=128 + i,
                output_tokens=int(tok.sum()),
                tokenizer_output_tokens=int(tok.sum()),
                usage_prompt_tokens=128 + i,
                usage_completion_tokens=int(tok.sum()) + (i % 2),
                token_source="usage",
                done_ns=int(t[-1]) + 2000,
                warmup=i < warmup,
                event_t_ns=t,
                event_bytes=b,
                event_kind=k,
                event_tokens=tok,
            )
        )
    return out


def make_metrics(records: list[RequestRecord]) -> PerRequestMetrics:
    """Metrics aligned with ``records`` (NaN for failures and single-token requests)."""
    n = len(records)
    ttft = np.full(n, np.nan)
    e2e = np.full(n, np.nan)
    tpot = np.full(n, np.nan)
    for i, r in enumerate(records):
        if r.status is RequestStatus.OK and r.sent_ns is not None and r.event_t_ns.size:
            ttft[i] = float(r.event_t_ns[0] - r.sent_ns) + 0.4
            e2e[i] = float(r.event_t_ns[-1] - r.sent_ns)
            if r.event_t_ns.size > 1:
                tpot[i] = float(r.event_t_ns[-1] - r.event_t_ns[0]) / (r.event_t_ns.size - 1)
    return PerRequestMetrics(
        ttft_ns=ttft,
        ttfot_ns=ttft.copy(),
        e2e_ns=e2e,
        tpot_ns=tpot,
        n_tokens=np.array([r.output_tokens or -1 for r in records], np.int64),
    )


def make_spec(**kw: object) -> RunSpec:
    base: dict[str, object] = {
        "base_url": "http://127.0.0.1:8000/",
        "model": "llama-3-8b",
        "tags": ["baseline"],
        "goodput": {"ttft": 150.0},
        "api_key": "secret",
    }
    base.update(kw)
    return RunSpec.model_validate(base)


def assert_traces_equal(a: RunTrace, b: RunTrace) -> None:
    for name in (
        "sent_ns",
        "end_ns",
        "ok",
        "input_tokens",
        "output_tokens",
        "ev_offsets",
        "ev_t_ns",
        "ev_kind",
        "ev_tokens",
    ):
        x, y = getattr(a, name), getattr(b, name)
        assert x.dtype == y.dtype, name
        np.testing.assert_array_equal(x, y, err_msg=name)
    assert a.status == b.status
    assert a.errors == b.errors
    assert a.summary_only == b.summary_only
    assert a.clock_source == b.clock_source


def assert_records_equal(a: list[RequestRecord], b: list[RequestRecord]) -> None:
    assert len(a) == len(b)
    for x, y in zip(a, b, strict=True):
        for f in RequestRecord.__slots__:
            vx, vy = getattr(x, f), getattr(y, f)
            if isinstance(vx, np.ndarray):
                assert vx.dtype == vy.dtype, f
                np.testing.assert_array_equal(vx, vy, err_msg=f)
            else:
                assert vx == vy, (f, vx, vy)


# ------------------------------------------------------------------------------ packing


def _random_columns(rng: np.random.Generator, n: int, mode: str) -> tuple[np.ndarray, ...]:
    t = np.cumsum(rng.integers(0, 50_000_000, n)).astype(np.int64) + int(
        rng.integers(-(10**12), 10**12)
    )
    b = rng.integers(0, 70_000, n).astype(np.int32)
    k = rng.integers(0, 5, n).astype(np.int8)
    tok = rng.integers(0, 5, n).astype(np.int32)
    if mode == "negative_gap" and n > 1:
        t[n // 2] -= 10**9
    if mode == "huge_gap" and n > 1:
        t[n // 2 :] += 2**33
    if mode == "extremes":
        t = rng.integers(np.iinfo(np.int64).min, np.iinfo(np.int64).max, n, dtype=np.int64)
        b = rng.integers(np.iinfo(np.int32).min, np.iinfo(np.int32).max, n, dtype=np.int32)
        k = rng.integers(-128, 127, n, dtype=np.int8)
        tok = rng.integers(np.iinfo(np.int32).min, np.iinfo(np.int32).max, n, dtype=np.int32)
    if mode == "narrow":
        b = rng.integers(0, 65_536, n).astype(np.int32)
        k[:] = 0
        tok[:] = 1
    if mode == "negative_small" and n:
        b[-1] = -1
        tok[0] = -3
    if mode == "big_tokens":
        tok[:] = 70_000
    return t, b, k, tok


MODES = ["plain", "negative_gap", "huge_gap", "extremes", "narrow", "negative_small", "big_tokens"]


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("n", [0, 1, 2, 3, 17, 1000])
def test_pack_round_trip(mode: str, n: int) -> None:
    rng = np.random.default_rng(n * 31 + len(mode))
    for _ in range(5):
        cols = _random_columns(rng, n, mode)
        blob = pack_events(*cols)
        assert isinstance(blob, bytes)
        assert packing.event_count(blob) == n
        out = unpack_events(blob)
        for got, want, dtype in zip(
            out, cols, (np.int64, np.int32, np.int8, np.int32), strict=True
        ):
            assert got.dtype == dtype
            np.testing.assert_array_equal(got, want)


def test_pack_is_compact_for_typical_streams() -> None:
    rng = np.random.default_rng(1)
    n = 1000
    t = np.cumsum(rng.normal(10e6, 1e6, n).clip(1)).astype(np.int64)
    b = rng.integers(80, 200, n).astype(np.int32)
    blob = pack_events(t, b, np.zeros(n, np.int8), np.ones(n, np.int32))
    assert len(blob) == 16 + 4 * (n - 1) + 2 * n + 2 + 1
    t_abs = t.copy()
    t_abs[5] = t_abs[4] - 1  # a negative gap forces absolute int64 times
    assert len(pack_events(t_abs, b, np.zeros(n, np.int8), np.ones(n, np.int32))) == (
        16 + 8 * n + 2 * n + 2 + 1
    )


def test_pack_accepts_python_lists_and_other_int_dtypes() -> None:
    blob = pack_events(
        [5, 7, 7], np.array([1, 2, 3], np.int64), [0, 1, 0], np.array([1, 1, 2], np.uint8)
    )
    t, b, k, tok = unpack_events(blob)
    assert t.tolist() == [5, 7, 7] and b.tolist() == [1, 2, 3]
    assert k.tolist() == [0, 1, 0] and tok.tolist() == [1, 1, 2]


def test_pack_rejects_bad_input() -> None:
    z = np.zeros(3, np.int64)
    with pytest.raises(ValueError, match="differ in length"):
        pack_events(z, np.zeros(2, np.int32), np.zeros(3, np.int8), np.zeros(3, np.int32))
    with pytest.raises(ValueError, match="1-D"):
        pack_events(np.zeros((2, 2), np.int64), z, z, z)
    with pytest.raises(TypeError, match="integer dtype"):
        pack_events(np.zeros(3, np.float64), z, z, z)
    with pytest.raises(ValueError, match="outside"):
        pack_events(z, np.array([0, 0, 2**40]), np.zeros(3, np.int8), np.zeros(3, np.int32))
    with pytest.raises(ValueError, match="outside"):
        pack_events(z, np.zeros(3, np.int32), np.array([0, 300, 0]), np.zeros(3, np.int32))


def test_unpack_rejects_corrupt_blobs() -> None:
    good = pack_events(
        np.arange(10, dtype=np.int64), np.arange(10), np.arange(10) % 3, np.ones(10, np.int32)
    )
    with pytest.raises(ValueError, match="too short"):
        unpack_events(good[:5])
    with pytest.raises(ValueError, match="too short"):
        unpack_events(b"")
    with pytest.raises(ValueError, match="corrupt"):
        unpack_events(good[:-1])
    with pytest.raises(ValueError, match="corrupt"):
        unpack_events(good + b"\x00")
    with pytest.raises(ValueError, match="magic"):
        unpack_events(b"XX" + good[2:])
    with pytest.raises(ValueError, match="version"):
        unpack_events(good[:2] + bytes([99]) + good[3:])
    with pytest.raises(ValueError, match="flags"):
        unpack_events(good[:3] + bytes([0x80]) + good[4:])
    with pytest.raises(ValueError, match="#1"):
        unpack_many([good, good[:-1]])


def test_unpack_many_matches_concatenation() -> None:
    rng = np.random.default_rng(7)
    cols_list = []
    blobs: list[bytes | None] = []
    for i in range(60):
        mode = MODES[i % len(MODES)]
        n = int(rng.integers(0, 50)) if i % 4 else 0
        cols = _random_columns(rng, n, mode)
        cols_list.append(cols)
        blobs.append(pack_events(*cols))
    blobs.append(None)
    cols_list.append(tuple(np.zeros(0, d) for d in (np.int64, np.int32, np.int8, np.int32)))
    offsets, ev = unpack_many(blobs)
    counts = [c[0].shape[0] for c in cols_list]
    np.testing.assert_array_equal(offsets, np.concatenate([[0], np.cumsum(counts)]))
    for got, j in zip((ev.t_ns, ev.nbytes, ev.kind, ev.tokens), range(4), strict=True):
        np.testing.assert_array_equal(got, np.concatenate([c[j] for c in cols_list]))
    _, ev2 = unpack_many(blobs, with_nbytes=False)
    np.testing.assert_array_equal(ev2.t_ns, ev.t_ns)
    assert not ev2.nbytes.any()
    off0, ev0 = unpack_many([])
    assert off0.tolist() == [0] and ev0.t_ns.shape == (0,)


# --------------------------------------------------------------------------- repository


def _store(session: Session, records: list[RequestRecord], **kw: object) -> str:
    run_id = create_run(session, make_spec(), source="bench", name="r1", **kw)  # type: ignore[arg-type]
    insert_requests(session, run_id, records, make_metrics(records))
    session.commit()
    return run_id


def test_round_trip_trace_and_records(db_session: Session) -> None:
    records = make_records(30)
    run_id = _store(db_session, records, clock_source=ClockSource.KERNEL)
    db_session.expunge_all()

    trace = load_trace(db_session, run_id)
    assert_traces_equal(trace, trace_from_records(records, clock_source=ClockSource.KERNEL))
    assert trace.n_requests == 28
    full = load_trace(db_session, run_id, include_warmup=True)
    assert_traces_equal(
        full,
        trace_from_records(records, include_warmup=True, clock_source=ClockSource.KERNEL),
    )
    assert_records_equal(load_records(db_session, run_id), records)
    assert_records_equal(
        load_records(db_session, run_id, include_warmup=False), [r for r in records if not r.warmup]
    )
    ev = get_request_events(db_session, run_id, 0)
    np.testing.assert_array_equal(ev.t_ns, records[0].event_t_ns)
    np.testing.assert_array_equal(ev.nbytes, records[0].event_bytes)
    assert count_requests(db_session, run_id) == 30
    assert count_requests(db_session, run_id, include_warmup=False) == 28


def test_records_inserted_out_of_order_load_sorted(db_session: Session) -> None:
    records = make_records(10, warmup=0)
    run_id = create_run(db_session, make_spec(), source="bench")
    insert_requests(db_session, run_id, records[::-1])
    db_session.commit()
    assert_records_equal(load_records(db_session, run_id), records)


def test_empty_run_loads_empty_trace(db_session: Session) -> None:
    run_id = create_run(
        db_session, None, source="import:csv", summary_only=True, model="imported-model"
    )
    db_session.commit()
    trace = load_trace(db_session, run_id)
    assert trace.n_requests == 0 and trace.n_events == 0
    assert trace.ev_offsets.tolist() == [0]
    assert trace.summary_only is True
    assert trace.clock_source is ClockSource.USERSPACE
    assert load_records(db_session, run_id) == []
    run = get_run(db_session, run_id)
    assert run.spec is None and run_spec(run) is None
    assert run.model == "imported-model" and run.target_url is None and run.tags == []


def test_idempotent_insert(db_session: Session, db_engine: Engine) -> None:
    records = make_records(12)
    run_id = _store(db_session, records)
    # A retried upload of an overlapping batch: nothing is duplicated or changed.
    changed = make_records(16, seed=99)
    for r in changed:
        r.error = "second upload"
    insert_requests(db_session, run_id, changed)
    db_session.commit()
    assert count_requests(db_session, run_id) == 16
    loaded = load_records(db_session, run_id)
    assert_records_equal(loaded[:12], records)
    assert_records_equal(loaded[12:], changed[12:])
    # replace=True overwrites existing rows.
    insert_requests(db_session, run_id, changed, replace=True)
    db_session.commit()
    assert count_requests(db_session, run_id) == 16
    assert_records_equal(load_records(db_session, run_id), changed)
    with db_engine.connect() as conn:
        n = conn.execute(text("SELECT count(*) FROM requests")).scalar_one()
    assert n == 16


def test_nan_metrics_are_null(db_session: Session) -> None:
    records = make_records(10, warmup=0)
    run_id = create_run(db_session, make_spec(), source="bench")
    metrics = make_metrics(records)
    metrics.tpot_ns[0] = math.inf
    insert_requests(db_session, run_id, records, metrics)
    db_session.commit()
    rows = {
        r.idx: r
        for r in db_session.execute(
            select(
                Request.idx,
                Request.ttft_ns,
                Request.ttfot_ns,
                Request.e2e_ns,
                Request.tpot_ns,
                Request.n_events,
            )
        )
    }
    for i, r in enumerate(records):
        row = rows[i]
        assert row.n_events == r.event_t_ns.shape[0]
        if math.isnan(metrics.ttft_ns[i]):
            assert row.ttft_ns is None and row.e2e_ns is None and row.ttfot_ns is None
        else:
            assert row.ttft_ns == round(metrics.ttft_ns[i])
            assert isinstance(row.ttft_ns, int)
            assert row.e2e_ns == int(metrics.e2e_ns[i])
        if i == 0 or math.isnan(metrics.tpot_ns[i]):
            assert row.tpot_ns is None
        else:
            assert row.tpot_ns == pytest.approx(metrics.tpot_ns[i], rel=1e-12)
    # SQL can filter on the summary columns.
    slow = db_session.scalars(
        select(Request.idx).where(Request.run_id == run_id, Request.ttft_ns.is_not(None))
    ).all()
    assert sorted(slow) == [i for i in range(10) if not math.isnan(metrics.ttft_ns[i])]


def test_insert_requests_rejects_bad_input(db_session: Session) -> None:
    records = make_records(4)
    with pytest.raises(NotFoundError):
        insert_requests(db_session, "nope", records)
    run_id = create_run(db_session, make_spec(), source="bench")
    with pytest.raises(ValueError, match="aligned"):
        insert_requests(db_session, run_id, records, make_metrics(records[:3]))
    with pytest.raises(ValueError, match="duplicate"):
        insert_requests(db_session, run_id, [records[0], records[0]])
    with pytest.raises(TypeError):
        insert_requests(db_session, run_id, [object()])  # type: ignore[list-item]


def test_delete_cascades(db_session: Session, db_engine: Engine) -> None:
    keep = _store(db_session, make_records(5))
    gone = _store(db_session, make_records(7))
    assert delete_run(db_session, gone) is True
    db_session.commit()
    assert delete_run(db_session, gone) is False
    with db_engine.connect() as conn:
        rows = conn.execute(text("SELECT run_id, count(*) FROM requests GROUP BY run_id")).all()
    assert [tuple(r) for r in rows] == [(keep, 5)]
    with pytest.raises(NotFoundError):
        load_trace(db_session, gone)
    assert find_run(db_session, gone) is None
    with pytest.raises(NotFoundError):
        get_run(db_session, gone)


def test_database_cascade_without_orm(db_session: Session, db_engine: Engine) -> None:
    run_id = _store(db_session, make_records(5))
    with db_engine.begin() as conn:
        conn.execute(text("DELETE FROM runs WHERE id = :id"), {"id": run_id})
    with db_engine.connect() as conn:
        assert conn.execute(text("SELECT count(*) FROM requests")).scalar_one() == 0


def test_run_fields_and_updates(db_session: Session) -> None:
    spec = make_spec()
    run_id = create_run(
        db_session, spec, source="bench", name="baseline", client_host="h1", client_version="9"
    )
    db_session.commit()
    db_session.expunge_all()
    run = get_run(db_session, run_id)
    assert len(run_id) == 12 and int(run_id, 16) >= 0
    assert run.status is RunStatus.QUEUED
    assert run.model == "llama-3-8b" and run.target_url == "http://127.0.0.1:8000"
    assert run.endpoint == "chat" and run.client_host == "h1" and run.client_version == "9"
    assert run.tags == ["baseline"] and run.validity == [] and run.client_limited is False
    assert run.created_at.tzinfo is not None
    assert "api_key" not in run.spec
    restored = run_spec(run)
    assert restored == spec.model_copy(update={"api_key": None})
    assert math.isinf(restored.request_rate)

    started = dt.datetime(2026, 1, 2, 3, 4, 5, 678901, tzinfo=dt.timezone(dt.timedelta(hours=2)))
    start_run(db_session, run_id, started_at=started)
    finish_run(
        db_session,
        run_id,
        status=RunStatus.SUCCEEDED,
        start_mono_ns=2**62,
        client_limited=True,
        validity=["send lag p99 12 ms > 10 ms"],
        load_stats={"achieved_rate": 9.5, "send_lag_ms": {"p99": 12.0}, "loop_lag": float("nan")},
        summary={"ttft": {"p50": 150.0, "p95": float("nan")}, "rate": float("inf")},
        clock_source=ClockSource.KERNEL,
    )
    db_session.commit()
    db_session.expunge_all()
    run = get_run(db_session, run_id)
    assert run.status is RunStatus.SUCCEEDED
    assert run.started_at == started
    assert run.started_at.utcoffset() == dt.timedelta(0)
    assert run.finished_at is not None and run.finished_at >= run.started_at
    assert run.start_mono_ns == 2**62
    assert run.client_limited is True
    assert run.validity == ["send lag p99 12 ms > 10 ms"]
    assert run.load_stats == {"achieved_rate": 9.5, "send_lag_ms": {"p99": 12.0}, "loop_lag": None}
    assert run.summary == {"ttft": {"p50": 150.0, "p95": None}, "rate": "inf"}
    assert run.clock_source is ClockSource.KERNEL
    assert load_trace(db_session, run_id).clock_source is ClockSource.KERNEL

    assert set_tags(db_session, run_id, [" a ", "b", "a"]) == ["a", "b"]
    set_note(db_session, run_id, "looks fine")
    db_session.commit()
    db_session.expunge_all()
    run = get_run(db_session, run_id)
    assert run.tags == ["a", "b"] and run.note == "looks fine"

    # A later summary-only update keeps status and finished_at.
    finished = run.finished_at
    finish_run(db_session, run_id, summary={"ttft_ms_p50": 1.5})
    db_session.commit()
    db_session.expunge_all()
    run = get_run(db_session, run_id)
    assert run.finished_at == finished and run.status is RunStatus.SUCCEEDED
    assert run.summary == {"ttft_ms_p50": 1.5}

    with pytest.raises(ValueError, match="cannot update"):
        update_run(db_session, run_id, model="x")
    with pytest.raises(ValueError):
        update_run(db_session, run_id, status="bogus")
    with pytest.raises(ValueError):
        set_tags(db_session, run_id, [""])
    with pytest.raises(TypeError):
        set_tags(db_session, run_id, "abc")
    with pytest.raises(ValueError, match="naive"):
        update_run(db_session, run_id, started_at=dt.datetime(2026, 1, 1))
    db_session.rollback()
    with pytest.raises(NotFoundError):
        update_run(db_session, "missing", note="x")


def test_list_runs_filters(db_session: Session) -> None:
    t0 = dt.datetime(2026, 1, 1, tzinfo=dt.UTC)
    ids = []
    for i in range(6):
        rid = create_run(
            db_session,
            make_spec(model="m-a" if i % 2 else "m-b", tags=["x"] if i < 3 else ["y", "x_"]),
            source="bench" if i != 5 else "import:csv",
            created_at=t0 + dt.timedelta(minutes=i),
            status=RunStatus.SUCCEEDED if i % 3 else RunStatus.FAILED,
        )
        ids.append(rid)
    db_session.commit()
    newest_first = ids[::-1]
    assert [r.id for r in list_runs(db_session)] == newest_first
    assert [r.id for r in list_runs(db_session, limit=2, offset=1)] == newest_first[1:3]
    assert [r.id for r in list_runs(db_session, model="m-a")] == [ids[5], ids[3], ids[1]]
    assert [r.id for r in list_runs(db_session, status=RunStatus.FAILED)] == [ids[3], ids[0]]
    assert [r.id for r in list_runs(db_session, status="failed", model="m-b")] == [ids[0]]
    assert [r.id for r in list_runs(db_session, tag="x")] == [ids[2], ids[1], ids[0]]
    assert [r.id for r in list_runs(db_session, tag="x_")] == [ids[5], ids[4], ids[3]]
    assert list_runs(db_session, tag="%") == []
    assert [r.id for r in list_runs(db_session, source="import:csv")] == [ids[5]]
    assert count_runs(db_session) == 6
    assert count_runs(db_session, tag="y", model="m-a") == 2
    with pytest.raises(ValueError):
        list_runs(db_session, limit=-1)


def test_session_scope_commits_and_rolls_back(db_engine: Engine) -> None:
    factory = session_factory(db_engine)
    with session_scope(factory) as s:
        rid = create_run(s, make_spec(), source="bench")
    with pytest.raises(RuntimeError), session_scope(factory) as s:
        create_run(s, make_spec(), source="bench", run_id="rolledback00")
        raise RuntimeError("boom")
    with session_scope(factory) as s:
        assert [r.id for r in list_runs(s)] == [rid]


def test_get_request_events_missing(db_session: Session) -> None:
    run_id = _store(db_session, make_records(3, warmup=0))
    with pytest.raises(NotFoundError, match="index 99"):
        get_request_events(db_session, run_id, 99)


# --------------------------------------------------------------------------- migrations


def _tables(url: str) -> set[str]:
    engine = make_engine(url)
    try:
        return set(inspect(engine).get_table_names())
    finally:
        engine.dispose()


def test_migrations_up_down_up(db_url: str) -> None:
    assert {"runs", "requests", "alembic_version"} <= _tables(db_url)
    downgrade_database(db_url)
    assert _tables(db_url) <= {"alembic_version"}
    upgrade_database(db_url)
    assert {"runs", "requests"} <= _tables(db_url)
    engine = make_engine(db_url)
    try:
        with session_factory(engine)() as s:
            run_id = _store(s, make_records(4))
            assert count_requests(s, run_id) == 4
    finally:
        engine.dispose()


def test_models_match_migration(db_engine: Engine) -> None:
    from alembic.autogenerate import compare_metadata
    from alembic.migration import MigrationContext

    with db_engine.connect() as conn:
        ctx = MigrationContext.configure(conn, opts={"compare_type": True})
        diff = compare_metadata(ctx, Base.metadata)
    assert diff == []


def test_sqlite_engine_settings(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'a' / 'b' / 'x.db'}"
    engine = make_engine(url)
    try:
        with engine.connect() as conn:
            assert conn.execute(text("PRAGMA foreign_keys")).scalar_one() == 1
            assert conn.execute(text("PRAGMA journal_mode")).scalar_one() == "wal"
            assert conn.execute(text("PRAGMA busy_timeout")).scalar_one() >= 1000
        assert (tmp_path / "a" / "b" / "x.db").exists()
    finally:
        engine.dispose()
    mem = make_engine("sqlite://")
    try:
        Base.metadata.create_all(mem)
        with session_factory(mem)() as s:
            rid = create_run(s, make_spec(), source="bench")
            s.commit()
            assert get_run(s, rid).id == rid
    finally:
        mem.dispose()


def test_migrations_dir_is_found() -> None:
    d = migrations_dir()
    assert (d / "env.py").is_file()
    assert (d / "versions" / "0001_initial.py").is_file()


def test_run_orm_cascade(db_session: Session) -> None:
    run_id = _store(db_session, make_records(3, warmup=0))
    run = db_session.get(Run, run_id)
    assert run is not None
    assert [r.idx for r in run.requests] == [0, 1, 2]
    db_session.delete(run)
    db_session.commit()
    assert db_session.scalar(select(Request.id).limit(1)) is None


def test_pg_copy_falls_back_on_conflict(pg_url: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """A concurrent writer's rows make COPY fail: the upsert path then skips them."""
    from app.storage import bulk

    engine = make_engine(pg_url)
    try:
        with session_factory(engine)() as s:
            records = make_records(6)
            run_id = _store(s, records[:3])
            monkeypatch.setattr(bulk, "_any_in_range", lambda *a: False)
            insert_requests(s, run_id, records)
            s.commit()
            assert count_requests(s, run_id) == 6
            assert_records_equal(load_records(s, run_id), records)
    finally:
        engine.dispose()
