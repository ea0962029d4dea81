"""Tables of imports and server metrics (migration 0005).

``run_imports``: one row per run created from another tool's file: the file's own headline
figures (keyed like the definition profiles), its window and facts, and the group (one file
= one group: a GuideLLM sweep, a multi-object vLLM file). ``server_metric_samples``: the
target's Prometheus series scraped during a run, one row per sample, times on the run's
monotonic axis (ns, like request times).
"""

from __future__ import annotations

import datetime as dt
from typing import Any

from sqlalchemy import JSON, BigInteger, Float, ForeignKey, Index, Integer, String
from sqlalchemy.orm import Mapped, mapped_column

from app.storage.models import Base, RowId, UTCDateTime, utcnow
from app.storage.target_text import TargetText


class RunImport(Base):
    __tablename__ = "run_imports"

    run_id: Mapped[str] = mapped_column(
        String(32), ForeignKey("runs.id", ondelete="CASCADE"), primary_key=True
    )
    format: Mapped[str] = mapped_column(String(32))
    tool: Mapped[str] = mapped_column(String(64))
    profile: Mapped[str | None] = mapped_column(String(32))
    file_name: Mapped[str | None] = mapped_column(String(255))
    group_id: Mapped[str] = mapped_column(String(32))
    group_index: Mapped[int] = mapped_column(Integer, default=0)
    figures: Mapped[dict[str, Any]] = mapped_column(JSON, default=dict)
    window_s: Mapped[float | None] = mapped_column(Float)
    meta: Mapped[dict[str, Any]] = mapped_column(JSON, default=dict)
    created_at: Mapped[dt.datetime] = mapped_column(UTCDateTime(), default=utcnow)

    __table_args__ = (Index("ix_run_imports_group_id", "group_id"),)


class ServerMetricSample(Base):
    __tablename__ = "server_metric_samples"

    id: Mapped[int] = mapped_column(RowId, primary_key=True, autoincrement=True)
    run_id: Mapped[str] = mapped_column(
        String(32), ForeignKey("runs.id", ondelete="CASCADE"), nullable=False
    )
    name: Mapped[str] = mapped_column(String(200))
    # canonical: k="v",k2="v2" sorted (``label_text``); the target's words: NUL kept
    labels: Mapped[str] = mapped_column(TargetText(), default="")
    kind: Mapped[str | None] = mapped_column(String(16))
    t_ns: Mapped[int] = mapped_column(BigInteger)
    value: Mapped[float] = mapped_column(Float)

    __table_args__ = (Index("ix_server_metric_samples_run_id_name", "run_id", "name"),)
