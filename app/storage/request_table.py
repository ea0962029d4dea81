"""Read-only SQL for a run's requests table sorted and filtered on the server, its
neighbours for a request page's previous/next links, and the per-request columns the live
run panel summarises. Summary columns only: no event blob is read."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal

import numpy as np
import numpy.typing as npt
from sqlalchemy import ColumnElement, and_, case, func, or_, select
from sqlalchemy.orm import Session

from app.domain import RequestStatus
from app.storage.browse import SUMMARY_COLUMNS
from app.storage.models import Request

SortKey = Literal["idx", "status", "sent", "ttft", "tpot", "e2e", "output_tokens"]
SORT_COLUMNS: dict[str, str] = {
    "idx": "idx",
    "status": "status",
    "sent": "sent_ns",
    "ttft": "ttft_ns",
    "tpot": "tpot_ns",
    "e2e": "e2e_ns",
    "output_tokens": "output_tokens",
}
# numeric filters: name -> (column, scale from the user's unit to the column's)
RANGE_COLUMNS: dict[str, tuple[str, float]] = {
    "ttft": ("ttft_ns", 1e6),  # ms
    "tpot": ("tpot_ns", 1e6),  # ms
    "e2e": ("e2e_ns", 1e6),  # ms
    "output_tokens": ("output_tokens", 1.0),
}
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
        if self.sort not in SORT_COLUMNS:
            raise ValueError(f"sort must be one of {', '.join(SORT_COLUMNS)}")
        if self.status is not None and self.status != FAILED:
            RequestStatus(self.status)  # ValueError for an unknown status
        for name, _, _ in self.ranges:
            if name not in RANGE_COLUMNS:
                raise ValueError(f"no range filter on {name!r}")


def _where(run_id: str, q: TableQuery) -> list[ColumnElement[bool]]:
    t = Request.__table__
    out: list[ColumnElement[bool]] = [t.c.run_id == run_id]
    if q.status == FAILED:
        out.append(
            t.c.status.in_((RequestStatus.ERROR.value, RequestStatus.TIMEOUT.value))
        )
    elif q.status is not None:
        out.append(t.c.status == q.status)
    for name, lo, hi in q.ranges:
        col, scale = RANGE_COLUMNS[name]
        if lo is not None:
            out.append(t.c[col] >= lo * scale)
        if hi is not None:
            out.append(t.c[col] <= hi * scale)
    return out


def _order(q: TableQuery) -> list[Any]:
    """The sort column (missing values last either way), then the index as tie-break."""
    t = Request.__table__
    col = t.c[SORT_COLUMNS[q.sort]]
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
    col = t.c[SORT_COLUMNS[q.sort]]
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
    col = t.c[SORT_COLUMNS[q.sort]]
    return [col.is_(None).desc(), col.asc() if q.desc else col.desc(), t.c.idx.desc()]


def neighbours(session: Session, run_id: str, idx: int, q: TableQuery) -> Neighbours:
    """The requests before and after ``idx`` in ``q``'s order: keyset reads from the row's
    own sort value (each one pass over the run's summary rows, no full sort)."""
    t = Request.__table__
    where = _where(run_id, q)
    total = count_rows(session, run_id, q)
    key = t.c[SORT_COLUMNS[q.sort]]
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
    ttft_ns: F64
    tpot_ns: F64
    e2e_ns: F64
    output_tokens: I64
    cancelled: npt.NDArray[np.bool_] | None = None  # cut by the client (None: none were)


def live_columns(session: Session, run_id: str) -> LiveColumns:
    """One read of eight numeric columns (missing values as -1 in SQL, so the rows convert
    to one float array at C speed: a poll of a 100k-request run stays well under a second).
    The status column reads 1 for ok, 2 for cancelled, 0 for a failure."""
    t = Request.__table__
    code = case(
        (t.c.status == RequestStatus.OK.value, 1),
        (t.c.status == RequestStatus.CANCELLED.value, 2),
        else_=0,
    )
    cols = [func.coalesce(t.c[c], -1) for c in ("sent_ns", "end_ns", "ttft_ns", "tpot_ns")]
    cols += [func.coalesce(t.c[c], -1) for c in ("e2e_ns", "output_tokens")]
    stmt = select(code, *cols).where(t.c.run_id == run_id, t.c.warmup.is_(False))
    rows = [tuple(r) for r in session.execute(stmt)]  # numpy reads tuples, not Rows, fast
    arr = np.array(rows, np.float64).reshape(len(rows), 7)  # ns < 2**53: exact

    def ints(j: int) -> I64:
        out: I64 = arr[:, j].astype(np.int64)
        return out

    def floats(j: int) -> F64:
        col: F64 = arr[:, j].copy()
        col[col < 0] = np.nan  # durations are never negative: -1 is "missing"
        return col

    return LiveColumns(
        arr[:, 0] == 1, ints(1), ints(2), floats(3), floats(4), floats(5), ints(6), arr[:, 0] == 2
    )
