"""SQL of named series, their members, sweeps and alerts (``models_series``). Callers own
the session and its commit."""

from __future__ import annotations

import datetime as dt
import secrets
from dataclasses import dataclass
from typing import Any

from sqlalchemy import delete, func, null, select, update
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session

from app.storage.jsonsafe import json_safe
from app.storage.models import Run, utcnow
from app.storage.models_compare import SweepStep
from app.storage.models_series import (
    Series,
    SeriesAlert,
    SeriesAlertEvent,
    SeriesMember,
    SeriesSweep,
)


def new_series_id() -> str:
    return "se" + secrets.token_hex(6)


# ----------------------------------------------------------------------------- series


def create_series(
    session: Session, name: str, *, vary: list[str], on_mismatch: str, note: str | None = None
) -> Series:
    row = Series(
        id=new_series_id(),
        name=name,
        created_at=utcnow(),
        vary=list(vary),
        on_mismatch=on_mismatch,
        note=note,
    )
    session.add(row)
    session.flush()
    return row


def find_series(session: Session, name: str) -> Series | None:
    return session.scalars(select(Series).where(Series.name == name)).first()


def get_series(session: Session, series_id: str) -> Series | None:
    return session.get(Series, series_id)


@dataclass(frozen=True, slots=True)
class SeriesCounts:
    series: Series
    states: dict[str, int]  # member state -> runs
    last_run_at: dt.datetime | None
    alerts: int
    failed_deliveries: int


def list_series(session: Session, *, limit: int = 500) -> list[SeriesCounts]:
    """Every series (by name) with its member counts by state, its newest run's time, its
    alert rules and failed deliveries."""
    rows = list(session.scalars(select(Series).order_by(Series.name).limit(limit)))
    ids = [r.id for r in rows]
    if not ids:
        return []
    m = SeriesMember.__table__
    states: dict[str, dict[str, int]] = {i: {} for i in ids}
    last: dict[str, dt.datetime] = {}
    for sid, state, n, newest in session.execute(
        select(m.c.series_id, m.c.state, func.count(), func.max(m.c.run_created_at))
        .where(m.c.series_id.in_(ids))
        .group_by(m.c.series_id, m.c.state)
    ):
        states[sid][state] = int(n)
        if newest is not None:  # max() keeps the column's type: an aware datetime
            last[sid] = max(last.get(sid, newest), newest)
    a = SeriesAlert.__table__
    alerts: dict[str, int] = {
        str(sid): int(n)
        for sid, n in session.execute(
            select(a.c.series_id, func.count())
            .where(a.c.series_id.in_(ids))
            .group_by(a.c.series_id)
        )
    }
    e = SeriesAlertEvent.__table__
    failed: dict[str, int] = {
        str(sid): int(n)
        for sid, n in session.execute(
            select(e.c.series_id, func.count())
            .where(e.c.series_id.in_(ids), e.c.state == "failed")
            .group_by(e.c.series_id)
        )
    }
    return [
        SeriesCounts(r, states[r.id], last.get(r.id), int(alerts.get(r.id, 0)),
                     int(failed.get(r.id, 0)))
        for r in rows
    ]  # fmt: skip


def set_key(session: Session, series_id: str, key: dict[str, Any], run_id: str) -> None:
    session.execute(
        update(Series).where(Series.id == series_id).values(key=json_safe(key), key_run_id=run_id)
    )


def set_baseline(session: Session, series_id: str, run_id: str | None) -> None:
    session.execute(update(Series).where(Series.id == series_id).values(baseline_run_id=run_id))


def delete_series(session: Session, series_id: str) -> None:
    session.execute(delete(Series).where(Series.id == series_id))


# ---------------------------------------------------------------------------- members


def add_member(
    session: Session,
    series_id: str,
    run_id: str,
    *,
    run_created_at: dt.datetime,
    sweep_id: str | None = None,
    track: str = "",
) -> SeriesMember:
    """A pending member (the run settles when it finishes). IntegrityError when the run
    is in a series already."""
    row = SeriesMember(
        series_id=series_id,
        run_id=run_id,
        sweep_id=sweep_id,
        track=track,
        state="pending",
        run_created_at=run_created_at,
        added_at=utcnow(),
        trusted=False,
        trust_issues=[],
        evaluated=False,
    )
    session.add(row)
    session.flush()
    return row


def member_of_run(session: Session, run_id: str) -> SeriesMember | None:
    return session.scalars(select(SeriesMember).where(SeriesMember.run_id == run_id)).first()


def settle_member(
    session: Session,
    member_id: int,
    *,
    state: str,
    reason: str | None,
    key: dict[str, Any] | None,
    point: dict[str, Any] | None,
    trusted: bool,
    issues: list[str],
) -> None:
    session.execute(
        update(SeriesMember)
        .where(SeriesMember.id == member_id)
        .values(
            state=state,
            reason=reason,
            key=json_safe(key) if key is not None else None,
            point=json_safe(point) if point is not None else None,
            trusted=trusted,
            trust_issues=list(issues),
            settled_at=utcnow(),
            evaluated=False,
        )
    )


def remove_member(session: Session, run_id: str) -> bool:
    res = session.execute(delete(SeriesMember).where(SeriesMember.run_id == run_id))
    return bool(getattr(res, "rowcount", 0))


@dataclass(frozen=True, slots=True)
class MemberRow:
    id: int
    run_id: str
    run_name: str | None
    run_status: str
    sweep_id: str | None
    track: str
    state: str
    reason: str | None
    key: dict[str, Any] | None
    point: dict[str, Any] | None
    trusted: bool
    trust_issues: list[str]
    run_created_at: dt.datetime
    added_at: dt.datetime
    evaluated: bool
    settled_at: dt.datetime | None = None


_MEMBER_COLUMNS = (
    SeriesMember.id,
    SeriesMember.run_id,
    Run.name,
    Run.status,
    SeriesMember.sweep_id,
    SeriesMember.track,
    SeriesMember.state,
    SeriesMember.reason,
    SeriesMember.key,
    SeriesMember.point,
    SeriesMember.trusted,
    SeriesMember.trust_issues,
    SeriesMember.run_created_at,
    SeriesMember.added_at,
    SeriesMember.evaluated,
    SeriesMember.settled_at,
)


def members(
    session: Session,
    series_id: str,
    *,
    limit: int | None = None,
    cell: tuple[str, str] | None = None,
) -> list[MemberRow]:
    """The series' members in series order (their runs' creation, then id); ``limit``:
    the newest that many, still oldest first. ``cell`` (metric, statistic): read only that
    cell of each point (``{metric: {statistic: cell}}``) and no key: the JSON of a whole
    point and key is most of a big series' read (``keys_of`` reads the keys needed)."""
    cols: list[Any] = list(_MEMBER_COLUMNS)
    if cell is not None:
        cols[_MEMBER_COLUMNS.index(SeriesMember.key)] = null()
        cols[_MEMBER_COLUMNS.index(SeriesMember.point)] = SeriesMember.point[cell[0]][cell[1]]
    stmt = (
        select(*cols)
        .join(Run, Run.id == SeriesMember.run_id)
        .where(SeriesMember.series_id == series_id)
    )
    if limit is not None:
        stmt = stmt.order_by(SeriesMember.run_created_at.desc(), SeriesMember.run_id.desc())
        rows = list(session.execute(stmt.limit(limit)))[::-1]
    else:
        stmt = stmt.order_by(SeriesMember.run_created_at, SeriesMember.run_id)
        rows = list(session.execute(stmt))
    out = []
    for r in rows:
        point = r[9] if cell is None else {cell[0]: {cell[1]: r[9]}}
        m = MemberRow(
            int(r[0]), r[1], r[2], str(r[3]), r[4], r[5] or "", r[6], r[7], r[8], point,
            bool(r[10]), list(r[11] or []), r[12], r[13], bool(r[14]), r[15],
        )  # fmt: skip
        out.append(m)
    return out


def keys_of(session: Session, run_ids: list[str]) -> dict[str, dict[str, Any] | None]:
    """The stored comparability keys of these members' runs."""
    if not run_ids:
        return {}
    stmt = select(SeriesMember.run_id, SeriesMember.key).where(SeriesMember.run_id.in_(run_ids))
    return {str(r[0]): r[1] for r in session.execute(stmt)}


def pending_runs(session: Session, *, limit: int = 200) -> list[str]:
    """Runs of pending members whose run has finished (settled by the next pass)."""
    stmt = (
        select(SeriesMember.run_id)
        .join(Run, Run.id == SeriesMember.run_id)
        .where(SeriesMember.state == "pending", Run.status.notin_(("queued", "running")))
        .limit(limit)
    )
    return list(session.scalars(stmt))


def unevaluated_series(session: Session) -> list[str]:
    stmt = (
        select(SeriesMember.series_id)
        .where(SeriesMember.evaluated.is_(False), SeriesMember.state != "pending")
        .distinct()
    )
    return list(session.scalars(stmt))


def mark_evaluated(session: Session, series_id: str, member_ids: list[int]) -> None:
    if member_ids:
        session.execute(
            update(SeriesMember)
            .where(SeriesMember.series_id == series_id, SeriesMember.id.in_(member_ids))
            .values(evaluated=True)
        )


# ----------------------------------------------------------------------------- sweeps


def add_sweep(session: Session, series_id: str, sweep_id: str) -> None:
    session.add(SeriesSweep(series_id=series_id, sweep_id=sweep_id, added_at=utcnow()))
    session.flush()


def series_of_sweep(session: Session, sweep_id: str) -> str | None:
    return session.scalars(
        select(SeriesSweep.series_id).where(SeriesSweep.sweep_id == sweep_id)
    ).first()


def step_of_run(session: Session, run_id: str) -> tuple[str, float, str, str] | None:
    """(sweep id, load, load kind, role) of a sweep step's run, else None."""
    row = session.execute(
        select(SweepStep.sweep_id, SweepStep.load, SweepStep.load_kind, SweepStep.role).where(
            SweepStep.run_id == run_id
        )
    ).first()
    return None if row is None else (row[0], float(row[1]), row[2], row[3])


def sweep_step_runs(session: Session, sweep_id: str) -> list[str]:
    return list(
        session.scalars(
            select(SweepStep.run_id)
            .where(SweepStep.sweep_id == sweep_id, SweepStep.role == "step")
            .order_by(SweepStep.step_idx)
        )
    )


# ----------------------------------------------------------------------------- alerts


def add_alert(session: Session, **values: Any) -> SeriesAlert:
    row = SeriesAlert(created_at=utcnow(), **values)
    session.add(row)
    session.flush()
    return row


def alerts(session: Session, series_id: str) -> list[SeriesAlert]:
    return list(
        session.scalars(
            select(SeriesAlert).where(SeriesAlert.series_id == series_id).order_by(SeriesAlert.id)
        )
    )


def get_alert(session: Session, alert_id: int) -> SeriesAlert | None:
    return session.get(SeriesAlert, alert_id)


def delete_alert(session: Session, series_id: str, alert_id: int) -> bool:
    res = session.execute(
        delete(SeriesAlert).where(SeriesAlert.id == alert_id, SeriesAlert.series_id == series_id)
    )
    return bool(getattr(res, "rowcount", 0))


def add_event(session: Session, **values: Any) -> bool:
    """Raise one alert (idempotent: a (alert, dedupe) raised before is not raised again)."""
    try:
        with session.begin_nested():
            session.add(SeriesAlertEvent(created_at=utcnow(), **values))
    except IntegrityError:
        return False
    return True


def events(session: Session, series_id: str, *, limit: int = 50) -> list[SeriesAlertEvent]:
    return list(
        session.scalars(
            select(SeriesAlertEvent)
            .where(SeriesAlertEvent.series_id == series_id)
            .order_by(SeriesAlertEvent.id.desc())
            .limit(limit)
        )
    )


def due_events(session: Session, now: dt.datetime, *, limit: int = 20) -> list[SeriesAlertEvent]:
    return list(
        session.scalars(
            select(SeriesAlertEvent)
            .where(
                SeriesAlertEvent.state == "pending",
                (SeriesAlertEvent.next_attempt_at.is_(None))
                | (SeriesAlertEvent.next_attempt_at <= now),
            )
            .order_by(SeriesAlertEvent.id)
            .limit(limit)
        )
    )


def update_event(session: Session, event_id: int, **values: Any) -> None:
    t = SeriesAlertEvent
    session.execute(update(t).where(t.id == event_id).values(**values))
