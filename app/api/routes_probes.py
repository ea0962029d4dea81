"""/api/v1/probes (GPU probes and their artifacts), probe results and telemetry from
workers, run annotations, presets and the capacity planner."""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import APIRouter, Query, Response, status
from pydantic import BaseModel, ConfigDict, Field

from app.analysis.device_presets import DEVICE_PRESETS
from app.analysis.model_presets import MODEL_PRESETS
from app.api.deps import MAX_OFFSET, Reader, Runner, SessionDep, SettingsDep, WorkerCaller
from app.probes.spec import ProbeKind, ProbeSpec
from app.protocol.nul import NoNul
from app.protocol.probe_wire import ProbeResultAck, ProbeResultUpload, TelemetryAck, TelemetryUpload
from app.protocol.wire import JobRequirements
from app.services import probe_jobs
from app.services import probes as svc

router = APIRouter(prefix="/api/v1", tags=["probes"])


class ProbeCreate(NoNul, ProbeSpec):
    """A probe to queue (a NUL in any field is a 422: ``NoNul``)."""

    requirements: JobRequirements = Field(default_factory=JobRequirements)


class ProbeCreated(BaseModel):
    probe_id: str
    job_id: str


class ProbeList(BaseModel):
    model_config = ConfigDict(arbitrary_types_allowed=True)
    items: list[dict[str, Any]]


@router.post("/probes", status_code=status.HTTP_201_CREATED)
def create_probe(
    body: ProbeCreate, session: SessionDep, settings: SettingsDep, _: Runner
) -> ProbeCreated:
    """Queue a probe job (a worker started with ``--kind probe`` runs it)."""
    spec = ProbeSpec.model_validate(body.model_dump(exclude={"requirements"}))
    pid, jid = probe_jobs.submit(
        session, spec, requirements=body.requirements, max_attempts=settings.max_attempts
    )
    return ProbeCreated(probe_id=pid, job_id=jid)


@router.get("/probes")
def list_probes(
    session: SessionDep,
    _: Reader,
    kind: ProbeKind | None = None,
    limit: Annotated[int, Query(ge=1, le=500)] = 100,
    offset: Annotated[int, Query(ge=0, le=MAX_OFFSET)] = 0,
) -> ProbeList:
    return ProbeList(items=svc.list_views(session, kind=kind, limit=limit, offset=offset))


@router.get("/probes/{probe_id}")
def get_probe(probe_id: str, session: SessionDep, _: Reader) -> dict[str, Any]:
    """The probe with its device fingerprint, result, telemetry and artifact index."""
    return svc.get_view(session, probe_id)


@router.get(
    "/probes/{probe_id}/artifacts/{name}",
    response_class=Response,
    responses={200: {"content": {"application/gzip": {}}}},
)
def download_artifact(probe_id: str, name: str, session: SessionDep, _: Reader) -> Response:
    """An artifact as stored, e.g. ``trace-prefill.json.gz`` (open it in Perfetto or
    chrome://tracing)."""
    ctype, data = svc.artifact(session, probe_id, name)
    return Response(
        data,
        media_type=ctype,
        headers={"Content-Disposition": f'attachment; filename="{probe_id}-{name}"'},
    )


@router.delete("/probes/{probe_id}", status_code=status.HTTP_204_NO_CONTENT)
def delete_probe(probe_id: str, session: SessionDep, _: Runner) -> Response:
    svc.delete(session, probe_id)
    return Response(status_code=204)


@router.post("/jobs/{job_id}/probe-result", tags=["worker protocol"])
def upload_probe_result(
    job_id: str,
    body: ProbeResultUpload,
    session: SessionDep,
    settings: SettingsDep,
    caller: WorkerCaller,
) -> ProbeResultAck:
    """A probe job's result, fingerprint, telemetry and artifacts (base64)."""
    cap = int(settings.probe_artifact_max_mb * 1024 * 1024)
    return probe_jobs.store_result(session, job_id, body, caller, max_artifact_bytes=cap)


@router.post("/jobs/{job_id}/telemetry", tags=["worker protocol"])
def upload_telemetry(
    job_id: str, body: TelemetryUpload, session: SessionDep, caller: WorkerCaller
) -> TelemetryAck:
    """Device samples taken during a job (any kind); a retried ``seq`` is a duplicate."""
    return probe_jobs.store_telemetry(session, job_id, body, caller)


@router.get("/jobs/{job_id}/telemetry", tags=["jobs"])
def get_telemetry(job_id: str, session: SessionDep, _: Reader) -> dict[str, Any]:
    return {"job_id": job_id, "samples": svc.job_telemetry(session, job_id)}


@router.put("/runs/{run_id}/annotation", tags=["runs"])
def put_annotation(
    run_id: str, body: svc.Annotation, session: SessionDep, _: Runner
) -> dict[str, Any]:
    """The model and device a run served with: its roofline operating points use them."""
    return svc.annotate(session, run_id, body)


@router.get("/runs/{run_id}/annotation", tags=["runs"])
def get_annotation(run_id: str, session: SessionDep, _: Reader) -> dict[str, Any]:
    return svc.get_annotation(session, run_id)


@router.get("/presets/models", tags=["capacity"])
def model_presets(_: Reader) -> dict[str, Any]:
    return {"items": [m.model_dump(mode="json") for m in MODEL_PRESETS.values()]}


@router.get("/presets/devices", tags=["capacity"])
def device_presets(_: Reader) -> dict[str, Any]:
    return {"items": [d.model_dump(mode="json") for d in DEVICE_PRESETS.values()]}


@router.get("/capacity", tags=["capacity"])
def capacity_get(
    _: Reader,
    model: str = "llama-3-8b",
    device: str | None = "h100-sxm",
    memory_gib: Annotated[float | None, Query(gt=0, le=svc.MAX_MEMORY_GIB)] = None,
    weight_dtype: str = "bf16",
    kv_dtype: str = "bf16",
    utilization: Annotated[float, Query(gt=0, le=1)] = 0.9,
    reserve_gib: Annotated[float, Query(ge=0, le=svc.MAX_MEMORY_GIB)] = 0.0,
    block_size: Annotated[int, Query(ge=1, le=1024)] = 16,
    context: Annotated[int | None, Query(ge=1, le=svc.MAX_TOKENS)] = None,
    concurrency: Annotated[int | None, Query(ge=1, le=svc.MAX_TOKENS)] = None,
    tp: Annotated[int, Query(ge=1, le=64)] = 1,
) -> dict[str, Any]:
    """How many requests of ``context`` fit, and what context fits at ``concurrency``, on
    ``tp`` GPUs (tensor parallel: weights and KV heads split across them)."""
    q = svc.CapacityQuery(
        model=model,
        device=device or None,
        memory_gib=memory_gib,
        weight_dtype=weight_dtype,
        kv_dtype=kv_dtype,
        utilization=utilization,
        reserve_gib=reserve_gib,
        block_size=block_size,
        context=context,
        concurrency=concurrency,
        tp=tp,
    )
    return svc.capacity(q)


@router.post("/capacity", tags=["capacity"])
def capacity_post(body: svc.CapacityQuery, _: Runner) -> dict[str, Any]:
    """The same with a full model config in the body (like every POST, it needs a token
    with the run scope)."""
    return svc.capacity(body)
