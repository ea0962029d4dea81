"""The worker protocol: JSON bodies exchanged between ``tokentrace serve`` and workers.

Shared by the server (``app.api``) and the worker (``app.worker``) so both sides agree by
construction. All routes are under ``/api/v1`` and need ``Authorization: Bearer <token>``
with the ``worker`` scope (see docs/api.md):

    POST /workers/register            RegisterRequest  -> RegisterResponse
    POST /workers/{worker_id}/lease   LeaseRequest     -> LeaseResponse (job or null)
    POST /jobs/{job_id}/heartbeat     HeartbeatRequest -> HeartbeatResponse   (409: lease lost)
    POST /jobs/{job_id}/results       ResultBatch      -> BatchAck            (409: lease lost)
    POST /jobs/{job_id}/complete      CompleteRequest  -> CompleteResponse    (409: lease lost
                                                          or batches missing, named in detail)

Sweep jobs (kind ``sweep``) run their steps in order under one lease; each step is a run:

    POST /jobs/{job_id}/steps                     StepCreate   -> StepCreated  (idempotent
                                                  per step_idx: a retry answers the same run)
    POST /jobs/{job_id}/steps/{step_idx}/complete StepComplete -> StepCompleted (409: lease
                                                  lost or batches missing; a retry answers
                                                  the same summary)

A sweep's result batches name their step's ``run_id``; batch numbers stay unique per job.
The final ``complete`` carries ``stop_reason`` (why the sweep stopped early, if it did).

Lease semantics: a lease lasts ``lease_ttl_s`` and each heartbeat renews it. When a lease
expires, the job is requeued (attempt + 1) if the lost attempt uploaded nothing and attempts
remain; it fails if attempts are used up; and if the lost attempt had uploaded results they
are kept and the run is marked partial. A sweep job is requeued while attempts remain even
after it created steps: the next lease carries ``resume`` (the steps earlier attempts
completed, which the worker replays instead of running, and the first batch number to use);
the interrupted step is re-run in a new run in the same step slot. With no attempts left a
sweep that had created steps keeps them and is marked partial (its unfinished step runs are
finalized as partial). A retried batch (same
job, same ``batch_no``) is acknowledged as a duplicate and changes nothing; requests are
unique per (run, index).

A batch the server refuses (a 4xx other than 409/404, or a 5xx other than 502-504, five
times) is never dropped: the worker stops the load, completes the job ``failed`` with the
server's reason, ``total_batches`` up to the refused batch and ``records`` (every request it
recorded), and keeps the unsent batches in its spool (``kept/``). The server counts
``records`` minus the requests stored as the run's lost requests: such a run is ``partial``
and never valid.
"""

from __future__ import annotations

import base64
from datetime import datetime
from typing import Annotated, Any, Literal

import numpy as np
from pydantic import AfterValidator, BaseModel, ConfigDict, Field, field_validator

from app.domain import (
    MAX_JSON_DEPTH,
    PHASES,
    AgentLink,
    ClockSource,
    RequestRecord,
    RequestStatus,
    json_depth,
)
from app.protocol.nul import NoNul, no_nul
from app.protocol.packing import pack_events, unpack_events

# Integers as the columns that store them hold them: a larger one is a 422 naming the field,
# not an OverflowError (500) in numpy or the database.
INT32_MAX = 2**31 - 1
INT64_MAX = 2**63 - 1
# Nanosecond times and token counts (BIGINT, migration 0009). Counts may come from the
# target's usage object, so their sign is not checked here: what fits is stored as reported.
Int64 = Annotated[int, Field(ge=-(2**63), le=INT64_MAX)]
LiveRole = Annotated[str, Field(min_length=1, max_length=64)]
FiniteFloat = Annotated[float, Field(allow_inf_nan=False)]
Number32 = Annotated[int, Field(ge=0, le=INT32_MAX)]  # request indices, batch numbers

# Strings: what a worker says about itself (its names, its host) is refused with a NUL and
# bounded to its column (a 422 naming the field); what it reports of the target (error
# messages, /metrics label names and values) is stored faithfully (app.protocol.nul).
WorkerName = Annotated[str, AfterValidator(no_nul), Field(max_length=255)]

JobKind = Literal["bench", "probe", "sweep"]
JobState = Literal["queued", "leased", "running", "succeeded", "failed", "cancelled"]
TERMINAL_JOB_STATES: tuple[JobState, ...] = ("succeeded", "failed", "cancelled")
ACTIVE_JOB_STATES: tuple[JobState, ...] = ("leased", "running")  # a worker holds the lease


class _Model(BaseModel):
    model_config = ConfigDict(extra="forbid")


class _WorkerFacts(NoNul, _Model):
    """What a worker says about itself: a NUL in any field is a 422 naming it."""


class GPUInfo(_WorkerFacts):
    index: int
    name: str
    uuid: str | None = None
    memory_total_mb: int | None = None
    driver_version: str | None = None
    cuda_version: str | None = None


class WorkerCapabilities(_WorkerFacts):
    hostname: str = Field(max_length=255)
    cpu: str | None = None
    cpu_count: int | None = None
    memory_total_mb: int | None = None
    gpus: list[GPUInfo] = Field(default_factory=list)
    torch_version: str | None = None
    tokentrace_version: str
    labels: dict[str, str] = Field(default_factory=dict)


class RegisterRequest(_WorkerFacts):
    name: str | None = Field(None, max_length=255)
    capabilities: WorkerCapabilities


class RegisterResponse(_Model):
    worker_id: str
    lease_ttl_s: float
    heartbeat_interval_s: float
    poll_interval_s: float


class JobRequirements(_Model):
    """Matched when a worker asks for work: every label equal, GPU name contained in one of
    the worker's GPU names (case-insensitive), and some GPU with at least that memory."""

    labels: dict[str, str] = Field(default_factory=dict)
    gpu_name: str | None = None
    min_gpu_memory_mb: int | None = Field(None, ge=0)


def _bench_only() -> list[JobKind]:
    return ["bench"]


class LeaseRequest(_Model):
    kinds: list[JobKind] = Field(default_factory=_bench_only)


class LeasedJob(_Model):
    job_id: str
    kind: JobKind
    spec: dict[str, Any]  # for "bench": RunSpec.model_dump(mode="json") plus api_key if any
    run_id: str | None
    attempt: int
    lease_id: str
    lease_expires_at: datetime
    resume: SweepResume | None = None  # sweeps, attempt >= 2: what earlier attempts did
    shard: int | None = None  # a run dealt over workers: this lease's shard (of spec.shards)


class LeaseResponse(_Model):
    job: LeasedJob | None = None


class JobProgress(_Model):
    phase: str = "starting"
    planned: Int64 = 0
    sent: Int64 = 0
    done: Int64 = 0
    errors: Int64 = 0
    in_flight: Int64 = 0
    output_tokens: Int64 = 0
    tokens_per_s: float = 0.0
    elapsed_s: float = 0.0
    step: int | None = None  # sweeps: the step running now (0-based)
    steps: int | None = None  # sweeps: how many steps are planned
    run_id: str | None = None  # sweeps: the run of the current step
    # the target's /metrics at its last scrape: role -> value (``live_metrics.snapshot``);
    # the dashboard keeps them as the run page's live series
    server_metrics: dict[LiveRole, FiniteFloat] | None = Field(None, max_length=16)
    server_metrics_t_s: FiniteFloat | None = None  # that scrape's time in the run, s


class HeartbeatRequest(_Model):
    lease_id: str
    progress: JobProgress | None = None


class ShardReady(_Model):
    """A shard's worker is ready (its share built): POST /jobs/{job_id}/shard-ready, again
    until the answer has ``start_ns``. ``phase`` "measure": its warm-ups ended, and the
    answer's ``start_ns`` is the measured phase's common start."""

    lease_id: str
    phase: Literal["run", "measure"] = "run"


class ShardStart(_Model):
    """The common start of a run dealt over workers: ``start_ns`` on the server's wall clock
    once every shard is leased and ready (None: still waiting); the clock stamps make the
    call a four-timestamp exchange as a heartbeat's (``clock_sync``)."""

    start_ns: Int64 | None = None
    leased: int
    ready: int
    shards: int
    clock_t2_ns: Int64 | None = None
    clock_t3_ns: Int64 | None = None


class HeartbeatResponse(_Model):
    cancel: bool
    lease_expires_at: datetime
    # the server's wall clock (ns) when it received the heartbeat and when it replied: with
    # the worker's own send and receipt, a four-timestamp exchange (``clock_sync``)
    clock_t2_ns: Int64 | None = None
    clock_t3_ns: Int64 | None = None


class WireRequest(_Model):
    """One ``RequestRecord``; its event arrays travel packed and base64-encoded."""

    index: Number32
    scheduled_ns: Int64
    sent_ns: Int64 | None
    end_ns: Int64 | None
    status: RequestStatus
    error: str | None = None
    http_status: int | None = Field(None, ge=0, le=999)
    input_tokens: Int64 | None = None
    output_tokens: Int64 | None = None
    tokenizer_output_tokens: Int64 | None = None
    usage_prompt_tokens: Int64 | None = None
    usage_completion_tokens: Int64 | None = None
    cached_prompt_tokens: Int64 | None = None  # absent from older workers: unknown
    token_source: Literal["usage", "tokenizer", "imported"] | None = None
    done_ns: Int64 | None = None
    warmup: bool = False
    queued_ns: Int64 | None = None
    connect_ns: Int64 | None = None
    tls_ns: Int64 | None = None
    sending_ns: Int64 | None = None
    waiting_ns: Int64 | None = None
    first_token_ns: Int64 | None = None
    conn_id: Number32 | None = None
    conn_reused: bool | None = None
    retries: Number32 = 0
    # multi-turn sessions (absent from older workers: single requests)
    session: int | None = Field(None, ge=0, le=2**31 - 1)
    turn: int | None = Field(None, ge=1, le=2**31 - 1)
    process: int | None = Field(None, ge=0, le=1023)  # a dealt run's load process
    # a run of several models / targets (absent: one of each)
    model: str | None = Field(None, min_length=1, max_length=255)
    target: str | None = Field(None, min_length=1, max_length=2048)
    # an agent trace's request: its parents' indices, depth, delay (absent: not one)
    agent_parents: list[Number32] | None = Field(None, max_length=10_000)
    agent_depth: Number32 | None = None
    agent_delay_ns: Int64 | None = Field(None, ge=0)
    events_b64: str = ""

    @classmethod
    def from_record(cls, r: RequestRecord) -> WireRequest:
        """The record for upload. A token count past 64 bits (a target's usage object can
        report anything) is sent as unknown (None): it fits no column, and refusing the
        batch would lose every request in it."""
        blob = pack_events(r.event_t_ns, r.event_bytes, r.event_kind, r.event_tokens)
        return cls(
            index=r.index,
            scheduled_ns=r.scheduled_ns,
            sent_ns=r.sent_ns,
            end_ns=r.end_ns,
            status=r.status,
            error=r.error,
            http_status=r.http_status,
            input_tokens=_int64_or_none(r.input_tokens),
            output_tokens=_int64_or_none(r.output_tokens),
            tokenizer_output_tokens=_int64_or_none(r.tokenizer_output_tokens),
            usage_prompt_tokens=_int64_or_none(r.usage_prompt_tokens),
            usage_completion_tokens=_int64_or_none(r.usage_completion_tokens),
            cached_prompt_tokens=_int64_or_none(r.cached_prompt_tokens),
            token_source=r.token_source,
            done_ns=r.done_ns,
            warmup=r.warmup,
            **{f"{p}_ns": getattr(r, f"{p}_ns") for p in PHASES},
            conn_id=r.conn_id,
            conn_reused=r.conn_reused,
            retries=r.retries,
            session=r.session,
            turn=r.turn,
            process=r.process,
            model=r.model,
            target=r.target,
            agent_parents=None if r.agent is None else list(r.agent.parents),
            agent_depth=None if r.agent is None else r.agent.depth,
            agent_delay_ns=None if r.agent is None else r.agent.delay_ns,
            events_b64=base64.b64encode(blob).decode("ascii"),
        )

    def _agent(self) -> AgentLink | None:
        return _agent_link(self.agent_parents, self.agent_depth, self.agent_delay_ns)

    def to_record(self) -> RequestRecord:
        """Raises ValueError when the events blob is not valid base64 or not a packed log."""
        try:
            blob = base64.b64decode(self.events_b64.encode("ascii"), validate=True)
        except (ValueError, UnicodeEncodeError) as e:
            raise ValueError(f"request {self.index}: events_b64 is not base64: {e}") from None
        if blob:
            t, nb, kind, tok = unpack_events(blob)
        else:
            t = np.zeros(0, np.int64)
            nb = np.zeros(0, np.int32)
            kind = np.zeros(0, np.int8)
            tok = np.zeros(0, np.int32)
        return RequestRecord(
            index=self.index,
            scheduled_ns=self.scheduled_ns,
            sent_ns=self.sent_ns,
            end_ns=self.end_ns,
            status=self.status,
            error=self.error,
            http_status=self.http_status,
            input_tokens=self.input_tokens,
            output_tokens=self.output_tokens,
            tokenizer_output_tokens=self.tokenizer_output_tokens,
            usage_prompt_tokens=self.usage_prompt_tokens,
            usage_completion_tokens=self.usage_completion_tokens,
            cached_prompt_tokens=self.cached_prompt_tokens,
            token_source=self.token_source,
            done_ns=self.done_ns,
            warmup=self.warmup,
            queued_ns=self.queued_ns,
            connect_ns=self.connect_ns,
            tls_ns=self.tls_ns,
            sending_ns=self.sending_ns,
            waiting_ns=self.waiting_ns,
            first_token_ns=self.first_token_ns,
            conn_id=self.conn_id,
            conn_reused=self.conn_reused,
            retries=self.retries,
            session=self.session,
            turn=self.turn,
            process=self.process,
            model=self.model,
            target=self.target,
            agent=self._agent(),
            event_t_ns=t,
            event_bytes=nb,
            event_kind=kind,
            event_tokens=tok,
        )


def _agent_link(
    parents: list[int] | None, depth: int | None, delay_ns: int | None
) -> AgentLink | None:
    if parents is None or depth is None or delay_ns is None:
        return None
    return AgentLink(tuple(parents), depth, delay_ns)


def _int64_or_none(v: int | None) -> int | None:
    return v if v is not None and -(2**63) <= v <= INT64_MAX else None


class ResultBatch(_Model):
    lease_id: str
    batch_no: Number32
    requests: list[WireRequest]
    # sweeps: the step's run (bench jobs: the job's run); an id: a NUL is a 422
    run_id: Annotated[str, AfterValidator(no_nul), Field(max_length=32)] | None = None


class BatchAck(_Model):
    batch_no: int
    accepted: int  # requests newly stored
    duplicate: bool  # this batch_no was already stored: nothing changed


class RunMeta(_Model):
    """What the worker measured about the run as a whole (from ``LoadResult``)."""

    start_mono_ns: Int64 | None = None
    started_at: datetime | None = None
    clock_source: ClockSource | None = None  # unknown: 422 before anything is stored
    client_limited: bool = False
    validity: list[str] = Field(default_factory=list)
    load_stats: dict[str, Any] = Field(default_factory=dict)
    client_host: WorkerName | None = None
    client_version: Annotated[str, AfterValidator(no_nul), Field(max_length=64)] | None = None

    @field_validator("load_stats")
    @classmethod
    def _shallow(cls, v: dict[str, Any]) -> dict[str, Any]:
        if json_depth(v) > MAX_JSON_DEPTH:
            raise ValueError(f"nested deeper than {MAX_JSON_DEPTH} levels")
        return v


class ServerMetricSeries(_Model):
    """One Prometheus series scraped from the target during the run (times run-relative)."""

    name: Annotated[str, AfterValidator(no_nul), Field(min_length=1, max_length=200)]
    labels: dict[str, str] = Field(default_factory=dict)  # the target's: stored faithfully
    kind: str | None = Field(None, max_length=16, pattern=r"^[a-z]+$")  # a '# TYPE' word
    t_ns: list[Int64]
    values: list[float]


class CompleteRequest(_Model):
    lease_id: str
    status: Literal["succeeded", "failed", "cancelled"]
    error: str | None = None
    total_batches: Number32
    run_meta: RunMeta | None = None
    server_metrics: list[ServerMetricSeries] | None = None  # stored with the run (replaces)
    # requests the load recorded, warm-ups included, in every batch (uploaded or not); those
    # not stored count as the run's lost requests (None: not said, e.g. an older worker)
    records: Number32 | None = None
    stop_reason: str | None = Field(None, max_length=2000)  # sweeps: why they stopped early


class CompleteResponse(_Model):
    job_id: str
    state: JobState
    run_id: str | None


# ------------------------------------------------------------------------------ sweeps

MAX_SWEEP_STEPS = 64  # steps one sweep job may create (probes included)


class StepCreate(_Model):
    """Create (or, on a retry, find) step ``step_idx`` of the leased sweep job's sweep."""

    lease_id: str
    step_idx: int = Field(ge=0, lt=MAX_SWEEP_STEPS)
    load: float | None = Field(None, gt=0)  # None: unlimited rate (the max-throughput probe)
    load_kind: Literal["rate", "concurrency"]
    role: Literal["step", "probe"] = "step"
    planned_loads: list[float] | None = Field(None, max_length=MAX_SWEEP_STEPS)


class StepCreated(_Model):
    run_id: str
    step_idx: int


class StepComplete(_Model):
    """End one step: its run is finalized. ``total_batches``: batches sent for the whole job
    so far (every one must have arrived)."""

    lease_id: str
    status: Literal["succeeded", "failed", "cancelled"]
    error: str | None = None
    total_batches: Number32
    run_meta: RunMeta | None = None
    server_metrics: list[ServerMetricSeries] | None = None
    records: Number32 | None = None  # this step's requests recorded (as ``CompleteRequest``'s)


class StepCompleted(_Model):
    run_id: str
    step_idx: int
    status: str  # the run's status
    summary: dict[str, Any]  # the step as ``app.client.sweep_plan.step_dict`` writes it


class ResumedStep(_Model):
    """A step an earlier attempt of the sweep job completed: the worker replays it (the plan
    must ask for the same load, kind and role at ``step_idx``) instead of running it."""

    step_idx: int = Field(ge=0, lt=MAX_SWEEP_STEPS)
    run_id: str
    load: float | None  # None: unlimited rate (the max-throughput probe)
    load_kind: Literal["rate", "concurrency"]
    role: Literal["step", "probe"]
    summary: dict[str, Any]  # as ``StepCompleted.summary`` answered it


class SweepResume(_Model):
    """Sent with the lease of a sweep job's attempt >= 2: the steps completed so far (steps
    0..n-1, in order) and the first batch number this attempt uses (batch numbers stay
    unique per job)."""

    completed: list[ResumedStep] = Field(default_factory=list, max_length=MAX_SWEEP_STEPS)
    first_batch_no: Number32 = 0


LeasedJob.model_rebuild()
