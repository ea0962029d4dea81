"""Tables: ``runs`` (one benchmark or import) and ``requests`` (one row per request).

Nanosecond times are BigInteger everywhere. The per-token event log of a request is one
packed blob (see ``app.protocol.packing``); summary latencies sit in plain columns so SQL can
filter on them. The same DDL works on SQLite and PostgreSQL (migrations/versions/0001).
"""

from __future__ import annotations

import datetime as dt
import enum
from typing import Any, Generic, TypeVar

from sqlalchemy import (
    JSON,
    BigInteger,
    Boolean,
    DateTime,
    Float,
    ForeignKey,
    Index,
    Integer,
    LargeBinary,
    MetaData,
    String,
    Text,
    UniqueConstraint,
)
from sqlalchemy.engine import Dialect
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column, relationship
from sqlalchemy.types import TypeDecorator

from app.domain import ClockSource, RequestStatus, RunStatus
from app.storage.target_text import TargetText

NAMING_CONVENTION = {
    "ix": "ix_%(table_name)s_%(column_0_N_name)s",
    "uq": "uq_%(table_name)s_%(column_0_N_name)s",
    "ck": "ck_%(table_name)s_%(constraint_name)s",
    "fk": "fk_%(table_name)s_%(column_0_name)s_%(referred_table_name)s",
    "pk": "pk_%(table_name)s",
}

E = TypeVar("E", bound=enum.StrEnum)


class UTCDateTime(TypeDecorator[dt.datetime]):
    """Timezone-aware UTC datetimes on every backend (SQLite stores them naive, in UTC)."""

    impl = DateTime(timezone=True)
    cache_ok = True

    def process_bind_param(self, value: dt.datetime | None, dialect: Dialect) -> dt.datetime | None:
        if value is None:
            return None
        if not isinstance(value, dt.datetime):
            raise TypeError(f"expected a datetime, got {type(value).__name__}")
        if value.tzinfo is None:
            raise ValueError("naive datetime: pass a timezone-aware (UTC) datetime")
        value = value.astimezone(dt.UTC)
        return value.replace(tzinfo=None) if dialect.name == "sqlite" else value

    def process_result_value(
        self, value: dt.datetime | None, dialect: Dialect
    ) -> dt.datetime | None:
        if value is None:
            return None
        if value.tzinfo is None:
            return value.replace(tzinfo=dt.UTC)
        return value.astimezone(dt.UTC)


class EnumText(TypeDecorator[E], Generic[E]):
    """A ``StrEnum`` stored as its value in a short VARCHAR (no native enum, no CHECK)."""

    impl = String(16)
    cache_ok = True

    def __init__(self, enum_cls: type[E]) -> None:
        super().__init__()
        self.enum_cls = enum_cls

    def process_bind_param(self, value: E | str | None, dialect: Dialect) -> str | None:
        if value is None:
            return None
        try:
            return str(self.enum_cls(value).value)
        except ValueError:
            allowed = ", ".join(m.value for m in self.enum_cls)
            raise ValueError(
                f"{value!r} is not a valid {self.enum_cls.__name__} (allowed: {allowed})"
            ) from None

    def process_result_value(self, value: str | None, dialect: Dialect) -> E | None:
        return None if value is None else self.enum_cls(value)


def utcnow() -> dt.datetime:
    return dt.datetime.now(dt.UTC)


# BIGINT identity on PostgreSQL; INTEGER PRIMARY KEY (the rowid) on SQLite.
RowId = BigInteger().with_variant(Integer(), "sqlite")
# Token counts: BIGINT on PostgreSQL (migration 0009); SQLite's INTEGER is 64-bit already.
TokenCount = BigInteger().with_variant(Integer(), "sqlite")


class Base(DeclarativeBase):
    metadata = MetaData(naming_convention=NAMING_CONVENTION)


class Run(Base):
    __tablename__ = "runs"

    id: Mapped[str] = mapped_column(String(32), primary_key=True)
    created_at: Mapped[dt.datetime] = mapped_column(UTCDateTime(), default=utcnow)
    started_at: Mapped[dt.datetime | None] = mapped_column(UTCDateTime())
    finished_at: Mapped[dt.datetime | None] = mapped_column(UTCDateTime())
    status: Mapped[RunStatus] = mapped_column(EnumText(RunStatus), default=RunStatus.QUEUED)
    source: Mapped[str] = mapped_column(String(64))
    name: Mapped[str | None] = mapped_column(String(255))
    spec: Mapped[dict[str, Any] | None] = mapped_column(JSON)
    target_url: Mapped[str | None] = mapped_column(Text)
    model: Mapped[str | None] = mapped_column(String(255))
    endpoint: Mapped[str | None] = mapped_column(String(32))
    client_version: Mapped[str | None] = mapped_column(String(64))
    client_host: Mapped[str | None] = mapped_column(String(255))
    clock_source: Mapped[ClockSource | None] = mapped_column(EnumText(ClockSource))
    start_mono_ns: Mapped[int | None] = mapped_column(BigInteger)
    client_limited: Mapped[bool] = mapped_column(Boolean, default=False)
    # requests sent to the target (or recorded by the worker) whose records were never
    # stored (migration 0014): a run that lost any is never shown as valid
    lost_requests: Mapped[int] = mapped_column(Integer, default=0, server_default="0")
    validity: Mapped[list[str]] = mapped_column(JSON, default=list)
    load_stats: Mapped[dict[str, Any] | None] = mapped_column(JSON)
    summary: Mapped[dict[str, Any] | None] = mapped_column(JSON)
    summary_only: Mapped[bool] = mapped_column(Boolean, default=False)
    tags: Mapped[list[str]] = mapped_column(JSON, default=list)
    note: Mapped[str | None] = mapped_column(Text)

    requests: Mapped[list[Request]] = relationship(
        back_populates="run",
        cascade="all, delete-orphan",
        passive_deletes=True,
        order_by="Request.idx",
    )

    __table_args__ = (
        Index("ix_runs_created_at", "created_at"),
        Index("ix_runs_model", "model"),
    )

    def __repr__(self) -> str:
        return f"Run(id={self.id!r}, status={self.status!r}, model={self.model!r})"


class Request(Base):
    __tablename__ = "requests"

    id: Mapped[int] = mapped_column(RowId, primary_key=True, autoincrement=True)
    run_id: Mapped[str] = mapped_column(
        String(32), ForeignKey("runs.id", ondelete="CASCADE"), nullable=False
    )
    idx: Mapped[int] = mapped_column(Integer)
    warmup: Mapped[bool] = mapped_column(Boolean, default=False)
    scheduled_ns: Mapped[int] = mapped_column(BigInteger)
    sent_ns: Mapped[int | None] = mapped_column(BigInteger)
    end_ns: Mapped[int | None] = mapped_column(BigInteger)
    done_ns: Mapped[int | None] = mapped_column(BigInteger)
    status: Mapped[RequestStatus] = mapped_column(EnumText(RequestStatus))
    error: Mapped[str | None] = mapped_column(TargetText())  # the target's words
    http_status: Mapped[int | None] = mapped_column(Integer)
    input_tokens: Mapped[int | None] = mapped_column(TokenCount)
    output_tokens: Mapped[int | None] = mapped_column(TokenCount)
    tokenizer_output_tokens: Mapped[int | None] = mapped_column(TokenCount)
    usage_prompt_tokens: Mapped[int | None] = mapped_column(TokenCount)
    usage_completion_tokens: Mapped[int | None] = mapped_column(TokenCount)
    # prompt tokens the server served from its prefix cache; None: not reported (0013)
    cached_prompt_tokens: Mapped[int | None] = mapped_column(TokenCount)
    token_source: Mapped[str | None] = mapped_column(String(16))
    ttft_ns: Mapped[int | None] = mapped_column(BigInteger)
    ttfot_ns: Mapped[int | None] = mapped_column(BigInteger)
    e2e_ns: Mapped[int | None] = mapped_column(BigInteger)
    tpot_ns: Mapped[float | None] = mapped_column(Float)
    # the registry's other per-request metrics read from the events, by metric key (base
    # unit, ns); None when the request has none (0018): ``app.storage.metric_values``
    metric_values: Mapped[dict[str, float] | None] = mapped_column(JSON)
    n_events: Mapped[int] = mapped_column(TokenCount, default=0)
    events: Mapped[bytes] = mapped_column(LargeBinary)
    # phases (SPEC 1b), durations in ns; None where the phase did not happen (migration 0008)
    queued_ns: Mapped[int | None] = mapped_column(BigInteger)
    connect_ns: Mapped[int | None] = mapped_column(BigInteger)
    tls_ns: Mapped[int | None] = mapped_column(BigInteger)
    sending_ns: Mapped[int | None] = mapped_column(BigInteger)
    waiting_ns: Mapped[int | None] = mapped_column(BigInteger)
    first_token_ns: Mapped[int | None] = mapped_column(BigInteger)
    conn_id: Mapped[int | None] = mapped_column(Integer)  # the run's connection number
    conn_reused: Mapped[bool | None] = mapped_column(Boolean)
    retries: Mapped[int] = mapped_column(Integer, default=0)
    # multi-turn sessions: session from 0, turn from 1; None for single requests (0012)
    session_idx: Mapped[int | None] = mapped_column(Integer)
    turn_idx: Mapped[int | None] = mapped_column(Integer)
    # a run over several load processes: the one that sent it (from 0); None otherwise (0019)
    process_idx: Mapped[int | None] = mapped_column(Integer)
    # a run of several models / targets: the model and base URL it used; None otherwise (0021)
    model: Mapped[str | None] = mapped_column(String(255))
    target: Mapped[str | None] = mapped_column(String(2048))
    # a run dealt over workers: the shard that sent it (from 0); None otherwise (0022)
    shard_idx: Mapped[int | None] = mapped_column(Integer)

    run: Mapped[Run] = relationship(back_populates="requests")

    __table_args__ = (UniqueConstraint("run_id", "idx", name="uq_requests_run_id_idx"),)

    def __repr__(self) -> str:
        return f"Request(run_id={self.run_id!r}, idx={self.idx}, status={self.status!r})"


# ------------------------------------------------ jobs, workers, tokens (migration 0002)


class Job(Base):
    """Work for a worker: ``queued -> leased -> running -> succeeded | failed | cancelled``."""

    __tablename__ = "jobs"

    id: Mapped[str] = mapped_column(String(32), primary_key=True)
    kind: Mapped[str] = mapped_column(String(16))
    state: Mapped[str] = mapped_column(String(16), default="queued")
    spec: Mapped[dict[str, Any]] = mapped_column(JSON)
    requirements: Mapped[dict[str, Any]] = mapped_column(JSON, default=dict)
    run_id: Mapped[str | None] = mapped_column(
        String(32), ForeignKey("runs.id", ondelete="CASCADE"), nullable=True
    )
    attempt: Mapped[int] = mapped_column(Integer, default=0)  # leases handed out so far
    max_attempts: Mapped[int] = mapped_column(Integer, default=3)
    lease_id: Mapped[str | None] = mapped_column(String(32))
    worker_id: Mapped[str | None] = mapped_column(String(32))
    lease_expires_at: Mapped[dt.datetime | None] = mapped_column(UTCDateTime())
    progress: Mapped[dict[str, Any] | None] = mapped_column(JSON)
    cancel_requested: Mapped[bool] = mapped_column(Boolean, default=False)
    error: Mapped[str | None] = mapped_column(TargetText())  # the target's words
    created_at: Mapped[dt.datetime] = mapped_column(UTCDateTime(), default=utcnow)
    started_at: Mapped[dt.datetime | None] = mapped_column(UTCDateTime())
    finished_at: Mapped[dt.datetime | None] = mapped_column(UTCDateTime())
    updated_at: Mapped[dt.datetime] = mapped_column(UTCDateTime(), default=utcnow)
    # a run dealt over workers (0022): this lease's shard, when its worker was ready, and
    # the common start on the server's wall clock (ns), once every shard was ready
    shard_idx: Mapped[int | None] = mapped_column(Integer)
    shard_ready_at: Mapped[dt.datetime | None] = mapped_column(UTCDateTime())
    shard_start_ns: Mapped[int | None] = mapped_column(BigInteger)
    # with warm-ups (0023): when this shard's warm-ups ended, and the common start of the
    # measured phase on the server's wall clock (ns), once every live shard's had
    shard_warm_at: Mapped[dt.datetime | None] = mapped_column(UTCDateTime())
    shard_measure_ns: Mapped[int | None] = mapped_column(BigInteger)

    __table_args__ = (
        Index("ix_jobs_state_created_at", "state", "created_at"),
        Index("ix_jobs_run_id", "run_id"),
    )

    def __repr__(self) -> str:
        return f"Job(id={self.id!r}, kind={self.kind!r}, state={self.state!r})"


class Worker(Base):
    __tablename__ = "workers"

    id: Mapped[str] = mapped_column(String(32), primary_key=True)
    name: Mapped[str | None] = mapped_column(String(255))
    hostname: Mapped[str] = mapped_column(String(255))
    capabilities: Mapped[dict[str, Any]] = mapped_column(JSON)
    labels: Mapped[dict[str, str]] = mapped_column(JSON, default=dict)
    registered_at: Mapped[dt.datetime] = mapped_column(UTCDateTime(), default=utcnow)
    last_seen_at: Mapped[dt.datetime] = mapped_column(UTCDateTime(), default=utcnow)
    current_job_id: Mapped[str | None] = mapped_column(String(32))
    token_id: Mapped[str | None] = mapped_column(String(32))


class ApiToken(Base):
    """An API token: only the SHA-256 of its secret is stored."""

    __tablename__ = "api_tokens"

    id: Mapped[str] = mapped_column(String(32), primary_key=True)
    name: Mapped[str | None] = mapped_column(String(255))
    scopes: Mapped[list[str]] = mapped_column(JSON)
    hash: Mapped[str] = mapped_column(String(64), unique=True)
    prefix: Mapped[str] = mapped_column(String(16))
    created_at: Mapped[dt.datetime] = mapped_column(UTCDateTime(), default=utcnow)
    last_used_at: Mapped[dt.datetime | None] = mapped_column(UTCDateTime())
    revoked_at: Mapped[dt.datetime | None] = mapped_column(UTCDateTime())


class WebSession(Base):
    """A dashboard sign-in (migration 0010): the cookie's secret is stored as its SHA-256."""

    __tablename__ = "web_sessions"

    id: Mapped[str] = mapped_column(String(64), primary_key=True)
    token_id: Mapped[str] = mapped_column(
        String(32), ForeignKey("api_tokens.id", ondelete="CASCADE"), nullable=False
    )
    csrf: Mapped[str] = mapped_column(String(64))
    created_at: Mapped[dt.datetime] = mapped_column(UTCDateTime(), default=utcnow)
    expires_at: Mapped[dt.datetime] = mapped_column(UTCDateTime())
    revoked_at: Mapped[dt.datetime | None] = mapped_column(UTCDateTime())

    __table_args__ = (Index("ix_web_sessions_token_id", "token_id"),)


class JobBatch(Base):
    """One uploaded result batch; the unique (job_id, batch_no) makes uploads idempotent."""

    __tablename__ = "job_batches"

    id: Mapped[int] = mapped_column(RowId, primary_key=True, autoincrement=True)
    job_id: Mapped[str] = mapped_column(
        String(32), ForeignKey("jobs.id", ondelete="CASCADE"), nullable=False
    )
    batch_no: Mapped[int] = mapped_column(Integer)
    attempt: Mapped[int] = mapped_column(Integer)
    n_requests: Mapped[int] = mapped_column(Integer)
    # the request indices the batch carried (migration 0009; None for older batches)
    request_indices: Mapped[list[int] | None] = mapped_column(JSON)
    received_at: Mapped[dt.datetime] = mapped_column(UTCDateTime(), default=utcnow)

    __table_args__ = (
        UniqueConstraint("job_id", "batch_no", name="uq_job_batches_job_id_batch_no"),
    )


class RunPageSummary(Base):
    """What a finished run's page shows, computed once at finalize (migration 0011):
    ``payload`` is zlib-compressed JSON (metrics, profiles, figure JSON), ``columns`` the
    per-request values (numpy ``.npz``); ``version`` names the layout, so a row of another
    version is stale and recomputed."""

    __tablename__ = "run_page_summaries"

    run_id: Mapped[str] = mapped_column(
        String(32), ForeignKey("runs.id", ondelete="CASCADE"), primary_key=True
    )
    version: Mapped[int] = mapped_column(Integer)
    n_requests: Mapped[int] = mapped_column(Integer)
    created_at: Mapped[dt.datetime] = mapped_column(UTCDateTime(), default=utcnow)
    payload: Mapped[bytes] = mapped_column(LargeBinary)
    columns: Mapped[bytes] = mapped_column(LargeBinary)
