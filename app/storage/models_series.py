"""Tables for named series of runs and their alerts (migration 0016).

``series``: a named series, its comparability key (set by its first run), the key fields
it lets vary (e.g. the engine version), what it does with a run whose key differs
(``flag`` or ``refuse``) and its baseline run. ``series_members``: one row per run that
named the series (a run is in at most one series), with its state (``pending`` until the
run finishes, then ``member``, ``flagged`` or ``refused``), the reason, its key, its
compact point (metric values and intervals: a series page reads no run summary) and
whether it can be trusted. ``series_sweeps``: sweeps whose step runs join the series as
they finish. ``series_alerts``: alert rules (a metric's thresholds and/or its change
points, to a webhook kept sealed); ``series_alert_events``: each alert raised and its
delivery (attempts, next try, last error). ``job_live_series``: a running job's /metrics
history for the run page's live panels.
"""

from __future__ import annotations

import datetime as dt
from typing import Any

from sqlalchemy import (
    JSON,
    Boolean,
    Float,
    ForeignKey,
    Index,
    Integer,
    String,
    Text,
    UniqueConstraint,
)
from sqlalchemy.orm import Mapped, mapped_column

from app.storage.models import Base, RowId, UTCDateTime, utcnow


class Series(Base):
    __tablename__ = "series"

    id: Mapped[str] = mapped_column(String(32), primary_key=True)
    name: Mapped[str] = mapped_column(String(100), unique=True)
    created_at: Mapped[dt.datetime] = mapped_column(UTCDateTime(), default=utcnow)
    key: Mapped[dict[str, Any] | None] = mapped_column(JSON)
    key_run_id: Mapped[str | None] = mapped_column(String(32))
    vary: Mapped[list[str]] = mapped_column(JSON, default=list)
    on_mismatch: Mapped[str] = mapped_column(String(16), default="flag")
    baseline_run_id: Mapped[str | None] = mapped_column(
        String(32), ForeignKey("runs.id", ondelete="SET NULL"), nullable=True
    )
    note: Mapped[str | None] = mapped_column(Text)


class SeriesMember(Base):
    __tablename__ = "series_members"

    id: Mapped[int] = mapped_column(RowId, primary_key=True, autoincrement=True)
    series_id: Mapped[str] = mapped_column(
        String(32), ForeignKey("series.id", ondelete="CASCADE"), nullable=False
    )
    run_id: Mapped[str] = mapped_column(
        String(32), ForeignKey("runs.id", ondelete="CASCADE"), nullable=False
    )
    sweep_id: Mapped[str | None] = mapped_column(String(32))
    track: Mapped[str] = mapped_column(String(64), default="")
    state: Mapped[str] = mapped_column(String(16), default="pending")
    reason: Mapped[str | None] = mapped_column(Text)
    key: Mapped[dict[str, Any] | None] = mapped_column(JSON)
    point: Mapped[dict[str, Any] | None] = mapped_column(JSON)
    trusted: Mapped[bool] = mapped_column(Boolean, default=False)
    trust_issues: Mapped[list[str]] = mapped_column(JSON, default=list)
    run_created_at: Mapped[dt.datetime] = mapped_column(UTCDateTime(), default=utcnow)
    added_at: Mapped[dt.datetime] = mapped_column(UTCDateTime(), default=utcnow)
    settled_at: Mapped[dt.datetime | None] = mapped_column(UTCDateTime())
    evaluated: Mapped[bool] = mapped_column(Boolean, default=False)

    __table_args__ = (
        UniqueConstraint("run_id", name="uq_series_members_run_id"),
        Index("ix_series_members_series_id_run_created_at", "series_id", "run_created_at"),
    )


class SeriesSweep(Base):
    __tablename__ = "series_sweeps"

    id: Mapped[int] = mapped_column(RowId, primary_key=True, autoincrement=True)
    series_id: Mapped[str] = mapped_column(
        String(32), ForeignKey("series.id", ondelete="CASCADE"), nullable=False
    )
    sweep_id: Mapped[str] = mapped_column(
        String(32), ForeignKey("sweeps.id", ondelete="CASCADE"), nullable=False
    )
    added_at: Mapped[dt.datetime] = mapped_column(UTCDateTime(), default=utcnow)

    __table_args__ = (UniqueConstraint("sweep_id", name="uq_series_sweeps_sweep_id"),)


class SeriesAlert(Base):
    __tablename__ = "series_alerts"

    id: Mapped[int] = mapped_column(RowId, primary_key=True, autoincrement=True)
    series_id: Mapped[str] = mapped_column(
        String(32), ForeignKey("series.id", ondelete="CASCADE"), nullable=False
    )
    metric: Mapped[str] = mapped_column(String(64))
    stat: Mapped[str] = mapped_column(String(16))
    webhook_sealed: Mapped[str] = mapped_column(Text)
    webhook_shown: Mapped[str] = mapped_column(String(300))
    max_value: Mapped[float | None] = mapped_column(Float)  # absolute threshold ("worse than")
    max_relative: Mapped[float | None] = mapped_column(Float)  # vs the baseline, a fraction
    change_points: Mapped[bool] = mapped_column(Boolean, default=True)
    created_at: Mapped[dt.datetime] = mapped_column(UTCDateTime(), default=utcnow)

    __table_args__ = (Index("ix_series_alerts_series_id", "series_id"),)


class SeriesAlertEvent(Base):
    __tablename__ = "series_alert_events"

    id: Mapped[int] = mapped_column(RowId, primary_key=True, autoincrement=True)
    alert_id: Mapped[int] = mapped_column(
        RowId, ForeignKey("series_alerts.id", ondelete="CASCADE"), nullable=False
    )
    series_id: Mapped[str] = mapped_column(
        String(32), ForeignKey("series.id", ondelete="CASCADE"), nullable=False
    )
    run_id: Mapped[str | None] = mapped_column(String(32))
    kind: Mapped[str] = mapped_column(String(16))  # threshold | change_point
    dedupe: Mapped[str] = mapped_column(String(128))
    text: Mapped[str] = mapped_column(Text)
    payload: Mapped[dict[str, Any]] = mapped_column(JSON)
    state: Mapped[str] = mapped_column(String(16), default="pending")
    attempts: Mapped[int] = mapped_column(Integer, default=0)
    next_attempt_at: Mapped[dt.datetime | None] = mapped_column(UTCDateTime())
    last_error: Mapped[str | None] = mapped_column(Text)
    created_at: Mapped[dt.datetime] = mapped_column(UTCDateTime(), default=utcnow)
    delivered_at: Mapped[dt.datetime | None] = mapped_column(UTCDateTime())

    __table_args__ = (
        UniqueConstraint("alert_id", "dedupe", name="uq_series_alert_events_alert_id_dedupe"),
        Index("ix_series_alert_events_state_next_attempt_at", "state", "next_attempt_at"),
        Index("ix_series_alert_events_series_id", "series_id"),
    )


class JobLiveSeries(Base):
    """The target's /metrics of a running job as its heartbeats carried them (a bounded
    history, ``app.services.live_series``): what the run page's live panels draw."""

    __tablename__ = "job_live_series"

    job_id: Mapped[str] = mapped_column(
        String(32), ForeignKey("jobs.id", ondelete="CASCADE"), primary_key=True
    )
    updated_at: Mapped[dt.datetime] = mapped_column(UTCDateTime(), default=utcnow)
    payload: Mapped[dict[str, Any]] = mapped_column(JSON)
