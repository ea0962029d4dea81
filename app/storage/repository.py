"""Runs and their requests: create, finish, list, filter, load traces and records (the other
tables have their own modules in ``app.storage``). Functions take a ``Session``; the caller
owns the transaction.

Nothing here commits: wrap calls in ``session_scope`` (or commit yourself). Missing runs
raise ``NotFoundError``; bad arguments raise ``ValueError``/``TypeError``.
"""

from __future__ import annotations

import datetime as dt
import secrets
from collections.abc import Iterable, Sequence
from typing import Any

import numpy as np
import numpy.typing as npt
from sqlalchemy import Select, Text, cast, delete, exists, func, literal, select
from sqlalchemy.orm import Session

from app.client.spec import RunSpec
from app.domain import (
    PHASES,
    AgentLink,
    ClockSource,
    PerRequestMetrics,
    RequestRecord,
    RequestStatus,
    RunStatus,
    RunTrace,
)
from app.protocol.packing import EventArrays, pack_events, unpack_events, unpack_many
from app.storage import metric_values
from app.storage.bulk import fetch_rows, insert_rows
from app.storage.jsonsafe import json_safe
from app.storage.models import Request, Run, utcnow
from app.storage.models_compare import SweepStep

INSERT_CHUNK = 2000  # requests packed and sent per executemany


class NotFoundError(LookupError):
    """A run (or a request of a run) does not exist."""


def new_run_id() -> str:
    """A short random run id: 12 lowercase hex characters."""
    return secrets.token_hex(6)


def _normalize_tags(tags: Iterable[str]) -> list[str]:
    if isinstance(tags, str):
        raise TypeError("tags must be a list of strings, not one string")
    out: list[str] = []
    for t in tags:
        if not isinstance(t, str):
            raise TypeError(f"tag {t!r} is not a string")
        t = t.strip()
        if not t:
            raise ValueError("tags must not be empty")
        if len(t) > 100:
            raise ValueError(f"tag {t[:20]!r}... is longer than 100 characters")
        if t not in out:
            out.append(t)
    return out


def _aware(value: dt.datetime | None, name: str) -> dt.datetime | None:
    if value is None:
        return None
    if not isinstance(value, dt.datetime):
        raise TypeError(f"{name} must be a datetime, got {type(value).__name__}")
    if value.tzinfo is None or value.utcoffset() is None:
        raise ValueError(f"{name} is a naive datetime: pass a timezone-aware (UTC) datetime")
    return value


# --------------------------------------------------------------------------------- runs


def _first(a: str | None, b: str | None) -> str | None:
    return a if a is not None else b


def create_run(
    session: Session,
    spec: RunSpec | None,
    *,
    source: str = "bench",
    name: str | None = None,
    status: RunStatus = RunStatus.QUEUED,
    tags: Iterable[str] | None = None,
    note: str | None = None,
    client_version: str | None = None,
    client_host: str | None = None,
    clock_source: ClockSource | None = None,
    summary_only: bool = False,
    model: str | None = None,
    target_url: str | None = None,
    endpoint: str | None = None,
    run_id: str | None = None,
    created_at: dt.datetime | None = None,
) -> str:
    """Insert a run row and return its id (12 hex characters unless ``run_id`` is given).

    ``spec`` is stored as ``spec.model_dump(mode="json")`` (``api_key`` is excluded by the
    model); ``model``, ``target_url`` and ``endpoint`` default to the spec's. ``spec=None``
    is for imported logs that have no spec. ``tags`` defaults to ``spec.tags``.
    ``client_version`` / ``client_host`` are stored as given (None: unknown).
    """
    if spec is not None and not isinstance(spec, RunSpec):
        raise TypeError(f"spec must be a RunSpec or None, got {type(spec).__name__}")
    if not isinstance(source, str) or not source.strip():
        raise ValueError("source must be a non-empty string such as 'bench' or 'import:csv'")
    if run_id is not None and not (0 < len(run_id) <= 32):
        raise ValueError("run_id must have 1 to 32 characters")
    rid = run_id or new_run_id()
    default_tags: list[str] = list(spec.tags) if spec is not None else []
    run = Run(
        id=rid,
        created_at=_aware(created_at, "created_at") or utcnow(),
        status=RunStatus(status),
        source=source,
        name=name,
        spec=json_safe(spec.model_dump(mode="json")) if spec is not None else None,
        target_url=_first(target_url, spec.base_url if spec is not None else None),
        model=_first(model, spec.model if spec is not None else None),
        endpoint=_first(endpoint, spec.endpoint if spec is not None else None),
        client_version=client_version,
        client_host=client_host,
        clock_source=ClockSource(clock_source) if clock_source is not None else None,
        client_limited=False,
        lost_requests=0,
        validity=[],
        summary_only=summary_only,
        tags=_normalize_tags(default_tags if tags is None else tags),
        note=note,
    )
    session.add(run)
    session.flush()
    return rid


def find_run(session: Session, run_id: str) -> Run | None:
    """The run row, or None when there is none."""
    return session.get(Run, run_id)


def get_run(session: Session, run_id: str) -> Run:
    """The run row; raises ``NotFoundError`` when there is none."""
    run = session.get(Run, run_id)
    if run is None:
        raise NotFoundError(f"no run with id {run_id!r}")
    return run


def run_spec(run: Run) -> RunSpec | None:
    """The stored spec of ``run`` as a ``RunSpec`` (None for runs without one)."""
    return None if run.spec is None else RunSpec.model_validate(run.spec)


_UPDATABLE = frozenset(
    {
        "status",
        "name",
        "started_at",
        "finished_at",
        "start_mono_ns",
        "client_limited",
        "lost_requests",
        "validity",
        "load_stats",
        "summary",
        "summary_only",
        "clock_source",
        "client_version",
        "client_host",
        "note",
    }
)
_JSON_FIELDS = frozenset({"validity", "load_stats", "summary"})


def update_run(session: Session, run_id: str, **changes: Any) -> Run:
    """Set some of the mutable run columns (``status``, ``started_at``, ``summary``, ...)."""
    unknown = set(changes) - _UPDATABLE
    if unknown:
        raise ValueError(
            f"cannot update run field(s) {sorted(unknown)}; allowed: {sorted(_UPDATABLE)}"
        )
    run = get_run(session, run_id)
    for key, value in changes.items():
        if key == "status":
            value = RunStatus(value)
        elif key == "clock_source" and value is not None:
            value = ClockSource(value)
        elif key == "validity":
            value = [str(v) for v in (value or [])]
        elif key in _JSON_FIELDS and value is not None:
            value = json_safe(value)
        elif key in ("started_at", "finished_at"):
            value = _aware(value, key)
        elif key in ("start_mono_ns", "lost_requests") and value is not None:
            value = int(value)
        setattr(run, key, value)
    session.flush()
    return run


def start_run(session: Session, run_id: str, *, started_at: dt.datetime | None = None) -> Run:
    """Mark a run as running (``started_at`` defaults to now)."""
    return update_run(session, run_id, status=RunStatus.RUNNING, started_at=started_at or utcnow())


def finish_run(
    session: Session,
    run_id: str,
    *,
    status: RunStatus | None = None,
    started_at: dt.datetime | None = None,
    finished_at: dt.datetime | None = None,
    start_mono_ns: int | None = None,
    client_limited: bool | None = None,
    validity: Sequence[str] | None = None,
    load_stats: dict[str, Any] | None = None,
    summary: dict[str, Any] | None = None,
    clock_source: ClockSource | None = None,
    lost_requests: int | None = None,
) -> Run:
    """Record the outcome of a run; arguments left as ``None`` keep their stored value.

    ``finished_at`` defaults to now when ``status`` is given and the run has no
    ``finished_at`` yet, so ``finish_run(s, id, summary=...)`` only caches a summary.
    """
    changes: dict[str, Any] = {
        "status": status,
        "started_at": started_at,
        "finished_at": finished_at,
        "start_mono_ns": start_mono_ns,
        "client_limited": client_limited,
        "validity": validity,
        "load_stats": load_stats,
        "summary": summary,
        "clock_source": clock_source,
        "lost_requests": lost_requests,
    }
    changes = {k: v for k, v in changes.items() if v is not None}
    if status is not None and finished_at is None and get_run(session, run_id).finished_at is None:
        changes["finished_at"] = utcnow()
    return update_run(session, run_id, **changes)


def set_tags(session: Session, run_id: str, tags: Iterable[str]) -> list[str]:
    """Replace a run's tags (trimmed, de-duplicated, order kept); returns them."""
    run = get_run(session, run_id)
    run.tags = _normalize_tags(tags)
    session.flush()
    return list(run.tags)


def set_note(session: Session, run_id: str, note: str | None) -> None:
    """Replace a run's free-text note (``None`` clears it)."""
    run = get_run(session, run_id)
    run.note = note
    session.flush()


def delete_run(session: Session, run_id: str) -> bool:
    """Delete a run and (by cascade) its requests. Returns False when it did not exist."""
    run = session.get(Run, run_id)
    if run is None:
        return False
    session.delete(run)
    session.flush()
    return True


def _filtered(
    session: Session,
    stmt: Select[Any],
    *,
    model: str | None,
    status: RunStatus | str | None,
    tag: str | None,
    source: str | None,
    target: str | None = None,
    since: dt.datetime | None = None,
    until: dt.datetime | None = None,
    sweep_steps: bool = True,
) -> Select[Any]:
    if model is not None:
        stmt = stmt.where(Run.model == model)
    if target is not None:
        stmt = stmt.where(Run.target_url == target.rstrip("/"))
    if since is not None:
        stmt = stmt.where(Run.created_at >= _aware(since, "since"))
    if until is not None:
        stmt = stmt.where(Run.created_at < _aware(until, "until"))
    if status is not None:
        stmt = stmt.where(Run.status == RunStatus(status))
    if source is not None:
        stmt = stmt.where(Run.source == source)
    if tag is not None:
        stmt = stmt.where(_has_tag(session, tag))
    if not sweep_steps:
        stmt = stmt.where(~exists(select(SweepStep.id).where(SweepStep.run_id == Run.id)))
    return stmt


def _has_tag(session: Session, tag: str) -> Any:
    """Runs whose tags hold ``tag``. PostgreSQL matches the stored JSON text (``"tag"``,
    written by ``jsonsafe.dumps``, can only match a whole element): a cast to ``jsonb``
    fails on any row whose tags hold ``\\u0000`` (stored before NUL was refused), and
    every tag filter was then a 500."""
    import json

    if session.get_bind().dialect.name == "sqlite":
        each = func.json_each(Run.tags).table_valued("value")
        return exists(select(literal(1)).select_from(each).where(each.c.value == tag))
    return cast(Run.tags, Text).contains(json.dumps(tag), autoescape=True)


def list_runs(
    session: Session,
    *,
    limit: int = 50,
    offset: int = 0,
    model: str | None = None,
    status: RunStatus | str | None = None,
    tag: str | None = None,
    source: str | None = None,
    target: str | None = None,
    since: dt.datetime | None = None,
    until: dt.datetime | None = None,
    sweep_steps: bool = True,
) -> list[Run]:
    """Runs, newest first, optionally filtered by model, status, tag, source, target URL and
    creation time (``since`` inclusive, ``until`` exclusive); ``sweep_steps=False`` leaves
    out the runs that are steps of a sweep."""
    if limit < 0 or offset < 0:
        raise ValueError("limit and offset must be >= 0")
    stmt = _filtered(
        session,
        select(Run),
        model=model,
        status=status,
        tag=tag,
        source=source,
        target=target,
        since=since,
        until=until,
        sweep_steps=sweep_steps,
    )
    stmt = stmt.order_by(Run.created_at.desc(), Run.id.desc()).limit(limit).offset(offset)
    return list(session.scalars(stmt))


def count_runs(
    session: Session,
    *,
    model: str | None = None,
    status: RunStatus | str | None = None,
    tag: str | None = None,
    source: str | None = None,
    target: str | None = None,
    since: dt.datetime | None = None,
    until: dt.datetime | None = None,
    sweep_steps: bool = True,
) -> int:
    """How many runs ``list_runs`` would page through with these filters."""
    stmt = _filtered(
        session,
        select(func.count()).select_from(Run),
        model=model,
        status=status,
        tag=tag,
        source=source,
        target=target,
        since=since,
        until=until,
        sweep_steps=sweep_steps,
    )
    return int(session.scalar(stmt) or 0)


def sweep_step_counts(
    session: Session,
    *,
    model: str | None = None,
    status: RunStatus | str | None = None,
    tag: str | None = None,
    source: str | None = None,
    target: str | None = None,
    since: dt.datetime | None = None,
    until: dt.datetime | None = None,
    limit: int = 10,
) -> list[tuple[str, int]]:
    """(sweep id, how many of its step runs match these filters), the sweeps with the
    newest matching step first: what the runs list folds under each sweep."""
    base: Select[Any] = (
        select(SweepStep.sweep_id, func.count(), func.max(Run.created_at))  # type: ignore[assignment]
        .select_from(Run)
        .join(SweepStep, SweepStep.run_id == Run.id)
    )
    stmt = _filtered(
        session,
        base,
        model=model,
        status=status,
        tag=tag,
        source=source,
        target=target,
        since=since,
        until=until,
    )
    stmt = stmt.group_by(SweepStep.sweep_id).order_by(func.max(Run.created_at).desc())
    return [(str(r[0]), int(r[1])) for r in session.execute(stmt.limit(limit))]


def run_sources(session: Session) -> list[str]:
    """The distinct ``source`` values of the stored runs (bench, import-csv, ...)."""
    return sorted(str(v) for v in session.scalars(select(Run.source).distinct()) if v)


# ----------------------------------------------------------------------------- requests


def _opt_int(v: object) -> int | None:
    return None if v is None else int(v)  # type: ignore[call-overload]


def _metric_column(name: str, arr: npt.ArrayLike, n: int, *, as_int: bool) -> list[Any]:
    a = np.asarray(arr, dtype=np.float64)
    if a.shape != (n,):
        raise ValueError(
            f"metrics.{name} has shape {a.shape}, expected ({n},): metrics must be aligned "
            "with the records passed (one value per record, warm-ups included)"
        )
    bad = ~np.isfinite(a)
    if as_int:
        values: list[Any] = np.where(bad, 0.0, np.rint(a)).astype(np.int64).tolist()
    else:
        values = np.where(bad, 0.0, a).tolist()
    if bad.any():
        for i in np.flatnonzero(bad).tolist():
            values[i] = None
    return values


def _request_rows(
    run_id: str, records: Sequence[RequestRecord], metrics: PerRequestMetrics | None
) -> list[dict[str, Any]]:
    n = len(records)
    if metrics is not None:
        ttft = _metric_column("ttft_ns", metrics.ttft_ns, n, as_int=True)
        ttfot = _metric_column("ttfot_ns", metrics.ttfot_ns, n, as_int=True)
        e2e = _metric_column("e2e_ns", metrics.e2e_ns, n, as_int=True)
        tpot = _metric_column("tpot_ns", metrics.tpot_ns, n, as_int=False)
        extra = metric_values.json_rows(metrics.extra, n)
    else:
        ttft = ttfot = e2e = tpot = [None] * n
        extra = [None] * n
    rows: list[dict[str, Any]] = []
    for i, r in enumerate(records):
        blob = pack_events(r.event_t_ns, r.event_bytes, r.event_kind, r.event_tokens)
        rows.append(
            {
                "run_id": run_id,
                "idx": int(r.index),
                "warmup": bool(r.warmup),
                "scheduled_ns": int(r.scheduled_ns),
                "sent_ns": _opt_int(r.sent_ns),
                "end_ns": _opt_int(r.end_ns),
                "done_ns": _opt_int(r.done_ns),
                "status": RequestStatus(r.status).value,
                "error": r.error,
                "http_status": _opt_int(r.http_status),
                "input_tokens": _opt_int(r.input_tokens),
                "output_tokens": _opt_int(r.output_tokens),
                "tokenizer_output_tokens": _opt_int(r.tokenizer_output_tokens),
                "usage_prompt_tokens": _opt_int(r.usage_prompt_tokens),
                "usage_completion_tokens": _opt_int(r.usage_completion_tokens),
                "cached_prompt_tokens": _opt_int(r.cached_prompt_tokens),
                "token_source": r.token_source,
                "ttft_ns": ttft[i],
                "ttfot_ns": ttfot[i],
                "e2e_ns": e2e[i],
                "tpot_ns": tpot[i],
                "metric_values": _with_agent(extra[i], r),
                "n_events": int(r.event_t_ns.shape[0]),
                "events": blob,
                **{f"{p}_ns": _opt_int(getattr(r, f"{p}_ns")) for p in PHASES},
                "conn_id": _opt_int(r.conn_id),
                "conn_reused": None if r.conn_reused is None else bool(r.conn_reused),
                "retries": int(r.retries),
                "session_idx": _opt_int(r.session),
                "turn_idx": _opt_int(r.turn),
                "process_idx": _opt_int(r.process),
                "shard_idx": _opt_int(r.shard),
                "model": r.model,
                "target": r.target,
            }
        )
    return rows


def _with_agent(values: dict[str, float] | None, r: RequestRecord) -> dict[str, Any] | None:
    """A request's ``metric_values``, with an agent trace's link (``AgentLink.to_values``):
    its parents, depth and delay, beside the metrics' values (no migration)."""
    if r.agent is None:
        return values
    return (values or {}) | r.agent.to_values()


def insert_requests(
    session: Session,
    run_id: str,
    records: Sequence[RequestRecord],
    metrics: PerRequestMetrics | None = None,
    *,
    replace: bool = False,
) -> int:
    """Store request records (events packed) for a run; returns how many were submitted.

    Idempotent on ``(run_id, idx)``: an existing row is skipped (``replace=False``, the
    default, for retried uploads) or overwritten (``replace=True``). ``metrics``, when given,
    must be aligned with ``records`` (one entry per record, in order); NaN/inf become NULL.
    """
    if session.scalar(select(Run.id).where(Run.id == run_id)) is None:
        raise NotFoundError(f"no run with id {run_id!r}")
    for i, r in enumerate(records):
        if not isinstance(r, RequestRecord):
            raise TypeError(f"records[{i}] is a {type(r).__name__}, not a RequestRecord")
    indexes = [int(r.index) for r in records]
    if len(set(indexes)) != len(indexes):
        raise ValueError("records contain duplicate request indexes")
    if any(i < 0 for i in indexes):
        raise ValueError("request indexes must be >= 0")
    if metrics is not None:
        _check_metrics_length(metrics, len(records))
    conn = session.connection()
    for lo in range(0, len(records), INSERT_CHUNK):
        chunk = records[lo : lo + INSERT_CHUNK]
        sub = None
        if metrics is not None:
            sub = PerRequestMetrics(
                ttft_ns=np.asarray(metrics.ttft_ns)[lo : lo + INSERT_CHUNK],
                ttfot_ns=np.asarray(metrics.ttfot_ns)[lo : lo + INSERT_CHUNK],
                e2e_ns=np.asarray(metrics.e2e_ns)[lo : lo + INSERT_CHUNK],
                tpot_ns=np.asarray(metrics.tpot_ns)[lo : lo + INSERT_CHUNK],
                n_tokens=np.asarray(metrics.n_tokens)[lo : lo + INSERT_CHUNK],
                extra={k: np.asarray(v)[lo : lo + INSERT_CHUNK] for k, v in metrics.extra.items()},
            )
        insert_rows(conn, run_id, _request_rows(run_id, chunk, sub), replace=replace)
    return len(records)


def _check_metrics_length(metrics: PerRequestMetrics, n: int) -> None:
    arrays: dict[str, Any] = {
        name: getattr(metrics, name) for name in ("ttft_ns", "ttfot_ns", "e2e_ns", "tpot_ns")
    }
    arrays |= {f"extra[{k!r}]": v for k, v in metrics.extra.items()}
    for name, arr in arrays.items():
        got = np.asarray(arr).shape
        if got != (n,):
            raise ValueError(
                f"metrics.{name} has shape {got}, expected ({n},): metrics must be aligned "
                "with the records passed (one value per record, warm-ups included)"
            )


def _run_flags(session: Session, run_id: str) -> tuple[ClockSource | None, bool]:
    row = session.execute(
        select(Run.clock_source, Run.summary_only).where(Run.id == run_id)
    ).one_or_none()
    if row is None:
        raise NotFoundError(f"no run with id {run_id!r}")
    return row[0], bool(row[1])


def _col(values: Sequence[int | None]) -> npt.NDArray[np.int64]:
    return np.array([-1 if v is None else v for v in values], np.int64)


def load_trace(session: Session, run_id: str, *, include_warmup: bool = False) -> RunTrace:
    """The run's requests as a columnar ``RunTrace`` (ordered by index; warm-ups dropped).

    Equal to ``trace_from_records(load_records(...))`` but built from one query and one
    bulk decode of the packed event logs.
    """
    clock, summary_only = _run_flags(session, run_id)
    t = Request.__table__
    cols = [t.c[n] for n in ("sent_ns", "end_ns", "status", "error")]
    cols += [t.c[n] for n in ("input_tokens", "output_tokens", "events", "conn_id")]
    cols += [t.c[f"{p}_ns"] for p in PHASES]
    where = t.c.run_id == run_id
    if not include_warmup:
        where = where & t.c.warmup.is_(False)
    rows = fetch_rows(session.connection(), cols, where, t.c.idx)
    columns: list[list[Any]] = [list(c) for c in zip(*rows, strict=True)] if rows else []
    if not columns:
        columns = [[] for _ in cols]
    sent, end, status, errors, inp, out, blobs, conn_ids = columns[:8]
    phase_cols = columns[8:]
    del rows, columns
    phases: dict[str, np.ndarray] | None = None
    if any(c is not None for c in conn_ids) or any(v is not None for v in phase_cols[0]):
        phases = {p: _col(v) for p, v in zip(PHASES, phase_cols, strict=True)}
    offsets, ev = unpack_many(blobs, with_nbytes=False)
    del blobs
    statuses = [RequestStatus(s) for s in status]
    return RunTrace(
        sent_ns=_col(sent),
        end_ns=_col(end),
        ok=np.array([s is RequestStatus.OK for s in statuses], np.bool_),
        status=statuses,
        errors=errors,
        input_tokens=_col(inp),
        output_tokens=_col(out),
        ev_offsets=offsets,
        ev_t_ns=ev.t_ns,
        ev_kind=ev.kind,
        ev_tokens=ev.tokens,
        summary_only=summary_only,
        clock_source=clock if clock is not None else ClockSource.USERSPACE,
        phases=phases,
    )


_RECORD_COLUMNS = (
    "idx",
    "scheduled_ns",
    "sent_ns",
    "end_ns",
    "done_ns",
    "status",
    "error",
    "http_status",
    "input_tokens",
    "output_tokens",
    "tokenizer_output_tokens",
    "usage_prompt_tokens",
    "usage_completion_tokens",
    "cached_prompt_tokens",
    "token_source",
    "warmup",
    "events",
    *(f"{p}_ns" for p in PHASES),
    "conn_id",
    "conn_reused",
    "retries",
    "session_idx",
    "turn_idx",
    "process_idx",
    "shard_idx",
    "model",
    "target",
    "metric_values",
)


def _record_from_row(row: tuple[Any, ...]) -> RequestRecord:
    v = dict(zip(_RECORD_COLUMNS, row, strict=True))
    t_ns, nbytes, kind, tokens = unpack_events(v["events"])
    return RequestRecord(
        index=v["idx"],
        scheduled_ns=v["scheduled_ns"],
        sent_ns=v["sent_ns"],
        end_ns=v["end_ns"],
        status=RequestStatus(v["status"]),
        error=v["error"],
        http_status=v["http_status"],
        input_tokens=v["input_tokens"],
        output_tokens=v["output_tokens"],
        tokenizer_output_tokens=v["tokenizer_output_tokens"],
        usage_prompt_tokens=v["usage_prompt_tokens"],
        usage_completion_tokens=v["usage_completion_tokens"],
        cached_prompt_tokens=v["cached_prompt_tokens"],
        token_source=v["token_source"],
        done_ns=v["done_ns"],
        warmup=bool(v["warmup"]),
        **{f"{p}_ns": v[f"{p}_ns"] for p in PHASES},
        conn_id=v["conn_id"],
        conn_reused=None if v["conn_reused"] is None else bool(v["conn_reused"]),
        retries=int(v["retries"] or 0),
        session=v["session_idx"],
        turn=v["turn_idx"],
        process=v["process_idx"],
        shard=v["shard_idx"],
        model=v["model"],
        target=v["target"],
        agent=AgentLink.from_values(v["metric_values"]),
        event_t_ns=t_ns,
        event_bytes=nbytes,
        event_kind=kind,
        event_tokens=tokens,
    )


def load_records(
    session: Session, run_id: str, *, include_warmup: bool = True
) -> list[RequestRecord]:
    """The run's requests as ``RequestRecord``s ordered by index (warm-ups included)."""
    _run_flags(session, run_id)
    t = Request.__table__
    where = t.c.run_id == run_id
    if not include_warmup:
        where = where & t.c.warmup.is_(False)
    rows = fetch_rows(session.connection(), [t.c[n] for n in _RECORD_COLUMNS], where, t.c.idx)
    return [_record_from_row(row) for row in rows]


def request_event_page(
    session: Session, run_id: str, *, after_idx: int, limit: int
) -> list[tuple[int, int | None, bytes]]:
    """``(idx, sent_ns, packed events)`` of up to ``limit`` requests with index above
    ``after_idx``, in index order (keyset paging: each page is one indexed range scan)."""
    t = Request.__table__
    stmt = (
        select(t.c.idx, t.c.sent_ns, t.c.events)
        .where(t.c.run_id == run_id, t.c.idx > after_idx)
        .order_by(t.c.idx)
        .limit(limit)
    )
    return [(int(r[0]), r[1], bytes(r[2])) for r in session.execute(stmt)]


def count_requests(session: Session, run_id: str, *, include_warmup: bool = True) -> int:
    """Number of stored requests of a run."""
    stmt = select(func.count()).select_from(Request).where(Request.run_id == run_id)
    if not include_warmup:
        stmt = stmt.where(Request.warmup.is_(False))
    return int(session.scalar(stmt) or 0)


def get_request_events(session: Session, run_id: str, idx: int) -> EventArrays:
    """The decoded event log of one request; ``NotFoundError`` when it does not exist."""
    blob = session.scalar(
        select(Request.events).where(Request.run_id == run_id, Request.idx == idx)
    )
    if blob is None:
        raise NotFoundError(f"run {run_id!r} has no request with index {idx}")
    t_ns, nbytes, kind, tokens = unpack_events(blob)
    return EventArrays(t_ns=t_ns, nbytes=nbytes, kind=kind, tokens=tokens)


def delete_requests(session: Session, run_id: str) -> int:
    """Delete all requests of a run (keeps the run); returns how many were deleted."""
    res = session.execute(delete(Request).where(Request.run_id == run_id))
    return int(getattr(res, "rowcount", 0) or 0)


__all__ = [
    "INSERT_CHUNK",
    "NotFoundError",
    "count_requests",
    "count_runs",
    "create_run",
    "delete_requests",
    "delete_run",
    "find_run",
    "finish_run",
    "get_request_events",
    "get_run",
    "insert_requests",
    "list_runs",
    "load_records",
    "load_trace",
    "new_run_id",
    "run_spec",
    "set_note",
    "set_tags",
    "start_run",
    "update_run",
]
