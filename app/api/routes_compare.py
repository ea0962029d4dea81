"""/api/v1/baselines, /api/v1/compare and /api/v1/sweeps: named baselines, statistical
comparisons and stored sweeps."""

from __future__ import annotations

from typing import Annotated, Any, Literal

import anyio
from fastapi import APIRouter, Query, status
from pydantic import BaseModel, ConfigDict, Field

from app.api.deps import Reader, Runner, SessionDep, SessionsDep
from app.protocol.nul import NoNul
from app.services import baselines as baseline_svc
from app.services import compare as compare_svc
from app.services import compare_sets
from app.services import sweeps as sweep_svc
from app.services.errors import Invalid
from app.storage import compare_repo
from app.storage.jsonsafe import json_safe

router = APIRouter(prefix="/api/v1", tags=["compare"])


class BaselineCreate(NoNul):
    model_config = ConfigDict(extra="forbid")

    name: str = Field(min_length=1, max_length=255)
    target_id: str = Field(min_length=1, max_length=32, description="a run id or a sweep id")
    pinned: bool = False
    note: str | None = None


class BaselineOut(BaseModel):
    name: str
    version: int
    run_id: str | None
    sweep_id: str | None
    pinned: bool
    note: str | None
    created_at: str
    replaced_at: str | None


class PinBody(BaseModel):
    model_config = ConfigDict(extra="forbid")

    pinned: bool


@router.post("/baselines", status_code=status.HTTP_201_CREATED)
def save_baseline(body: BaselineCreate, session: SessionDep, _: Runner) -> BaselineOut:
    """Save a run or sweep under a name (a new version; 409 when the name is pinned)."""
    row = baseline_svc.save(session, body.target_id, body.name, pin=body.pinned, note=body.note)
    return BaselineOut.model_validate(row)


@router.get("/baselines")
def list_baselines(session: SessionDep, _: Reader) -> list[BaselineOut]:
    return [BaselineOut.model_validate(b) for b in baseline_svc.list_all(session)]


@router.get("/baselines/{name}/history")
def baseline_history(name: str, session: SessionDep, _: Reader) -> list[BaselineOut]:
    return [BaselineOut.model_validate(b) for b in baseline_svc.history(session, name)]


@router.put("/baselines/{name}/pin")
def pin_baseline(name: str, body: PinBody, session: SessionDep, _: Runner) -> BaselineOut:
    return BaselineOut.model_validate(baseline_svc.set_pin(session, name, body.pinned))


def _ids(ids: list[str] | None, base: str | None = None) -> list[str]:
    """The candidate ids: split at commas, each once, the baseline's own id dropped; 422
    naming the limit past ``MAX_RUNS - 1`` candidates (before anything is read)."""
    split = [i.strip() for raw in ids or [] for i in raw.split(",") if i.strip()]
    out = [i for i in compare_svc.unique_ids(split) if i != base]
    if len(out) > compare_svc.MAX_RUNS - 1:
        raise Invalid(
            f"compare at most {compare_svc.MAX_RUNS} runs at once: the baseline and up to "
            f"{compare_svc.MAX_RUNS - 1} candidates (got {len(out)} candidates)",
            loc=("query", "ids"),
        )
    return out


Ids = Annotated[list[str] | None, Query(description="candidate run ids (comma-separated ok)")]
Threshold = Annotated[float, Query(ge=0, le=1000, description="percent")]
Alpha = Annotated[float, Query(gt=0, lt=1)]


Listed = Annotated[list[str] | None, Query(description="ids, comma-separated ok")]


@router.get("/compare")
async def compare_set(
    sessions: SessionsDep,
    _: Reader,
    ids: Listed = None,
    sweeps: Listed = None,
    baseline: Annotated[
        str | None, Query(description="the id (among those given) to compare the others to")
    ] = None,
    threshold_pct: Threshold = 5.0,
    alpha: Alpha = 0.01,
    variable: str | None = None,
) -> dict[str, Any]:
    """2 to 6 runs (``ids``) or sweeps (``sweeps``) against the ``baseline`` picked among
    them, else the oldest (never the order given; ``baseline_chosen`` says which). Sweeps:
    the baseline against each other sweep step by step, steps whose runs cannot be trusted
    flagged (``untrusted``). 422 naming the field for both or neither, a count out of range
    or a baseline not among them, before anything is read."""
    run_ids, sweep_ids = _split(ids), _split(sweeps)
    if bool(run_ids) == bool(sweep_ids):
        raise Invalid("give either ids (runs) or sweeps, not both", loc=("query", "ids"))
    wanted = run_ids or sweep_ids
    if len(wanted) > compare_svc.MAX_RUNS:
        raise Invalid(
            f"compare at most {compare_svc.MAX_RUNS} at once (got {len(wanted)})",
            loc=("query", "ids" if run_ids else "sweeps"),
        )

    def work() -> dict[str, Any]:
        compare = compare_sets.compare_run_set if run_ids else compare_sets.compare_sweep_set
        return compare(
            sessions, wanted, baseline=baseline or None, threshold_pct=threshold_pct,
            alpha=alpha, variable=variable,
        )  # fmt: skip

    out: dict[str, Any] = json_safe(await anyio.to_thread.run_sync(work))
    return out


def _split(ids: list[str] | None) -> list[str]:
    split = [i.strip() for raw in ids or [] for i in raw.split(",") if i.strip()]
    return compare_svc.unique_ids(split)


@router.get("/compare/{base_id}")
async def compare(
    base_id: str,
    sessions: SessionsDep,
    _: Reader,
    ids: Ids = None,
    threshold_pct: Threshold = 5.0,
    alpha: Alpha = 0.01,
    variable: str | None = None,
    basis: Literal["run", "steady"] = "run",
) -> dict[str, Any]:
    """Statistical comparison against ``base_id``: a run (1 to 5 candidate runs in ``ids``,
    each once) or a sweep (one candidate sweep); ``basis=steady``: each run's steady window
    (its figures and the requests started inside it; 422 for a run without one). Verdicts
    per metric; comparability key checked first. Runs are read from their stored
    summaries, each metric's samples bounded (``method.samples``); 409 for a run still
    queued or running."""
    wanted = _ids(ids, base_id)

    def work() -> dict[str, Any]:
        with sessions() as s:
            target = baseline_svc.resolve_target(s, base_id)  # 404 first
        if not wanted:
            raise Invalid("give at least one candidate id", loc=("query", "ids"))
        if target.sweep_id is not None:
            if len(wanted) != 1:
                raise Invalid("compare one sweep against a sweep", loc=("query", "ids"))
            return compare_svc.compare_sweeps(
                sessions, base_id, wanted[0], threshold_pct=threshold_pct, alpha=alpha,
                variable=variable, basis=basis,
            )  # fmt: skip
        return compare_svc.compare_runs(
            sessions, base_id, wanted, threshold_pct=threshold_pct, alpha=alpha,
            variable=variable, basis=basis,
        )  # fmt: skip

    out: dict[str, Any] = json_safe(await anyio.to_thread.run_sync(work))
    return out


@router.get("/baselines/{name}/compare")
async def compare_to_baseline(
    name: str,
    sessions: SessionsDep,
    _: Reader,
    ids: Ids = None,
    threshold_pct: Threshold = 5.0,
    alpha: Alpha = 0.01,
    variable: str | None = None,
) -> dict[str, Any]:
    """Runs (or one sweep) against the current version of baseline ``name`` (the CI gate)."""
    wanted = _ids(ids)

    def work() -> dict[str, Any]:
        with sessions() as s:
            baseline_svc.current(s, name)  # 404 first
        if not wanted:
            raise Invalid("give at least one candidate id", loc=("query", "ids"))
        return compare_svc.compare_to_baseline(
            sessions, wanted, name, threshold_pct=threshold_pct, alpha=alpha, variable=variable
        )

    out: dict[str, Any] = json_safe(await anyio.to_thread.run_sync(work))
    return out


@router.get("/sweeps")
def list_sweeps(
    session: SessionDep, _: Reader, limit: Annotated[int, Query(ge=1, le=500)] = 100
) -> list[dict[str, Any]]:
    return [
        {
            "id": s.id,
            "name": s.name,
            "status": s.status,
            "mode": s.mode,
            "loads": list(s.loads or []),
            "stop_reason": s.stop_reason,
            "created_at": s.created_at.isoformat(),
        }
        for s in compare_repo.list_sweeps(session, limit=limit)
    ]


@router.get("/sweeps/{sweep_id}")
async def get_sweep(
    sweep_id: str, sessions: SessionsDep, _: Reader, basis: Literal["run", "steady"] = "run"
) -> dict[str, Any]:
    """The sweep with every step's summary, max goodput, stop reason and diagnosis;
    ``basis=steady``: each step's figures over its run's steady window."""
    steady = basis == "steady"
    out: dict[str, Any] = json_safe(
        await anyio.to_thread.run_sync(
            lambda: sweep_svc.sweep_summary(sessions, sweep_id, steady=steady)
        )
    )
    return out
