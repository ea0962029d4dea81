"""/api/v1/sweeps (create on a worker, cancel) and the sweep steps of the worker protocol
(bodies in app.protocol.wire). Reading sweeps lives in routes_compare."""

from __future__ import annotations

import math
from typing import Annotated, Any

from fastapi import APIRouter, Path, status
from pydantic import BaseModel, ConfigDict, Field, model_validator

from app.analysis.slo_search import (
    DEFAULT_CONFIDENCE,
    DEFAULT_MAX_STEPS,
    FindMax,
    SloError,
    find_max_of,
)
from app.api.deps import (
    Runner,
    SecretBoxDep,
    SessionDep,
    SessionsDep,
    SettingsDep,
    WorkerCaller,
)
from app.api.schemas import RunCreate
from app.client.datasets import dataset_type
from app.client.sweep_plan import MAX_STEPS, SweepPlan
from app.protocol.wire import MAX_SWEEP_STEPS, StepComplete, StepCompleted, StepCreate, StepCreated
from app.services import series as series_svc
from app.services import sweep_jobs, targets
from app.services.errors import Invalid

router = APIRouter(prefix="/api/v1", tags=["sweeps"])


class FindMaxBody(BaseModel):
    """A find-max sweep (docs/sweeps.md): the largest ``kind`` load whose ``slos``
    (``METRIC:PCT:LIMIT``, e.g. ``tpot:p99:50``) hold with ``confidence``, in at most
    ``max_steps`` probed steps from ``start`` up to ``max_load``."""

    model_config = ConfigDict(extra="forbid")

    kind: str = Field(description="concurrency | rate")
    slos: list[str] = Field(min_length=1, max_length=16)
    confidence: float = DEFAULT_CONFIDENCE
    max_steps: int = DEFAULT_MAX_STEPS
    start: float = 1.0
    max_load: float = 1024.0

    def search(self) -> FindMax:
        """The search; 422 naming ``find_max.<field>`` when a setting is refused."""
        try:
            return find_max_of(self.model_dump())
        except SloError as e:
            field = {"find_max": "kind", "find_max_start": "start", "find_max_limit": "max_load"}
            name = field.get(e.field, e.field).replace("slo", "slos")
            raise Invalid(f"find_max.{name}: {e.message}", loc=("body", "find_max", name)) from None


class SweepCreate(RunCreate):
    """A sweep to queue: every bench field (the base workload), then exactly one of
    ``rates``, ``concurrencies`` or ``auto``, the stop rules, a name and tags (each step's
    run carries the tags)."""

    rates: list[float] | None = Field(None, max_length=MAX_STEPS)
    concurrencies: list[int] | None = Field(None, max_length=MAX_STEPS)
    auto: bool = False
    auto_steps: int = Field(5, ge=1, le=MAX_STEPS)
    min_ratio: float = Field(0.8, gt=0, le=1, description="saturated below this x offered")
    max_error_rate: float = Field(0.05, ge=0, le=1)
    find_max: FindMaxBody | None = None

    @model_validator(mode="after")
    def _one_mode(self) -> SweepCreate:
        given = [k for k in ("rates", "concurrencies", "find_max") if getattr(self, k) is not None]
        if self.auto:
            given.append("auto")
        if len(given) != 1:
            raise ValueError("give exactly one of rates, concurrencies, auto or find_max")
        return self

    def check_load_fields(self) -> None:
        """Refuse (422 naming the field) what each step sets itself: a request rate (every
        step sets its rate, or sends all at once under its concurrency), a concurrency cap
        in a concurrency sweep, and in a rate sweep (``rates``, ``auto``) a ramp-up or a
        timed dataset (both give the send times the step's rate would)."""
        by_rate = self.concurrencies is None and (
            self.find_max is None or self.find_max.kind != "concurrency"
        )
        if not math.isinf(self.request_rate):
            raise Invalid(
                "request_rate: a sweep sets each step's load (rates, concurrencies or auto): "
                "leave request_rate out",
                loc=("body", "request_rate"),
            )
        if not by_rate and self.max_concurrency is not None:
            raise Invalid(
                "max_concurrency: a concurrency sweep sets each step's concurrency: leave "
                "max_concurrency out",
                loc=("body", "max_concurrency"),
            )
        if by_rate and self.ramp_up_strategy is not None:
            raise Invalid(
                "ramp_up_strategy: a rate sweep sets each step's request rate; a ramp-up "
                "applies to a concurrency sweep (concurrencies) only",
                loc=("body", "ramp_up_strategy"),
            )
        if by_rate and dataset_type(self.dataset).timed:
            raise Invalid(
                f"dataset: the dataset {self.dataset!r} gives each request's send time, so a "
                "rate sweep does not apply: sweep concurrencies instead",
                loc=("body", "dataset"),
            )

    def plan(self) -> SweepPlan:
        if self.find_max is not None:
            fm = self.find_max.search()
            self.check_load_fields()
            return SweepPlan("find-max", (), 5, self.min_ratio, self.max_error_rate, fm)
        self.check_load_fields()
        try:
            if self.auto:
                return SweepPlan("auto", (), self.auto_steps, self.min_ratio, self.max_error_rate)
            if self.rates is not None:
                loads = tuple(float(x) for x in self.rates)
                return SweepPlan("rates", loads, 5, self.min_ratio, self.max_error_rate)
            loads = tuple(float(x) for x in self.concurrencies or ())
            return SweepPlan("concurrencies", loads, 5, self.min_ratio, self.max_error_rate)
        except ValueError as e:
            field = "concurrencies" if self.concurrencies is not None else "rates"
            if "auto_steps" in str(e):
                field = "auto_steps"
            raise Invalid(str(e).replace("loads:", f"{field}:"), loc=("body", field)) from None

    def base_spec(self) -> Any:
        data = self.model_dump(
            exclude={
                "name", "requirements", "rates", "concurrencies", "auto", "auto_steps",
                "min_ratio", "max_error_rate", "series", "find_max",
            }
        )  # fmt: skip
        data["api_key"] = self.api_key
        from app.client.spec import RunSpec

        return RunSpec.model_validate(data)


class SweepCreated(BaseModel):
    sweep_id: str
    job_id: str


class SweepCancelled(BaseModel):
    sweep_id: str
    job_id: str
    state: str
    cancel_requested: bool


@router.post("/sweeps", status_code=status.HTTP_201_CREATED)
def create_sweep(
    body: SweepCreate, session: SessionDep, settings: SettingsDep, box: SecretBoxDep, _: Runner
) -> SweepCreated:
    """Queue a sweep: creates the sweep (status queued) and its one ``sweep`` job together;
    a worker runs the steps in order. 422 naming the field when the plan or the target
    (allow-list) is refused."""
    targets.check_run_targets(body.base_url, body.metrics_url, settings, body.base_urls)
    plan = body.plan()
    sweep_id, job_id = sweep_jobs.create_sweep_job(
        session,
        body.base_spec(),
        plan,
        box=box,
        requirements=body.requirements,
        name=body.name,
        max_attempts=settings.max_attempts,
    )
    if body.series:  # its step runs join the series as they finish
        series_svc.join_sweep(session, body.series, sweep_id)
    return SweepCreated(sweep_id=sweep_id, job_id=job_id)


@router.post("/sweeps/{sweep_id}/cancel")
def cancel_sweep(sweep_id: str, session: SessionDep, _: Runner) -> SweepCancelled:
    """Queued: cancelled now. On a worker: it stops at its next heartbeat; finished steps
    are kept."""
    return SweepCancelled(**sweep_jobs.cancel_sweep(session, sweep_id))


LEASE_LOST: dict[int | str, dict[str, Any]] = {
    409: {"description": "lease lost, or (step completion) batches missing, named in detail"}
}


@router.post("/jobs/{job_id}/steps", tags=["worker protocol"], responses=LEASE_LOST)
def create_step(
    job_id: str, body: StepCreate, session: SessionDep, caller: WorkerCaller
) -> StepCreated:
    """Create the next step's run of a leased sweep job (a retry answers the same run)."""
    return sweep_jobs.create_step(session, job_id, body, caller)


@router.post(
    "/jobs/{job_id}/steps/{step_idx}/complete", tags=["worker protocol"], responses=LEASE_LOST
)
def complete_step(
    job_id: str,
    step_idx: Annotated[int, Path(ge=0, lt=MAX_SWEEP_STEPS)],
    body: StepComplete,
    session: SessionDep,
    sessions: SessionsDep,
    caller: WorkerCaller,
) -> StepCompleted:
    """Finalize one step's run; the answer is its summary (load, achieved rate, latencies)."""
    return sweep_jobs.complete_step(session, sessions, job_id, step_idx, body, caller)
