"""The comparison page (/compare: 2 to 6 runs, or two sweeps, or runs against a named
baseline) and the sweep page (/sweeps/{id}); diagnosis notes on both."""

from __future__ import annotations

from typing import Annotated, Any

import anyio
from fastapi import APIRouter, Query, Request
from fastapi.responses import Response

from app.analysis.comparability import KEY_FIELDS
from app.figures import compare as fc
from app.figures.scriptjson import plotly_json
from app.services import compare as compare_svc
from app.services import sweeps as sweep_svc
from app.services.errors import Conflict, Invalid, NotFound
from app.storage import compare_repo
from app.storage.db import session_scope
from app.storage.jsonsafe import json_safe
from app.web import runs_view
from app.web.context import read_gate, render, sessions_of
from app.web.pickers import valid_id
from app.web.runs_page import report_warnings

router = APIRouter(include_in_schema=False)

MAX_IDS = compare_svc.MAX_RUNS
CDF_METRICS = compare_svc.LATENCY_METRICS
SLO_KEYS = {"ttft_ms": "ttft", "tpot_ms": "tpot", "e2el_ms": "e2el"}




def _json(fig: dict[str, Any]) -> str:
    return plotly_json(json_safe(fig))


def _split(ids: list[str] | None) -> list[str]:
    return [i.strip() for raw in ids or [] for i in raw.split(",") if i.strip()]


def _check_ids(ids: list[str], field: str) -> None:
    """Run or sweep ids as this server makes them (no NUL byte, no megabyte reaches a
    query); 422 naming ``field`` otherwise."""
    bad = [i for i in ids if not valid_id(i)]
    if bad:
        raise Invalid(f"{field}: not an id: {bad[0][:40]!r}", loc=("query", field))


def _label(run: dict[str, Any]) -> str:
    return str(run.get("name") or run["id"])


def _created(rs: compare_svc.RunSamples) -> str:
    return str(rs.run.get("created_at") or "")


def order_baseline_first(
    loaded: list[compare_svc.RunSamples], base: str | None
) -> tuple[list[compare_svc.RunSamples], str]:
    """The runs with the baseline first, and how it was chosen: the run the user picked
    (``base``), else the oldest run, never whichever the table happened to list first."""
    chosen = next((r for r in loaded if base and r.run["id"] == base), None)
    how = "chosen"
    if chosen is None:
        chosen = min(loaded, key=_created)
        how = "the oldest run; pick another below"
    return [chosen, *[r for r in loaded if r is not chosen]], how


def _warnings(rs: compare_svc.RunSamples) -> list[runs_view.TrustWarning]:
    return report_warnings(rs.report)


def _runs_context(
    request: Request, wanted: list[str], threshold_pct: float, alpha: float,
    variable: str | None, baseline: str | None, base: str | None = None,
) -> dict[str, Any]:  # fmt: skip
    sessions = sessions_of(request)
    missing: list[str] = []
    base_note = None
    if baseline:
        with session_scope(sessions) as s:
            b = compare_repo.current_baseline(s, baseline)
        if b is None or b.run_id is None:
            raise Invalid(f"no run baseline named {baseline!r}", loc=("query", "baseline"))
        if wanted and all(w == b.run_id for w in wanted):
            raise Invalid(
                f"baseline {baseline!r} is run {b.run_id}, the run given: pick another",
                loc=("query", "baseline"),
            )
        wanted = [b.run_id, *[w for w in wanted if w != b.run_id]]
        base_note = f"baseline {baseline!r} version {b.version}"
        base = b.run_id
    elif base and base not in wanted:
        wanted = [base, *wanted]
    loaded = []
    for rid in wanted[:MAX_IDS]:
        try:
            loaded.append(compare_svc.load_samples(sessions, rid))
        except NotFound:
            missing.append(rid)
    ctx: dict[str, Any] = {"missing": missing, "baseline_note": base_note, "result": None}
    if len(wanted) > MAX_IDS:
        ctx["too_many"] = f"only the first {MAX_IDS} runs are compared"
    if len(loaded) < 2:
        return ctx
    loaded, how = order_baseline_first(loaded, base)
    ctx["baseline_how"] = "saved baseline" if baseline else how
    ctx["run_warnings"] = {r.run["id"]: _warnings(r) for r in loaded}
    ctx["warned_ids"] = [rid for rid, w in ctx["run_warnings"].items() if w]
    ctx["all_ids"] = [r.run["id"] for r in loaded]
    result = compare_svc.compare_loaded(
        loaded, threshold_pct=threshold_pct, alpha=alpha, variable=variable
    )
    figures = {
        f"cdf_{key}": _json(
            fc.overlaid_cdf_figure(
                [(_label(r.run), r.samples_ms[key]) for r in loaded],
                title=f"{label} CDF",
                xtitle=f"{label} (ms)",
            )
        )
        for key, label in CDF_METRICS.items()
    }
    for i, pair in enumerate(result["pairs"]):
        cand = next(r for r in loaded if r.run["id"] == pair["candidate"])
        figures[f"delta_{i}"] = _json(
            fc.delta_figure(pair, title=f"{_label(cand.run)} vs baseline (% change, interval)")
        )
    ctx.update(result=json_safe(result), figures=figures)
    return ctx


@router.get("/compare")
async def compare_page(
    request: Request,
    ids: Annotated[list[str] | None, Query()] = None,
    sweeps: Annotated[list[str] | None, Query()] = None,
    baseline: str | None = None,
    base: str | None = None,
    threshold_pct: Annotated[float, Query(ge=0, le=1000)] = 5.0,
    alpha: Annotated[float, Query(gt=0, lt=1)] = 0.01,
    variable: str | None = None,
) -> Response:
    """Statistical comparison of runs or of two sweeps. The baseline: ``base`` (a run the
    user picked), a saved ``baseline`` (by name), else the oldest of the runs."""
    principal, redirect = read_gate(request)
    if redirect is not None:
        return redirect
    if variable is not None and variable not in KEY_FIELDS:
        variable = None
    wanted, sweep_ids = _split(ids), _split(sweeps)
    status_code = 200
    try:
        _check_ids(wanted, "ids")
        _check_ids(sweep_ids, "sweeps")
        _check_ids([base] if base else [], "base")
        if baseline is not None and (len(baseline) > 255 or "\x00" in baseline):
            raise Invalid("baseline: not a baseline name", loc=("query", "baseline"))
        if sweep_ids:
            ctx = await anyio.to_thread.run_sync(
                lambda: _sweeps_context(request, sweep_ids, threshold_pct, alpha, variable)
            )
        else:
            ctx = await anyio.to_thread.run_sync(
                lambda: _runs_context(
                    request, wanted, threshold_pct, alpha, variable, baseline, base or None
                )
            )
    except (Invalid, Conflict) as e:
        field = str(e.loc[-1]) if e.loc else None
        named = field is None or e.detail.startswith(f"{field}:")
        detail = e.detail if named else f"{field}: {e.detail}"
        ctx = {"missing": [], "result": None, "error": detail}
        status_code = e.status_code
    with session_scope(sessions_of(request)) as s:
        # a run comparison's baseline picker: the saved baselines that point at a run
        baselines = [b.name for b in compare_repo.list_baselines(s) if b.run_id is not None]
    ctx.update(
        nav="runs",
        ids=wanted,
        sweep_ids=sweep_ids,
        baseline=baseline,
        base=base,
        baselines=baselines,
        threshold_pct=threshold_pct,
        alpha=alpha,
        variable=variable,
        key_fields=KEY_FIELDS,
        metric_labels=CDF_METRICS,
    )
    return render(request, "compare.html", ctx, principal=principal, status_code=status_code)


def _sweeps_context(
    request: Request, sweep_ids: list[str], threshold_pct: float, alpha: float,
    variable: str | None,
) -> dict[str, Any]:  # fmt: skip
    sessions = sessions_of(request)
    summaries, missing = [], []
    for sid in sweep_ids[:MAX_IDS]:
        try:
            summ = sweep_svc.sweep_summary(sessions, sid)
        except NotFound:
            missing.append(sid)
            continue
        summaries.append(summ | {"label": summ.get("name") or summ["id"]})
    ctx: dict[str, Any] = {"missing": missing, "result": None, "sweeps": summaries}
    if not summaries:
        return ctx
    ctx["sweep_figures"] = sweep_figures(summaries)
    if len(summaries) >= 2:
        ctx["sweep_result"] = json_safe(
            compare_svc.compare_sweeps(
                sessions,
                summaries[0]["id"],
                summaries[1]["id"],
                threshold_pct=threshold_pct,
                alpha=alpha,
                variable=variable,
            )
        )
    return ctx


def sweep_figures(summaries: list[dict[str, Any]]) -> dict[str, str]:
    slos = summaries[0].get("slos_ms") or {}
    out = {
        f"sweep_{key}": _json(
            fc.sweep_latency_figure(
                summaries, key, title=f"{label} vs throughput", slo_ms=slos.get(SLO_KEYS[key])
            )
        )
        for key, label in (("ttft_ms", "TTFT"), ("tpot_ms", "TPOT"), ("e2el_ms", "E2E"))
    }
    out["sweep_tput"] = _json(fc.sweep_throughput_figure(summaries, title="throughput vs load"))
    for key, label in (("ttft_ms", "TTFT"), ("e2el_ms", "E2E")):
        out[f"sweep_load_{key}"] = _json(
            fc.sweep_latency_load_figure(
                summaries, key, title=f"{label} vs offered load", slo_ms=slos.get(SLO_KEYS[key])
            )
        )
    return out
