"""Probe pages: the probe list and detail, the Roofline, throughput-vs-batch, the capacity
planner and a job's telemetry."""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import APIRouter, HTTPException, Query, Request
from fastapi.responses import RedirectResponse, Response

from app.analysis.device_presets import DEVICE_PRESETS, preset_for_device_name
from app.analysis.model_presets import DTYPE_BYTES, MODEL_PRESETS
from app.services import probes as svc
from app.services.errors import ServiceError
from app.storage.db import session_scope
from app.web import probe_figures as pf
from app.web.context import principal_of, reads_allowed, render, sessions_of
from app.web.scriptjson import plotly_json

router = APIRouter(include_in_schema=False)


def _gate(request: Request) -> tuple[Any, Response | None]:
    principal = principal_of(request)
    if reads_allowed(request, principal):
        return principal, None
    return principal, RedirectResponse(f"/signin?next={request.url.path}", status_code=303)


def _js(fig: dict[str, Any]) -> str:
    return plotly_json(fig, default=str)


@router.get("/probes")
def probes_page(request: Request, kind: str | None = None) -> Response:
    principal, redirect = _gate(request)
    if redirect is not None:
        return redirect
    with session_scope(sessions_of(request)) as s:
        items = svc.list_views(s, kind=kind or None, limit=200)
    return render(
        request, "probes.html", {"nav": "probes", "items": items, "kind": kind}, principal=principal
    )


@router.get("/probes/{probe_id}")
def probe_page(request: Request, probe_id: str) -> Response:
    principal, redirect = _gate(request)
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
        {"nav": "probes", "p": p, "r": res, "figures": figures},
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
    principal, redirect = _gate(request)
    if redirect is not None:
        return redirect
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
    errors: list[str] = []
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
        },
        principal=principal,
    )


@router.get("/throughput")
def throughput_page(
    request: Request,
    probe: Annotated[list[str] | None, Query()] = None,
    run: Annotated[list[str] | None, Query()] = None,
) -> Response:
    """batch_scaling probes (``probe``, or the newest) and runs of a concurrency sweep."""
    principal, redirect = _gate(request)
    if redirect is not None:
        return redirect
    with session_scope(sessions_of(request)) as s:
        d = svc.scaling_data(s, probe, run)
        ceil = svc.roofline_data(s, device_name=None)
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
        {"nav": "probes", "d": d, "figures": figs, "balance": balance},
        principal=principal,
    )


@router.get("/capacity")
def capacity_page(
    request: Request,
    model: str = "llama-3-8b",
    device: str = "h100-sxm",
    memory_gib: str = "",
    weight_dtype: str = "bf16",
    kv_dtype: str = "bf16",
    utilization: str = "0.9",
    reserve_gib: str = "0",
    block_size: str = "16",
    context: str = "8192",
    concurrency: str = "16",
) -> Response:
    principal, redirect = _gate(request)
    if redirect is not None:
        return redirect
    form = dict(
        model=model,
        device=device,
        memory_gib=memory_gib,
        weight_dtype=weight_dtype,
        kv_dtype=kv_dtype,
        utilization=utilization,
        reserve_gib=reserve_gib,
        block_size=block_size,
        context=context,
        concurrency=concurrency,
    )
    out, error = None, None
    try:
        q = svc.CapacityQuery(
            model=model,
            device=device or None,
            memory_gib=float(memory_gib) if memory_gib else None,
            weight_dtype=weight_dtype,
            kv_dtype=kv_dtype,
            utilization=float(utilization),
            reserve_gib=float(reserve_gib or 0),
            block_size=int(block_size),
            context=int(context) if context else None,
            concurrency=int(concurrency) if concurrency else None,
        )
        out = svc.capacity(q)
    except ServiceError as e:
        error = e.detail
    except ValueError as e:
        error = (
            str(e).splitlines()[0]
            if len(str(e).splitlines()) < 2
            else " ".join(str(e).splitlines()[:3])
        )
    status = 422 if error else 200
    return render(
        request,
        "capacity.html",
        {
            "nav": "probes",
            "form": form,
            "out": out,
            "error": error,
            "models": MODEL_PRESETS,
            "devices": DEVICE_PRESETS,
            "dtypes": list(DTYPE_BYTES),
        },
        principal=principal,
        status_code=status,
    )


@router.get("/jobs/{job_id}/telemetry")
def telemetry_page(request: Request, job_id: str) -> Response:
    principal, redirect = _gate(request)
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
