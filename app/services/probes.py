"""Probes: store local (CLI) probes, and assemble what the probe pages, the roofline,
throughput-vs-batch and capacity views need (probe jobs: ``app.services.probe_jobs``).
Functions take the caller's ``Session`` and never commit it."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from pydantic import ConfigDict, Field
from sqlalchemy.orm import Session

from app.analysis import capacity as cap
from app.analysis import roofline as rl
from app.analysis.device_presets import (
    DEVICE_PRESETS,
    DevicePreset,
    device_preset,
    preset_for_device_name,
)
from app.analysis.metric_defs import OUTPUT_THROUGHPUT, TPOT, TTFT, headline_key
from app.analysis.model_presets import ModelConfig, dtype_bytes, model_preset
from app.analysis.probe_spread import is_noisy, spread_verdict
from app.probes.spec import ProbeSpec
from app.protocol.nul import NoNul
from app.services import hardware
from app.services.errors import Conflict, Invalid, NotFound
from app.services.probe_jobs import finish_probe
from app.storage import jobs as job_repo
from app.storage import probes as probe_repo
from app.storage.jobs import ACTIVE_STATES, TERMINAL_STATES
from app.storage.models import Job
from app.storage.models_probes import Probe, RunAnnotation

# ------------------------------------------------------------------------------ submit


def store_local(
    session: Session,
    spec: ProbeSpec,
    *,
    fingerprint: dict[str, Any] | None,
    result: dict[str, Any] | None,
    telemetry: list[dict[str, Any]],
    artifacts: list[tuple[str, str, bytes]],
    error: str | None,
    max_artifact_bytes: int,
) -> str:
    """A probe run in this process (``tokentrace probe run``), stored whole."""
    row = probe_repo.create_probe(
        session,
        kind=spec.kind,
        device=spec.device,
        params=spec.params,
        name=spec.name,
        status="running",
    )
    finish_probe(
        session,
        row,
        status="failed" if error else "succeeded",
        fingerprint=fingerprint,
        result=result,
        telemetry=telemetry,
        error=error,
        artifacts=artifacts,
        max_artifact_bytes=max_artifact_bytes,
    )
    return row.id


def job_telemetry(session: Session, job_id: str) -> list[dict[str, Any]]:
    if job_repo.get_job(session, job_id) is None:
        raise NotFound(f"no job with id {job_id!r}")
    return probe_repo.job_telemetry(session, job_id)


# ------------------------------------------------------------------------------- reads


def _effective(row: Probe, job: Job | None) -> tuple[str, str | None]:
    """A probe waiting on a job that ended without a result takes the job's state."""
    if row.status in ("succeeded", "failed") or job is None:
        return row.status, row.error
    if job.state in TERMINAL_STATES:
        state = "failed" if job.state == "succeeded" else job.state
        return state, job.error or row.error or f"the job ended ({job.state}) without a result"
    return ("running" if job.state in ACTIVE_STATES else "queued"), None


def probe_view(row: Probe, job: Job | None, *, full: bool = True) -> dict[str, Any]:
    status, error = _effective(row, job)
    fp = row.fingerprint or {}
    out: dict[str, Any] = {
        "id": row.id,
        "kind": row.kind,
        "device": row.device,
        "device_label": "CPU" if row.device == "cpu" else (fp.get("device_name") or "CUDA"),
        "device_name": fp.get("device_name"),
        "name": row.name,
        "job_id": row.job_id,
        "status": status,
        "error": error,
        "params": row.params,
        "created_at": row.created_at,
        "finished_at": row.finished_at,
    }
    # repeated measurements that disagree (app.analysis.probe_spread): None when steady
    out["spread"] = spread_verdict(row.result)
    if full:
        out |= {
            "fingerprint": row.fingerprint,
            "result": row.result,
            "telemetry": row.telemetry or [],
        }
    return out


def list_views(
    session: Session, *, kind: str | None = None, limit: int = 100, offset: int = 0
) -> list[dict[str, Any]]:
    rows = probe_repo.list_probes(session, kind=kind, limit=limit, offset=offset)
    jobs = probe_repo.jobs_by_id(session, [r.job_id for r in rows if r.job_id])
    return [probe_view(r, jobs.get(r.job_id or ""), full=False) for r in rows]


def get_view(session: Session, probe_id: str) -> dict[str, Any]:
    row = probe_repo.get_probe(session, probe_id)
    if row is None:
        raise NotFound(f"no probe with id {probe_id!r}")
    job = job_repo.get_job(session, row.job_id) if row.job_id else None
    view = probe_view(row, job)
    view["artifacts"] = probe_repo.artifact_index(session, probe_id)
    return view


def artifact(session: Session, probe_id: str, name: str) -> tuple[str, bytes]:
    if probe_repo.get_probe(session, probe_id) is None:
        raise NotFound(f"no probe with id {probe_id!r}")
    a = probe_repo.get_artifact(session, probe_id, name)
    if a is None:
        raise NotFound(f"probe {probe_id!r} has no artifact {name!r}")
    return a.content_type, a.data


def delete(session: Session, probe_id: str) -> None:
    row = probe_repo.get_probe(session, probe_id)
    if row is None:
        raise NotFound(f"no probe with id {probe_id!r}")
    job = job_repo.get_job(session, row.job_id) if row.job_id else None
    if job is not None and job.state in ACTIVE_STATES:
        raise Conflict(f"probe {probe_id!r} is {job.state} on a worker: wait for it to end")
    if job is not None and job.state == "queued":
        job_repo.transition(session, job.id, from_states=("queued",), state="cancelled")
    probe_repo.delete_probe(session, row)


# ------------------------------------------------------------------------ annotations


class Annotation(NoNul):
    """The model and device a serving run used. ``model``: a preset name or a full
    config; ``device``: a device preset name (its datasheet gives MFU and MBU)."""

    model_config = ConfigDict(extra="forbid")

    model: str | ModelConfig
    device: str | None = None
    weight_dtype: str = "bf16"
    act_dtype: str = "bf16"
    kv_dtype: str = "bf16"
    compute_dtype: str = Field("bf16", description="the dtype whose peak FLOP/s MFU uses")

    def resolved(self) -> tuple[ModelConfig, DevicePreset | None, rl.Dtypes]:
        try:
            m = model_preset(self.model) if isinstance(self.model, str) else self.model
        except ValueError as e:
            raise Invalid(str(e), loc=("body", "model")) from None
        try:
            d = device_preset(self.device) if self.device else None
        except ValueError as e:
            raise Invalid(str(e), loc=("body", "device")) from None
        try:
            dts = rl.Dtypes(
                weight=dtype_bytes(self.weight_dtype),
                act=dtype_bytes(self.act_dtype),
                kv=dtype_bytes(self.kv_dtype),
            )
            dtype_bytes(self.compute_dtype)
        except ValueError as e:
            raise Invalid(str(e), loc=("body", "dtypes")) from None
        return m, d, dts


def annotate(session: Session, run_id: str, ann: Annotation) -> dict[str, Any]:
    if not probe_repo.run_exists(session, run_id):
        raise NotFound(f"no run with id {run_id!r}")
    m, d, _ = ann.resolved()
    probe_repo.set_annotation(
        session,
        run_id,
        model=m.model_dump(mode="json"),
        device=d.name if d else None,
        dtypes={
            "weight": ann.weight_dtype,
            "act": ann.act_dtype,
            "kv": ann.kv_dtype,
            "compute": ann.compute_dtype,
        },
    )
    return get_annotation(session, run_id)


def get_annotation(session: Session, run_id: str) -> dict[str, Any]:
    row = probe_repo.get_annotation(session, run_id)
    if row is None:
        raise NotFound(f"run {run_id!r} has no annotation")
    return {"run_id": run_id, "model": row.model, "device": row.device, "dtypes": row.dtypes}


def annotation_of(
    row_model: dict[str, Any], device: str | None, dtypes: dict[str, Any]
) -> Annotation:
    return Annotation(
        model=ModelConfig.model_validate(row_model),
        device=device,
        weight_dtype=dtypes.get("weight", "bf16"),
        act_dtype=dtypes.get("act", "bf16"),
        kv_dtype=dtypes.get("kv", "bf16"),
        compute_dtype=dtypes.get("compute", "bf16"),
    )


@dataclass(frozen=True)
class RunPoints:
    run_id: str
    label: str
    points: list[rl.OperatingPoint]
    notes: list[str]


def run_points(run: Any, ann: Annotation) -> RunPoints:
    """Decode and prefill operating points of a finished run from its headline numbers:
    output throughput at its concurrency, and p50 TTFT for its input length."""
    m, d, dts = ann.resolved()
    spec = run.spec or {}
    summary = run.summary or {}
    label = run.name or run.id
    notes: list[str] = []
    peak = d.peak(ann.compute_dtype) if d else None
    bw = d.bandwidth_bps if d else None
    conc = spec.get("max_concurrency")
    tput = summary.get(OUTPUT_THROUGHPUT.key)
    inp, outp = spec.get("input_len"), spec.get("output_len")
    points: list[rl.OperatingPoint] = []
    try:
        if conc and tput and inp and outp:
            points.append(
                rl.decode_point(
                    m,
                    concurrency=int(conc),
                    input_len=int(inp),
                    output_len=int(outp),
                    output_tok_s=float(tput),
                    dtypes=dts,
                    peak_flops=peak,
                    bandwidth_bps=bw,
                )
            )
        else:
            notes.append(
                "no decode point: the run needs max_concurrency, input and output "
                "lengths and a measured output throughput"
            )
        ttft = summary.get(headline_key(TTFT, "p50"))
        if ttft and inp:
            points.append(
                rl.prefill_point(
                    m,
                    input_len=int(inp),
                    ttft_s=float(ttft) / 1e3,
                    dtypes=dts,
                    peak_flops=peak,
                    bandwidth_bps=bw,
                )
            )
    except ValueError as e:
        notes.append(str(e))
    return RunPoints(run.id, label, points, notes)


# --------------------------------------------------------------------------- roofline

UNKNOWN_HARDWARE_NOTE = (
    "MFU and MBU not quoted: the hardware this run used is unknown (no device in its "
    "annotation, no GPU on the worker that ran it: a simulator or a CPU, say)"
)


def _known_hardware_points(run: Any, ann: Annotation, annotated_device: str | None) -> RunPoints:
    """``run_points`` with MFU/MBU against the hardware the run is known to have used: the
    annotation's device, else the datasheet of its worker's GPU; none when neither is
    known (``ann.device`` from a form is a guess, not knowledge)."""
    device: str | None = annotated_device
    if device is None:
        gpus = hardware.worker_gpus(run.load_stats)
        sheet = preset_for_device_name(gpus[0]) if gpus else None
        device = sheet.name if sheet is not None else None
    if device is None:
        rp = run_points(run, ann.model_copy(update={"device": None}))
        return RunPoints(rp.run_id, rp.label, rp.points, [*rp.notes, UNKNOWN_HARDWARE_NOTE])
    if ann.device and ann.device != device:
        rp = run_points(run, ann.model_copy(update={"device": device}))
        note = f"MFU and MBU against {device}, the hardware the run used (not {ann.device})"
        return RunPoints(rp.run_id, rp.label, rp.points, [*rp.notes, note])
    return run_points(run, ann.model_copy(update={"device": device}))


def _succeeded(session: Session, kind: str, limit: int = 200) -> list[Probe]:
    return probe_repo.list_probes(session, kind=kind, status="succeeded", limit=limit)


def device_names(session: Session) -> list[str]:
    names: list[str] = []
    for p in _succeeded(session, "ceilings") + _succeeded(session, "linear"):
        n = (p.fingerprint or {}).get("device_name")
        if n and n not in names:
            names.append(n)
    return names


def roofline_data(
    session: Session,
    *,
    device_name: str | None,
    datasheet: list[str] | None = None,
    run_ids: list[str] | None = None,
    adhoc: tuple[str, Annotation] | None = None,
) -> dict[str, Any]:
    """Ceilings (measured first, datasheets dashed), probe points and operating points for
    one device (by its fingerprint name or a datasheet preset name; None: the newest
    ceilings probe's device, else the first datasheet preset). Without measured ceilings
    the device's datasheet roofs are drawn (``datasheet_only``). MFU and MBU are quoted
    only for runs whose hardware is known: the device of their annotation, else the
    datasheet of the GPU of the worker that ran them; never for a run on unknown
    hardware (a simulator, a CPU), whatever datasheet the form names."""
    ceil_probes = _succeeded(session, "ceilings")
    if device_name is None and ceil_probes:
        device_name = (ceil_probes[0].fingerprint or {}).get("device_name")
    if device_name is None and not ceil_probes:
        device_name = next(iter(DEVICE_PRESETS))
    measured = next(
        (p for p in ceil_probes if (p.fingerprint or {}).get("device_name") == device_name), None
    )
    sheets: list[DevicePreset] = []
    if datasheet:
        for n in datasheet:
            try:
                sheets.append(device_preset(n))
            except ValueError as e:
                raise Invalid(str(e), loc=("query", "datasheet")) from None
    else:
        guess = (
            DEVICE_PRESETS[device_name.lower()]
            if device_name and device_name.lower() in DEVICE_PRESETS
            else preset_for_device_name(device_name)
        )
        sheets = [guess] if guess else []
    linear = [
        p
        for p in _succeeded(session, "linear")
        if (p.fingerprint or {}).get("device_name") == device_name
    ]
    probe_points: list[dict[str, Any]] = []
    for p in linear[:5]:
        res = p.result or {}
        for label, row in (res.get("shapes") or {}).items():
            probe_points.append({"probe_id": p.id, "label": label, **row, "noisy": is_noisy(row)})
        for row in res.get("sweep") or []:
            label = f"sweep M={row['m']}"
            probe_points.append({"probe_id": p.id, "label": label, **row, "noisy": is_noisy(row)})
    ops: list[RunPoints] = []
    runs = probe_repo.runs_by_id(session, run_ids) if run_ids else []
    anns: dict[str, RunAnnotation | None] = {
        r.id: probe_repo.get_annotation(session, r.id) for r in runs
    }
    if not run_ids:
        for r, a in probe_repo.annotated_runs(session, limit=20):
            runs.append(r)
            anns[r.id] = a
    for r in runs:
        found_ann = anns.get(r.id)
        if found_ann is not None:
            stored = annotation_of(found_ann.model, found_ann.device, found_ann.dtypes)
            ops.append(_known_hardware_points(r, stored, found_ann.device))
    if adhoc is not None:
        rid, ann = adhoc
        found = probe_repo.runs_by_id(session, [rid])
        if not found:
            raise NotFound(f"no run with id {rid!r}")
        stored_ann = probe_repo.get_annotation(session, rid)
        known = stored_ann.device if stored_ann is not None else None
        ops = [p for p in ops if p.run_id != rid] + [_known_hardware_points(found[0], ann, known)]
    return {
        "device_name": device_name,
        "datasheet_only": measured is None and bool(sheets),
        "measured": None
        if measured is None
        else {
            "probe_id": measured.id,
            "label": "CPU" if measured.device == "cpu" else device_name,
            "ceilings": (measured.result or {}).get("ceilings") or {},
            "spread": spread_verdict(measured.result),
        },
        "datasheets": sheets,
        "probe_points": probe_points,
        "operating_points": ops,
        "devices": device_names(session),
        "presets": list(DEVICE_PRESETS),
    }


# -------------------------------------------------------------------- throughput vs batch


def scaling_data(
    session: Session, probe_ids: list[str] | None, run_ids: list[str] | None
) -> dict[str, Any]:
    """batch_scaling probes (named, or the newest five) and runs as a concurrency sweep
    (concurrency from each run's spec)."""
    if probe_ids:
        rows = [probe_repo.get_probe(session, i) for i in probe_ids]
        probes = [p for p in rows if p is not None and p.status == "succeeded"]
    else:
        probes = _succeeded(session, "batch_scaling", limit=5)
    series = []
    for p in probes:
        res = p.result or {}
        where = "CPU" if p.device == "cpu" else (p.fingerprint or {}).get("device_name")
        series.append(
            {
                "probe_id": p.id,
                "label": f"{p.name or p.id} ({where})",
                "rows": [r for r in res.get("rows") or [] if "error" not in r],
                "knee": res.get("knee") or {},
                "device_name": (p.fingerprint or {}).get("device_name"),
            }
        )
    sweep = []
    for r in probe_repo.runs_by_id(session, run_ids or []):
        spec, summ = r.spec or {}, r.summary or {}
        if spec.get("max_concurrency") and summ.get(OUTPUT_THROUGHPUT.key):
            c = int(spec["max_concurrency"])
            t = float(summ[OUTPUT_THROUGHPUT.key])
            sweep.append(
                {
                    "run_id": r.id,
                    "batch": c,
                    "tokens_per_s": t,
                    "per_request_tokens_per_s": t / c,
                    "tpot_ms": summ.get(headline_key(TPOT, "p50")),  # the probe rows' field
                }
            )
    sweep.sort(key=lambda x: int(x["batch"] or 0))
    return {"series": series, "sweep": sweep}


# ---------------------------------------------------------------------------- capacity


MAX_MEMORY_GIB = 1024.0**2  # 1 PiB: beyond it the arithmetic overflows to inf (a 500)
MAX_TOKENS = 2**31 - 1  # context lengths and concurrencies


class CapacityQuery(NoNul):
    model_config = ConfigDict(extra="forbid")

    model: str | ModelConfig = "llama-3-8b"
    device: str | None = "h100-sxm"
    memory_gib: float | None = Field(
        None, gt=0, le=MAX_MEMORY_GIB, description="overrides the device's memory"
    )
    weight_dtype: str = "bf16"
    kv_dtype: str = "bf16"
    utilization: float = Field(0.9, gt=0, le=1)
    reserve_gib: float = Field(0.0, ge=0, le=MAX_MEMORY_GIB)
    block_size: int = Field(16, ge=1, le=1024)
    context: int | None = Field(None, ge=1, le=MAX_TOKENS)
    concurrency: int | None = Field(None, ge=1, le=MAX_TOKENS)
    tp: int = Field(1, ge=1, le=64, description="tensor-parallel size: GPUs the model spans")


def capacity(q: CapacityQuery) -> dict[str, Any]:
    try:
        m = model_preset(q.model) if isinstance(q.model, str) else q.model
    except ValueError as e:
        raise Invalid(str(e), loc=("query", "model")) from None
    mem: float | None = q.memory_gib * cap.GiB if q.memory_gib else None
    dev = None
    if q.device:
        try:
            dev = device_preset(q.device)
        except ValueError as e:
            raise Invalid(str(e), loc=("query", "device")) from None
        mem = mem or float(dev.memory_bytes)
    if mem is None:
        raise Invalid("give a device preset or memory_gib", loc=("query", "memory_gib"))
    try:
        wb, kb = dtype_bytes(q.weight_dtype), dtype_bytes(q.kv_dtype)
    except ValueError as e:
        raise Invalid(str(e), loc=("query", "dtype")) from None
    problem = cap.tp_problem(m, q.tp)
    if problem is not None:
        raise Invalid(problem.removeprefix("tp: "), loc=("query", "tp"))
    p = cap.plan(
        m,
        device_memory_bytes=mem,
        weight_bytes=wb,
        kv_bytes=kb,
        utilization=q.utilization,
        reserve_bytes=q.reserve_gib * cap.GiB,
        block_size=q.block_size,
        context=q.context,
        concurrency=q.concurrency,
        tp=q.tp,
    )
    return {
        "model": m.model_dump(mode="json"),
        "device": dev.name if dev else None,
        "plan": p.to_dict(),
    }
