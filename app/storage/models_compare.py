"""Tables for sweeps and baselines (migrations 0004, 0007, 0016).

``sweeps``: one sweep (the same workload at several loads); ``sweep_steps`` links each step
to its run (a normal run with all its events), with the job attempt that made that run and,
once the step completed, the summary the worker got (a resumed sweep job replays it).
``baselines``: named references to a run or a sweep; saving under an existing name adds a
version and marks the previous one replaced, so the history is kept. A pinned baseline is
not replaced unless it is unpinned first.
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
from app.storage.target_text import TargetText


class Sweep(Base):
    __tablename__ = "sweeps"

    id: Mapped[str] = mapped_column(String(32), primary_key=True)
    name: Mapped[str | None] = mapped_column(String(255))
    created_at: Mapped[dt.datetime] = mapped_column(UTCDateTime(), default=utcnow)
    finished_at: Mapped[dt.datetime | None] = mapped_column(UTCDateTime())
    status: Mapped[str] = mapped_column(String(16), default="running")
    mode: Mapped[str] = mapped_column(String(16))  # rates | concurrencies | auto
    spec: Mapped[dict[str, Any]] = mapped_column(JSON)  # the base RunSpec (JSON)
    loads: Mapped[list[float]] = mapped_column(JSON, default=list)  # planned loads
    stop_reason: Mapped[str | None] = mapped_column(TargetText())  # may quote the target
    job_id: Mapped[str | None] = mapped_column(String(32))
    tags: Mapped[list[str]] = mapped_column(JSON, default=list, server_default="[]")  # 0016
    note: Mapped[str | None] = mapped_column(Text)  # 0016
    # a find-max sweep's search (slo_search.FindMax.to_dict), else None (0020)
    find_max: Mapped[dict[str, Any] | None] = mapped_column(JSON, nullable=True)
    # a sweep whose steps are each dealt over workers (shards > 1): its plan, requirements
    # and sealed bench spec; the server sequences its steps (``sharded_sweeps``; 0023)
    plan: Mapped[dict[str, Any] | None] = mapped_column(JSON, nullable=True)

    __table_args__ = (Index("ix_sweeps_created_at", "created_at"),)


class SweepStep(Base):
    __tablename__ = "sweep_steps"

    id: Mapped[int] = mapped_column(RowId, primary_key=True, autoincrement=True)
    sweep_id: Mapped[str] = mapped_column(
        String(32), ForeignKey("sweeps.id", ondelete="CASCADE"), nullable=False
    )
    step_idx: Mapped[int] = mapped_column(Integer)
    run_id: Mapped[str] = mapped_column(
        String(32), ForeignKey("runs.id", ondelete="CASCADE"), nullable=False
    )
    load: Mapped[float] = mapped_column(Float)
    load_kind: Mapped[str] = mapped_column(String(16))  # rate | concurrency
    role: Mapped[str] = mapped_column(String(16), default="step")  # step | probe (auto plan)
    # the job attempt that created the step's current run (1 for local sweeps)
    attempt: Mapped[int] = mapped_column(Integer, default=1, server_default="1")
    # ``app.client.sweep_plan.step_dict`` as answered to the worker when the step completed;
    # None: not completed (running, interrupted, or a local sweep's step)
    summary: Mapped[dict[str, Any] | None] = mapped_column(JSON, nullable=True)

    __table_args__ = (
        UniqueConstraint("sweep_id", "step_idx", name="uq_sweep_steps_sweep_id_step_idx"),
        UniqueConstraint("run_id", name="uq_sweep_steps_run_id"),
    )


class Baseline(Base):
    __tablename__ = "baselines"

    id: Mapped[int] = mapped_column(RowId, primary_key=True, autoincrement=True)
    name: Mapped[str] = mapped_column(String(255))
    version: Mapped[int] = mapped_column(Integer)
    run_id: Mapped[str | None] = mapped_column(
        String(32), ForeignKey("runs.id", ondelete="SET NULL"), nullable=True
    )
    sweep_id: Mapped[str | None] = mapped_column(
        String(32), ForeignKey("sweeps.id", ondelete="SET NULL"), nullable=True
    )
    pinned: Mapped[bool] = mapped_column(Boolean, default=False)
    note: Mapped[str | None] = mapped_column(Text)
    created_at: Mapped[dt.datetime] = mapped_column(UTCDateTime(), default=utcnow)
    replaced_at: Mapped[dt.datetime | None] = mapped_column(UTCDateTime())

    __table_args__ = (
        UniqueConstraint("name", "version", name="uq_baselines_name_version"),
        Index("ix_baselines_name", "name"),
    )
