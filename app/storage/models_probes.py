"""Tables of GPU probes (migration 0003): probe results and their artifacts, device
telemetry sampled during jobs, and run annotations (the model and device a serving run
used, for its roofline operating points)."""

from __future__ import annotations

import datetime as dt
from typing import Any

from sqlalchemy import (
    JSON,
    ForeignKey,
    Index,
    Integer,
    LargeBinary,
    String,
    UniqueConstraint,
)
from sqlalchemy.orm import Mapped, mapped_column

from app.storage.models import Base, RowId, UTCDateTime, utcnow
from app.storage.target_text import TargetText

__all__ = ["JobTelemetry", "Probe", "ProbeArtifact", "RunAnnotation"]


class Probe(Base):
    """One probe: ``queued -> running -> succeeded | failed`` (a probe whose job ended
    without a result takes its job's terminal state when read)."""

    __tablename__ = "probes"

    id: Mapped[str] = mapped_column(String(32), primary_key=True)
    kind: Mapped[str] = mapped_column(String(16))
    device: Mapped[str] = mapped_column(String(8))  # "cuda" | "cpu": what was asked for
    name: Mapped[str | None] = mapped_column(String(255))
    job_id: Mapped[str | None] = mapped_column(
        String(32), ForeignKey("jobs.id", ondelete="SET NULL"), nullable=True
    )
    status: Mapped[str] = mapped_column(String(16), default="queued")
    params: Mapped[dict[str, Any]] = mapped_column(JSON)
    fingerprint: Mapped[dict[str, Any] | None] = mapped_column(JSON)
    result: Mapped[dict[str, Any] | None] = mapped_column(JSON)
    telemetry: Mapped[list[dict[str, Any]] | None] = mapped_column(JSON)
    error: Mapped[str | None] = mapped_column(TargetText())  # the worker's and target's words
    created_at: Mapped[dt.datetime] = mapped_column(UTCDateTime(), default=utcnow)
    finished_at: Mapped[dt.datetime | None] = mapped_column(UTCDateTime())

    __table_args__ = (
        Index("ix_probes_created_at", "created_at"),
        Index("ix_probes_kind", "kind"),
    )


class ProbeArtifact(Base):
    """A file a probe produced (e.g. a gzipped Chrome trace), stored as a capped blob."""

    __tablename__ = "probe_artifacts"

    id: Mapped[int] = mapped_column(RowId, primary_key=True, autoincrement=True)
    probe_id: Mapped[str] = mapped_column(
        String(32), ForeignKey("probes.id", ondelete="CASCADE"), nullable=False
    )
    name: Mapped[str] = mapped_column(String(255))
    content_type: Mapped[str] = mapped_column(String(64))
    size: Mapped[int] = mapped_column(Integer)
    data: Mapped[bytes] = mapped_column(LargeBinary)
    created_at: Mapped[dt.datetime] = mapped_column(UTCDateTime(), default=utcnow)

    __table_args__ = (
        UniqueConstraint("probe_id", "name", name="uq_probe_artifacts_probe_id_name"),
    )


class JobTelemetry(Base):
    """Device samples (about 1 Hz) a worker took during a job; one row per upload."""

    __tablename__ = "job_telemetry"

    id: Mapped[int] = mapped_column(RowId, primary_key=True, autoincrement=True)
    job_id: Mapped[str] = mapped_column(
        String(32), ForeignKey("jobs.id", ondelete="CASCADE"), nullable=False
    )
    seq: Mapped[int] = mapped_column(Integer)
    samples: Mapped[list[dict[str, Any]]] = mapped_column(JSON)
    created_at: Mapped[dt.datetime] = mapped_column(UTCDateTime(), default=utcnow)

    __table_args__ = (UniqueConstraint("job_id", "seq", name="uq_job_telemetry_job_id_seq"),)


class RunAnnotation(Base):
    """The model and device a serving run used: what its roofline operating points need."""

    __tablename__ = "run_annotations"

    run_id: Mapped[str] = mapped_column(
        String(32), ForeignKey("runs.id", ondelete="CASCADE"), primary_key=True
    )
    model: Mapped[dict[str, Any]] = mapped_column(JSON)  # a ModelConfig
    device: Mapped[str | None] = mapped_column(String(64))  # a device preset name
    dtypes: Mapped[dict[str, Any]] = mapped_column(JSON)  # weight, act, kv, compute
    updated_at: Mapped[dt.datetime] = mapped_column(UTCDateTime(), default=utcnow)
