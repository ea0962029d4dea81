"""Read-only SQL for a multi-turn run's per-request columns by turn (``requests.turn_idx``,
migration 0012): summary columns only, no event blob is read."""

from __future__ import annotations

from dataclasses import dataclass
from decimal import Decimal

import numpy as np
import numpy.typing as npt
from sqlalchemy import ColumnElement, case, func, literal_column, select
from sqlalchemy.orm import Session

from app.analysis.metric_defs import shown
from app.domain import RequestStatus
from app.storage.models import Request

F64 = npt.NDArray[np.float64]
I64 = npt.NDArray[np.int64]


@dataclass(frozen=True, slots=True)
class TurnColumns:
    """The measured (non-warm-up) requests that belong to a turn, in index order; NaN where a
    value is missing."""

    turn: I64
    ok: npt.NDArray[np.bool_]
    values: dict[str, F64]  # each turn metric's column (base unit, ns) by metric key
    input_tokens: F64
    cached_prompt_tokens: F64  # as the server reported them (NaN: not reported)
    usage_prompt_tokens: F64

    @property
    def n_requests(self) -> int:
        return int(self.turn.shape[0])


def turn_columns(session: Session, run_id: str) -> TurnColumns:
    """One read of the numeric columns of the run's measured requests with a turn: each
    turn metric's column (``Metric.views`` "turns": TTFT, TPOT), the prompt tokens and the
    server's counts (missing values as -1 in SQL, so the rows convert to one float array at
    C speed)."""
    t = Request.__table__
    ok = case((t.c.status == RequestStatus.OK.value, 1), else_=0)
    metrics = {m.key: m.column for m in shown("turns") if m.column is not None}
    names = (*metrics.values(), "input_tokens", "cached_prompt_tokens", "usage_prompt_tokens")
    cols = [func.coalesce(t.c[c], -1) for c in names]
    stmt = (
        select(t.c.turn_idx, ok, *cols)
        .where(t.c.run_id == run_id, t.c.warmup.is_(False), t.c.turn_idx.is_not(None))
        .order_by(t.c.idx)
    )
    rows = [tuple(r) for r in session.execute(stmt)]
    arr = np.array(rows, np.float64).reshape(len(rows), 2 + len(names))

    def floats(j: int) -> F64:
        col: F64 = arr[:, j].copy()
        col[col < 0] = np.nan  # durations and counts are never negative: -1 is "missing"
        return col

    return TurnColumns(
        turn=arr[:, 0].astype(np.int64),
        ok=arr[:, 1] == 1,
        values={key: floats(2 + j) for j, key in enumerate(metrics)},
        input_tokens=floats(2 + len(metrics)),
        cached_prompt_tokens=floats(3 + len(metrics)),
        usage_prompt_tokens=floats(4 + len(metrics)),
    )


def exact_sum(column: ColumnElement[int]) -> tuple[ColumnElement[int], ColumnElement[int]]:
    """Two aggregates whose ``combine`` is the exact SUM of a 64-bit integer column, on
    SQLite and PostgreSQL alike: SQLite's SUM raises on int64 overflow (a target's
    ``cached_tokens`` of 2^63-1 made every read of the run page a 503, for good). The high
    and low 32 bits are summed apart; neither sum can overflow below 2^31 rows (a run's
    request index is an int32)."""
    high = func.coalesce(func.sum(column.op(">>")(literal_column("32"))), 0)
    low = func.coalesce(func.sum(column.op("&")(literal_column("4294967295"))), 0)
    return high, low


def combine(high: int | Decimal, low: int | Decimal) -> int:
    """The exact sum from ``exact_sum``'s two results (PostgreSQL's are ``Decimal``)."""
    return int(high) * 2**32 + int(low)


def cached_prompt_sums(session: Session, run_id: str) -> tuple[int, int, int]:
    """(requests, cached prompt tokens, their prompt tokens) over the run's successful
    measured requests whose response reported a cached count (migration 0013), single-turn
    runs included: one aggregate query, exact whatever the counts (``exact_sum``). Prompt
    tokens: the server's ``usage_prompt_tokens``, else the count the metrics used."""
    t = Request.__table__
    prompt = func.coalesce(t.c.usage_prompt_tokens, t.c.input_tokens, 0)
    stmt = select(func.count(), *exact_sum(t.c.cached_prompt_tokens), *exact_sum(prompt)).where(
        t.c.run_id == run_id,
        t.c.warmup.is_(False),
        t.c.status == RequestStatus.OK.value,
        t.c.cached_prompt_tokens.is_not(None),
    )
    n, cached_hi, cached_lo, prompt_hi, prompt_lo = session.execute(stmt).one()
    return int(n), combine(cached_hi, cached_lo), combine(prompt_hi, prompt_lo)
