"""Probe pages: the probe list and detail, the Roofline, throughput-vs-batch, the capacity
planner and a job's telemetry."""

from __future__ import annotations

import json
import math
from typing import Annotated, Any

from fastapi import APIRouter, HTTPException, Query, Request
from fastapi.responses import Response
from pydantic import ValidationError

from app.analysis import capacity as cap
from app.analysis.device_presets import DEVICE_PRESETS, preset_for_device_name
from app.analysis.model_presets import DTYPE_BYTES, MODEL_PRESETS, ModelConfig
from app.analysis.probe_spread import SPREAD_LIMIT
from app.figures import probes as pf
from app.figures.scriptjson import plotly_json
from app.services import probes as svc
from app.services.errors import ServiceError
from app.storage import probes as probe_repo
from app.storage.db import session_scope
from app.web import pickers
from app.web.context import read_gate, render, sessions_of

router = APIRouter(include_in_schema=False)

MAX_PICKED = 100  # runs (and sweeps) one Roofline or throughput-vs-batch page takes


def _js(fig: dict[str, Any]) -> str:
    return plotly_json(fig, default=str)


@router.get("/probes")
def probes_page(request: Request, kind: str | None = None) -> Response:
    principal, redirect = read_gate(request)
    if redirect is not None:
        return redirect
    with session_scope(sessions_of(request)) as s:
        items = svc.list_views(s, kind=kind or None, limit=200)
    return render(
        request, "probes.html", {"nav": "probes", "items": items, "kind": kind}, principal=principal
    )


@router.get("/probes/{probe_id}")
def probe_page(request: Request, probe_id: str) -> Response:
    principal, redirect = read_gate(request)
    if redirect is not None:
        return redirect
    with session_scope(sessions_of(request)) as s:
        try:
            p = svc.get_view(s, probe_id)
        except ServiceError as e:
            raise HTTPException(e.status_code, e.detail) from None
    figures: dict[str, str] = {}
    if p["telemetry"]:
        figures["telemetry"] = _js(pf.telemetry_figure(p["telemetry"]))
    res = p.get("result") or {}
    if p["kind"] == "batch_scaling" and res.get("rows"):
        series = [
            {
                "label": p["name"] or p["id"],
                "rows": [r for r in res["rows"] if "error" not in r],
                "knee": res.get("knee") or {},
            }
        ]
        for k, fig in pf.scaling_figures(series, [], None).items():
            figures[k] = _js(fig)
    return render(
        request,
        "probe.html",
        {"nav": "probes", "p": p, "r": res, "figures": figures, "spread_limit": SPREAD_LIMIT},
        principal=principal,
    )


@router.get("/roofline")
def roofline_page(
    request: Request,
    device: str | None = None,
    datasheet: Annotated[list[str] | None, Query()] = None,
    run: Annotated[list[str] | None, Query()] = None,
    model: str | None = None,
    preset: str | None = None,
    dtype: str = "bf16",
) -> Response:
    """``device``: a probed device name; ``datasheet``: preset names to draw dashed;
    ``run``: runs whose operating points to show (their annotations), or with ``model``
    (and ``preset``, a device preset for MFU/MBU) one run annotated ad hoc."""
    principal, redirect = read_gate(request)
    if redirect is not None:
        return redirect
    errors: list[str] = []
    picked, errors = pickers.bad_ids([r for r in run or [] if r][:MAX_PICKED], "run")
    run = picked or None  # the picker's "(none)" is blank
    adhoc = None
    if model and run:
        ann = svc.Annotation(
            model=model,
            device=preset or None,
            weight_dtype=dtype,
            act_dtype=dtype,
            kv_dtype=dtype,
            compute_dtype=dtype,
        )
        adhoc = (run[0], ann)
    with session_scope(sessions_of(request)) as s:
        try:
            d = svc.roofline_data(
                s, device_name=device or None, datasheet=datasheet, run_ids=run, adhoc=adhoc
            )
        except ServiceError as e:
            if e.status_code == 404:
                raise HTTPException(404, e.detail) from None
            errors.append(e.detail)
            d = svc.roofline_data(s, device_name=device or None)
        choices = pickers.roofline_runs(s)
        placed = {rp.run_id for rp in d["operating_points"]}
        unplaced = [r for r in run or [] if r not in placed]
        known = {r.id for r in probe_repo.runs_by_id(s, unplaced)}
    for rid in unplaced:
        if rid not in known:
            errors.append(f"run: no run with id {rid[:64]!r}")
        elif not model:
            errors.append(f"model: run {rid[:64]!r} has no annotation: pick the model it served")
    ops = [(rp.label, op) for rp in d["operating_points"] for op in rp.points]
    notes = [f"{rp.label}: {n}" for rp in d["operating_points"] for n in rp.notes]
    fig = pf.roofline_figure(d["measured"], d["datasheets"], d["probe_points"], ops)
    return render(
        request,
        "roofline.html",
        {
            "nav": "probes",
            "d": d,
            "ops": ops,
            "notes": notes,
            "errors": errors,
            "figures": {"roofline": _js(fig)},
            "models": list(MODEL_PRESETS),
            "presets": DEVICE_PRESETS,
            "query": dict(request.query_params),
            "spread_limit": SPREAD_LIMIT,
            "run_choices": choices,
        },
        principal=principal,
        status_code=422 if errors else 200,
    )


@router.get("/throughput")
def throughput_page(
    request: Request,
    probe: Annotated[list[str] | None, Query()] = None,
    run: Annotated[list[str] | None, Query()] = None,
    sweep: Annotated[list[str] | None, Query()] = None,
) -> Response:
    """batch_scaling probes (``probe``, or the newest) and runs at several concurrencies:
    picked one by one (``run``) or a concurrency sweep's steps (``sweep``). An unknown id
    is named (422); a picked run that records no concurrency or throughput is noted."""
    principal, redirect = read_gate(request)
    if redirect is not None:
        return redirect
    errors: list[str] = []
    notes: list[str] = []
    picked_runs, bad_runs = pickers.bad_ids([r for r in run or [] if r][:MAX_PICKED], "run")
    picked_sweeps, bad_sweeps = pickers.bad_ids([w for w in sweep or [] if w][:MAX_PICKED], "sweep")
    errors += bad_sweeps + bad_runs
    with session_scope(sessions_of(request)) as s:
        run_ids = list(picked_runs)
        for sid in picked_sweeps:
            steps = pickers.sweep_step_runs(s, sid)
            if steps is None:
                errors.append(f"sweep: no sweep with id {sid[:64]!r}")
            else:
                run_ids += [r for r in steps if r not in run_ids]
        found = {r.id: r for r in probe_repo.runs_by_id(s, picked_runs)}
        for rid in picked_runs:
            row = found.get(rid)
            if row is None:
                errors.append(f"run: no run with id {rid[:64]!r}")
            elif not pickers.gives_batch_point(row):
                notes.append(
                    f"run {row.name or rid}: not plotted, it records no max_concurrency "
                    "or no output throughput"
                )
        d = svc.scaling_data(s, probe, run_ids[:MAX_PICKED])
        ceil = svc.roofline_data(s, device_name=None)
        choices = {
            "runs": pickers.batch_runs(s),
            "sweeps": pickers.concurrency_sweeps(s),
        }
    balance = None
    dev = next((x["device_name"] for x in d["series"] if x.get("device_name")), None)
    c = (ceil["measured"] or {}).get("ceilings") or {}
    if ceil["device_name"] == dev and c.get("bandwidth_bps") and (c.get("flops") or {}).get("bf16"):
        balance = c["flops"]["bf16"] / c["bandwidth_bps"]
    elif (sheet := preset_for_device_name(dev)) is not None:
        balance = sheet.balance("bf16")
    figs = {k: _js(v) for k, v in pf.scaling_figures(d["series"], d["sweep"], balance).items()}
    return render(
        request,
        "throughput.html",
        {
            "nav": "probes",
            "d": d,
            "figures": figs,
            "balance": balance,
            "choices": choices,
            "picked_runs": set(picked_runs),
            "picked_sweeps": set(picked_sweeps),
            "errors": errors,
            "notes": notes,
        },
        principal=principal,
        status_code=422 if errors else 200,
    )


CUSTOM_MODEL = "custom"
CAPACITY_DEFAULTS: dict[str, str] = {
    "model": "llama-3-8b",
    "hf_config": "",
    "params_b": "",
    "device": "h100-sxm",
    "memory_gib": "",
    "tp": "1",
    "weight_dtype": "bf16",
    "kv_dtype": "bf16",
    "utilization": "0.9",
    "reserve_gib": "0",
    "block_size": "16",
    "context": "8192",
    "concurrency": "16",
}
# form field -> (label, kind): "float" / "int"; blank means the default below
NUMBERS: dict[str, tuple[str, str]] = {
    "memory_gib": ("memory", "float"),
    "tp": ("GPUs (tensor parallel)", "int"),
    "utilization": ("memory utilization", "float"),
    "reserve_gib": ("reserve", "float"),
    "block_size": ("block size", "int"),
    "context": ("context", "int"),
    "concurrency": ("concurrency", "int"),
    "params_b": ("parameters", "float"),
}
BLANK: dict[str, float | int | None] = {
    "memory_gib": None,
    "tp": 1,
    "reserve_gib": 0.0,
    "context": None,
    "concurrency": None,
    "params_b": None,
}


def _numbers(form: dict[str, str], errors: dict[str, str]) -> dict[str, float | int | None]:
    """The numeric fields, each parsed on its own; a bad one gets a message in ``errors``."""
    out: dict[str, float | int | None] = {}
    for key, (label, kind) in NUMBERS.items():
        raw = form[key].strip()
        if not raw:
            if key in BLANK:
                out[key] = BLANK[key]
            else:
                errors[key] = f"{label}: give a value"
            continue
        try:
            out[key] = int(raw) if kind == "int" else float(raw)
        except ValueError:
            what = "a whole number" if kind == "int" else "a number"
            errors[key] = f"{label} must be {what}, not {raw[:40]!r}"
            continue
        if kind == "float" and not math.isfinite(float(raw)):
            errors[key] = f"{label} must be a finite number"
    return out


def _custom_model(
    raw: str, params_b: float | None, errors: dict[str, str]
) -> tuple[ModelConfig | None, list[str]]:
    """The model of a pasted config.json (``model_from_hf_config``) and its notes; None
    with a message in ``errors`` when the paste or the parameter count is unusable."""
    if not raw.strip():
        errors["hf_config"] = "paste the model's config.json (from its Hugging Face page)"
        return None, []
    try:
        cfg = json.loads(raw)
    except json.JSONDecodeError as e:
        errors["hf_config"] = f"not valid JSON: {e.msg} (line {e.lineno}, column {e.colno})"
        return None, []
    if params_b is not None and params_b <= 0:
        errors["params_b"] = "parameters must be positive (billions)"
        return None, []
    params = round(params_b * 1e9) if params_b is not None else None
    try:
        return cap.model_from_hf_config(cfg, name="custom", params=params)
    except ValueError as e:
        errors["params_b" if "parameter count" in str(e) else "hf_config"] = str(e)
        return None, []


def _pydantic_errors(e: ValidationError, errors: dict[str, str]) -> None:
    for err in e.errors():
        loc = [str(x) for x in err.get("loc") or ()]
        key = loc[0] if loc else "form"
        label = NUMBERS.get(key, (key.replace("_", " "), ""))[0]
        msg = str(err.get("msg") or "invalid").replace("Input should be", "must be")
        errors.setdefault(key if key in CAPACITY_DEFAULTS else "form", f"{label} {msg}")


@router.get("/capacity")
def capacity_page(request: Request) -> Response:
    """The capacity planner. Each bad field gets its own message beside it; a model that
    does not fit says so and by how much, instead of cards full of zeros."""
    principal, redirect = read_gate(request)
    if redirect is not None:
        return redirect
    form = {k: str(request.query_params.get(k, v)) for k, v in CAPACITY_DEFAULTS.items()}
    errors: dict[str, str] = {}
    nums = _numbers(form, errors)
    model: str | ModelConfig | None = form["model"]
    notes: list[str] = []
    if form["model"] == CUSTOM_MODEL:
        pb = nums.get("params_b")
        model, notes = _custom_model(
            form["hf_config"], float(pb) if pb is not None else None, errors
        )
    elif form["model"] not in MODEL_PRESETS:
        errors["model"] = f"unknown model {form['model']!r}"
    if form["device"] and form["device"] not in DEVICE_PRESETS:
        errors["device"] = f"unknown device {form['device']!r}"
    for key in ("weight_dtype", "kv_dtype"):
        if form[key] not in DTYPE_BYTES:
            errors[key] = f"unknown dtype {form[key]!r} (known: {', '.join(DTYPE_BYTES)})"
    out = None
    if not errors and model is not None:
        try:
            q = svc.CapacityQuery(
                model=model,
                device=form["device"] or None,
                memory_gib=nums["memory_gib"],
                weight_dtype=form["weight_dtype"],
                kv_dtype=form["kv_dtype"],
                utilization=nums["utilization"],  # type: ignore[arg-type]
                reserve_gib=nums["reserve_gib"],  # type: ignore[arg-type]
                block_size=nums["block_size"],  # type: ignore[arg-type]
                context=nums["context"],  # type: ignore[arg-type]
                concurrency=nums["concurrency"],  # type: ignore[arg-type]
                tp=nums["tp"],  # type: ignore[arg-type]
            )
            out = svc.capacity(q)
        except ValidationError as e:
            _pydantic_errors(e, errors)
        except ServiceError as e:
            loc = [str(x) for x in (e.loc or ())]
            key = loc[-1] if loc else "form"
            key = "weight_dtype" if key == "dtype" else key
            errors[key if key in CAPACITY_DEFAULTS else "form"] = e.detail
        except ValueError as e:
            errors["form"] = str(e)
    return render(
        request,
        "capacity.html",
        {
            "nav": "probes",
            "form": form,
            "out": out,
            "errors": errors,
            "model_notes": notes,
            "custom": CUSTOM_MODEL,
            "models": MODEL_PRESETS,
            "devices": DEVICE_PRESETS,
            "dtypes": list(DTYPE_BYTES),
        },
        principal=principal,
        status_code=422 if errors else 200,
    )


@router.get("/jobs/{job_id}/telemetry")
def telemetry_page(request: Request, job_id: str) -> Response:
    principal, redirect = read_gate(request)
    if redirect is not None:
        return redirect
    with session_scope(sessions_of(request)) as s:
        try:
            samples = svc.job_telemetry(s, job_id)
        except ServiceError as e:
            raise HTTPException(e.status_code, e.detail) from None
    figs = {"telemetry": _js(pf.telemetry_figure(samples))} if samples else {}
    return render(
        request,
        "telemetry.html",
        {"nav": "probes", "job_id": job_id, "samples": samples, "figures": figs},
        principal=principal,
    )
