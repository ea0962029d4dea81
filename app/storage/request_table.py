"""Read-only SQL for a run's requests table sorted and filtered on the server, its
neighbours for a request page's previous/next links, and the per-request columns the live
run panel summarises. Summary columns only: no event blob is read. The metric columns are
the registry's (``Metric.column`` of the metrics shown in the table and the live panel)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
import numpy.typing as npt
from sqlalchemy import ColumnElement, and_, case, func, or_, select
from sqlalchemy.orm import Session

from app.analysis.metric_defs import shown
from app.domain import RequestStatus
from app.storage.browse import SUMMARY_COLUMNS
from app.storage.models import Request


def sort_columns() -> dict[str, str]:
    """Sort name -> column: the index, status, send time, each table metric's column
    ("ttft" -> ``ttft_ns``) and the output tokens."""
    metrics = {m.column_name: m.column for m in shown("table") if m.column is not None}
    return {"idx": "idx", "status": "status", "sent": "sent_ns", **metrics} | {
        "output_tokens": "output_tokens"
    }


def range_columns() -> dict[str, tuple[str, float]]:
    """Numeric filters: name -> (column, scale from the user's unit to the column's): each
    table metric in its unit (ms), and the output tokens."""
    metrics = {
        m.column_name: (m.column, m.per_unit) for m in shown("table") if m.column is not None
    }
    return metrics | {"output_tokens": ("output_tokens", 1.0)}


FAILED = "failed"  # what the target did wrong: error or timeout (cancelled is the client's)


@dataclass(frozen=True, slots=True)
class TableQuery:
    """How the table is ordered and which requests it keeps. ``ranges``: name of
    ``RANGE_COLUMNS`` -> (low, high) in the user's unit, inclusive, either None."""

    sort: str = "idx"
    desc: bool = False
    status: str | None = None  # a RequestStatus value, or "failed"
    ranges: tuple[tuple[str, float | None, float | None], ...] = ()

    def __post_init__(self) -> None:
        if self.sort not in sort_columns():
            raise ValueError(f"sort must be one of {', '.join(sort_columns())}")
        if self.status is not None and self.status != FAILED:
            RequestStatus(self.status)  # ValueError for an unknown status
        ranges = range_columns()
        for name, _, _ in self.ranges:
            if name not in ranges:
                raise ValueError(f"no range filter on {name!r}")


def _where(run_id: str, q: TableQuery) -> list[ColumnElement[bool]]:
    t = Request.__table__
    out: list[ColumnElement[bool]] = [t.c.run_id == run_id]
    if q.status == FAILED:
        out.append(t.c.status.in_((RequestStatus.ERROR.value, RequestStatus.TIMEOUT.value)))
    elif q.status is not None:
        out.append(t.c.status == q.status)
    ranges = range_columns()
    for name, lo, hi in q.ranges:
        col, scale = ranges[name]
        if lo is not None:
            out.append(t.c[col] >= lo * scale)
        if hi is not None:
            out.append(t.c[col] <= hi * scale)
    return out


def _order(q: TableQuery) -> list[Any]:
    """The sort column (missing values last either way), then the index as tie-break."""
    t = Request.__table__
    col = t.c[sort_columns()[q.sort]]
    key = col.desc() if q.desc else col.asc()
    out: list[Any] = []
    if q.sort != "idx":
        out += [col.is_(None).asc(), key]
    out.append(t.c.idx.desc() if q.desc and q.sort == "idx" else t.c.idx.asc())
    return out


def count_rows(session: Session, run_id: str, q: TableQuery) -> int:
    t = Request.__table__
    stmt = select(func.count()).select_from(t).where(*_where(run_id, q))
    return int(session.scalar(stmt) or 0)


def table_rows(
    session: Session, run_id: str, q: TableQuery, *, limit: int, offset: int
) -> list[dict[str, Any]]:
    """One dict per request (``browse.SUMMARY_COLUMNS``) in ``q``'s order and filter."""
    t = Request.__table__
    stmt = (
        select(*(t.c[c] for c in SUMMARY_COLUMNS))
        .where(*_where(run_id, q))
        .order_by(*_order(q))
        .limit(limit)
        .offset(offset)
    )
    return [dict(r._mapping) for r in session.execute(stmt)]


@dataclass(frozen=True, slots=True)
class Neighbours:
    position: int | None  # 0-based place of the request in the table; None: filtered out
    total: int
    prev_idx: int | None
    next_idx: int | None


def _before_after(q: TableQuery, value: Any, idx: int) -> tuple[Any, Any]:
    """Conditions for the rows before and after the row (``value``, ``idx``) in ``q``'s
    order (``_order``: missing values last, ties by index)."""
    t = Request.__table__
    i = t.c.idx
    if q.sort == "idx":
        return (i > idx, i < idx) if q.desc else (i < idx, i > idx)
    col = t.c[sort_columns()[q.sort]]
    if value is None:  # among the missing values, last: by index
        return or_(col.is_not(None), and_(col.is_(None), i < idx)), and_(col.is_(None), i > idx)
    lower, higher = (col > value, col < value) if q.desc else (col < value, col > value)
    before = and_(col.is_not(None), or_(lower, and_(col == value, i < idx)))
    after = or_(col.is_(None), higher, and_(col == value, i > idx))
    return before, after


def _reversed(q: TableQuery) -> list[Any]:
    t = Request.__table__
    if q.sort == "idx":
        return [t.c.idx.asc() if q.desc else t.c.idx.desc()]
    col = t.c[sort_columns()[q.sort]]
    return [col.is_(None).desc(), col.asc() if q.desc else col.desc(), t.c.idx.desc()]


def neighbours(session: Session, run_id: str, idx: int, q: TableQuery) -> Neighbours:
    """The requests before and after ``idx`` in ``q``'s order: keyset reads from the row's
    own sort value (each one pass over the run's summary rows, no full sort)."""
    t = Request.__table__
    where = _where(run_id, q)
    total = count_rows(session, run_id, q)
    key = t.c[sort_columns()[q.sort]]
    here = session.execute(select(key).where(*where, t.c.idx == idx)).first()
    if here is None:
        return Neighbours(None, total, None, None)
    before, after = _before_after(q, here[0], idx)
    pos = int(session.scalar(select(func.count()).select_from(t).where(*where, before)) or 0)
    prev = session.scalar(select(t.c.idx).where(*where, before).order_by(*_reversed(q)).limit(1))
    nxt = session.scalar(select(t.c.idx).where(*where, after).order_by(*_order(q)).limit(1))
    return Neighbours(pos, total, prev, nxt)


# ------------------------------------------------------------------------ live figures

I64 = npt.NDArray[np.int64]
F64 = npt.NDArray[np.float64]


@dataclass(frozen=True, slots=True)
class LiveColumns:
    """Per-request columns of a run's measured (non-warm-up) requests stored so far; NaN
    (float) or -1 (int) where a value is missing."""

    ok: npt.NDArray[np.bool_]
    sent_ns: I64
    end_ns: I64
    values: dict[str, F64]  # each live metric's column by its name ("ttft": ``ttft_ns``)
    output_tokens: I64
    cancelled: npt.NDArray[np.bool_] | None = None  # cut by the client (None: none were)


def live_columns(session: Session, run_id: str) -> LiveColumns:
    """One read of the numeric columns (status, sent, end, each live metric's column, the
    output tokens; missing values as -1 in SQL, so the rows convert to one float array at
    C speed: a poll of a 100k-request run stays well under a second). The status column
    reads 1 for ok, 2 for cancelled, 0 for a failure."""
    t = Request.__table__
    code = case(
        (t.c.status == RequestStatus.OK.value, 1),
        (t.c.status == RequestStatus.CANCELLED.value, 2),
        else_=0,
    )
    live = {m.column_name: m.column for m in shown("live") if m.column is not None}
    names = ["sent_ns", "end_ns", *live.values(), "output_tokens"]
    cols = [func.coalesce(t.c[c], -1) for c in names]
    stmt = select(code, *cols).where(t.c.run_id == run_id, t.c.warmup.is_(False))
    rows = [tuple(r) for r in session.execute(stmt)]  # numpy reads tuples, not Rows, fast
    arr = np.array(rows, np.float64).reshape(len(rows), 1 + len(names))  # ns < 2**53: exact

    def ints(j: int) -> I64:
        out: I64 = arr[:, j].astype(np.int64)
        return out

    def floats(j: int) -> F64:
        col: F64 = arr[:, j].copy()
        col[col < 0] = np.nan  # durations are never negative: -1 is "missing"
        return col

    return LiveColumns(
        ok=arr[:, 0] == 1,
        sent_ns=ints(1),
        end_ns=ints(2),
        values={name: floats(3 + j) for j, name in enumerate(live)},
        output_tokens=ints(len(names)),
        cancelled=arr[:, 0] == 2,
    )
