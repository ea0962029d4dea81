"""Typed request and response bodies of the REST API (the worker protocol's: app.protocol.wire)."""

from __future__ import annotations

import datetime as dt
from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from app.analysis.series import NAME_RE as SERIES_NAME
from app.client.spec import RunSpec
from app.domain import RunStatus
from app.protocol.nul import NoNul
from app.protocol.wire import JobKind, JobRequirements, JobState
from app.services.auth import Scope


class RunCreate(NoNul, RunSpec):
    """A run to queue: every ``tokentrace bench`` field, plus a name and job requirements
    (a NUL in any of them is a 422: ``NoNul``)."""

    name: str | None = Field(None, max_length=255)
    requirements: JobRequirements = Field(default_factory=JobRequirements)
    series: str | None = Field(
        None,
        pattern=f"^{SERIES_NAME.pattern}$",
        description="the named series the run (a sweep: its steps) joins, [A-Za-z0-9._-]{1,100}",
    )

    def to_spec(self) -> RunSpec:
        data = self.model_dump(exclude={"name", "requirements", "series"})
        data["api_key"] = self.api_key
        return RunSpec.model_validate(data)


class RunCreated(BaseModel):
    run_id: str
    job_id: str


class JobInfo(BaseModel):
    id: str
    kind: JobKind
    state: JobState
    run_id: str | None
    spec: dict[str, Any]
    requirements: JobRequirements
    attempt: int
    max_attempts: int
    worker_id: str | None
    lease_expires_at: dt.datetime | None
    progress: dict[str, Any] | None
    cancel_requested: bool
    error: str | None
    created_at: dt.datetime
    started_at: dt.datetime | None
    finished_at: dt.datetime | None
    updated_at: dt.datetime


class JobList(BaseModel):
    items: list[JobInfo]
    total: int
    limit: int
    offset: int


class RunSummary(BaseModel):
    id: str
    name: str | None
    status: RunStatus
    source: str
    model: str | None
    target_url: str | None
    endpoint: str | None
    created_at: dt.datetime
    started_at: dt.datetime | None
    finished_at: dt.datetime | None
    tags: list[str]
    note: str | None
    client_limited: bool
    lost_requests: int = Field(
        0, description="requests sent but never stored (any: the run is not valid)"
    )
    summary: dict[str, Any]
    verdict: str = Field(
        "",
        description="how the run reads, one word (app.analysis.verdict): pending, failed, "
        "incomplete, over error bound, client-limited, lost turns, partial, cancelled, "
        "no data, summary-only or valid",
    )
    verdict_issues: list[str] = Field(
        default_factory=list, description="why, one sentence per issue, most severe first"
    )


class RunList(BaseModel):
    items: list[RunSummary]
    total: int
    limit: int
    offset: int


class RunDetail(BaseModel):
    run: RunSummary
    job: JobInfo | None
    report: dict[str, Any] = Field(description="the whole report, as `tokentrace report --json`")


class RequestRow(BaseModel):
    index: int
    warmup: bool
    status: str
    error: str | None
    http_status: int | None
    scheduled_ms: float
    sent_ms: float | None
    end_ms: float | None
    input_tokens: int | None
    output_tokens: int | None
    token_source: str | None
    ttft_ms: float | None
    ttfot_ms: float | None
    e2e_ms: float | None
    tpot_ms: float | None
    n_events: int
    # phases (SPEC 1b), ms; None where the phase did not happen or was not recorded
    queued_ms: float | None = None
    connect_ms: float | None = None
    tls_ms: float | None = None
    sending_ms: float | None = None
    waiting_ms: float | None = None
    first_token_ms: float | None = None
    # what the client added before the first byte (docs/metrics.md): sent - scheduled -
    # queued - connect - tls; None where the queue wait was not recorded
    send_lag_ms: float | None = None
    conn_id: int | None = None
    conn_reused: bool | None = None
    retries: int = 0
    # multi-turn sessions: session from 0, turn from 1; None for single requests
    session: int | None = None
    turn: int | None = None
    # a run over several load processes: the process that sent it (from 0)
    process: int | None = None
    shard: int | None = None  # a run dealt over workers: the shard that sent it (from 0)
    # a run of several models / targets: the model and base URL it used (None: one of each)
    model: str | None = None
    target: str | None = None
    # prompt tokens the server served from its prefix cache; None where it did not say
    cached_prompt_tokens: int | None = None


class RequestPage(BaseModel):
    items: list[RequestRow]
    total: int
    limit: int
    offset: int


class RequestEvents(BaseModel):
    run_id: str
    index: int
    sent_ms: float | None = Field(description="when the request was sent (run-relative ms)")
    t_ms: list[float] = Field(description="arrival of each event, run-relative ms")
    bytes: list[int]
    kinds: list[str] = Field(description="content, reasoning, role, usage or other")
    tokens: list[int]


class CancelResponse(BaseModel):
    run_id: str
    job_id: str
    state: str
    cancel_requested: bool = Field(description="true: the worker stops at its next heartbeat")


class DeleteResponse(BaseModel):
    run_id: str
    deleted: bool


class TagsBody(NoNul):
    model_config = ConfigDict(extra="forbid")
    tags: list[str] = Field(max_length=100)


class TagsResponse(BaseModel):
    run_id: str
    tags: list[str]


class NoteBody(NoNul):
    model_config = ConfigDict(extra="forbid")
    note: str | None = Field(None, max_length=100_000)


class NoteResponse(BaseModel):
    run_id: str
    note: str | None


class WorkerInfo(BaseModel):
    id: str
    name: str | None
    hostname: str
    capabilities: dict[str, Any]
    labels: dict[str, str]
    registered_at: dt.datetime
    last_seen_at: dt.datetime
    current_job_id: str | None
    online: bool = Field(description="seen within the last lease TTL")


class WorkerList(BaseModel):
    items: list[WorkerInfo]
    total: int


class TokenCreate(NoNul):
    model_config = ConfigDict(extra="forbid")
    scopes: list[Scope] = Field(min_length=1)
    name: str | None = Field(None, max_length=255)


class TokenInfo(BaseModel):
    id: str
    name: str | None
    scopes: list[str]
    prefix: str = Field(description="the secret's first characters, for recognizing it")
    created_at: dt.datetime
    last_used_at: dt.datetime | None
    revoked_at: dt.datetime | None


class TokenCreated(TokenInfo):
    secret: str = Field(description="shown once; only its SHA-256 is stored")


class Health(BaseModel):
    status: str
    version: str
    database: str
