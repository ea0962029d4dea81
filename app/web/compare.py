"""The comparison page (/compare: 2 to 6 runs, or two sweeps, or runs against a named
baseline) and the sweep page (/sweeps/{id}); diagnosis notes on both. Each run is read
once from its stored summary with bounded samples (``app.services.compare``); more than
``MAX_IDS`` distinct runs (or sweeps) is a 422 naming the limit, before anything is read."""

from __future__ import annotations

from datetime import datetime
from typing import Annotated, Any, Literal

import anyio
from fastapi import APIRouter, Query, Request
from fastapi.responses import Response

from app.analysis.comparability import KEY_FIELDS
from app.analysis.compare import combine_verdicts
from app.analysis.metric_defs import Metric, metric, shown
from app.analysis.verdict import Issue
from app.figures import compare as fc
from app.figures.scriptjson import plotly_json
from app.services import compare as compare_svc
from app.services import compare_sets
from app.services import sweeps as sweep_svc
from app.services.errors import Conflict, Invalid, NotFound
from app.storage import compare_repo
from app.storage import repository as repo
from app.storage.db import session_scope
from app.storage.jsonsafe import json_safe
from app.web import runs_view
from app.web.context import read_gate, render, sessions_of
from app.web.pickers import valid_id
from app.web.runs_page import report_warnings

router = APIRouter(include_in_schema=False)

MAX_IDS = compare_svc.MAX_RUNS
OLDEST_SWEEP = "the oldest sweep; pick another below"


def _json(fig: dict[str, Any]) -> str:
    return plotly_json(json_safe(fig))


def _split(ids: list[str] | None) -> list[str]:
    """The ids given (commas split), each once, in their first order."""
    return compare_svc.unique_ids(
        [i.strip() for raw in ids or [] for i in raw.split(",") if i.strip()]
    )


def _check_count(ids: list[str], what: str) -> None:
    if len(ids) > MAX_IDS:
        raise Invalid(
            f"compare at most {MAX_IDS} {what} at once (got {len(ids)}): untick some and "
            "compare again",
            loc=("query", "ids" if what == "runs" else "sweeps"),
        )


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


def _warnings(rs: compare_svc.RunSamples) -> list[Issue]:
    return report_warnings(rs.run, rs.report)


def _runs_context(
    request: Request, wanted: list[str], threshold_pct: float, alpha: float,
    variable: str | None, baseline: str | None, base: str | None = None, basis: str = "run",
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
    _check_count(wanted, "runs")
    loaded = []
    for rid in wanted:
        try:
            loaded.append(compare_svc.load_samples(sessions, rid, basis=basis))
        except NotFound:
            missing.append(rid)
    ctx: dict[str, Any] = {"missing": missing, "baseline_note": base_note, "result": None}
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
                xtitle=metric(key).heading,
            )
        )
        for key, label in compare_svc.latency_labels().items()
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
    basis: Literal["run", "steady"] = "run",
) -> Response:
    """Statistical comparison of runs or of sweeps. The baseline: ``base`` (a run or sweep
    the user picked), a saved ``baseline`` (by name), else the oldest of them. ``basis``
    "steady": each run's (each step's) steady window."""
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
                lambda: _sweeps_context(
                    request,
                    sweep_ids,
                    threshold_pct,
                    alpha,
                    variable,
                    base or None,
                    baseline,
                    basis=basis,
                )
            )
        else:
            ctx = await anyio.to_thread.run_sync(
                lambda: _runs_context(
                    request, wanted, threshold_pct, alpha, variable, baseline, base or None, basis
                )
            )
    except (Invalid, Conflict) as e:
        field = str(e.loc[-1]) if e.loc else None
        named = field is None or e.detail.startswith(f"{field}:")
        detail = e.detail if named else f"{field}: {e.detail}"
        ctx = {"missing": [], "result": None, "error": detail}
        status_code = e.status_code
    with session_scope(sessions_of(request)) as s:
        # the baseline picker: the saved baselines that point at a sweep (comparing sweeps)
        # or at a run
        baselines = [
            b.name
            for b in compare_repo.list_baselines(s)
            if (b.sweep_id if sweep_ids else b.run_id) is not None
        ]
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
        basis=basis,
        basis_toggle=str(
            request.url.include_query_params(basis="run" if basis == "steady" else "steady")
        ),
        key_fields=KEY_FIELDS,
        metric_labels=compare_svc.latency_labels(),
    )
    return render(request, "compare.html", ctx, principal=principal, status_code=status_code)


def _sweeps_context(
    request: Request, sweep_ids: list[str], threshold_pct: float, alpha: float,
    variable: str | None, base: str | None = None, baseline: str | None = None,
    basis: str = "run",
) -> dict[str, Any]:  # fmt: skip
    """The sweeps' curves on shared charts and, for two or more, the baseline (``base``, a
    sweep the user picked, or a saved sweep ``baseline`` by name, else the oldest:
    ``compare_sets.choose_baseline``) against each other sweep step by step, each step's
    runs flagged as run comparisons flag runs."""
    sessions = sessions_of(request)
    base_note = None
    if baseline:
        with session_scope(sessions) as s:
            b = compare_repo.current_baseline(s, baseline)
        if b is None or b.sweep_id is None:
            raise Invalid(f"no sweep baseline named {baseline!r}", loc=("query", "baseline"))
        base, base_note = b.sweep_id, f"baseline {baseline!r} version {b.version}"
    if base and base not in sweep_ids:
        sweep_ids = [base, *sweep_ids]
    _check_count(sweep_ids, "sweeps")
    summaries, missing = [], []
    for sid in sweep_ids:
        try:
            summ = sweep_svc.sweep_summary(sessions, sid, steady=basis == "steady")
        except NotFound:
            missing.append(sid)
            continue
        summaries.append(summ | {"label": summ.get("name") or summ["id"]})
    ctx: dict[str, Any] = {
        "missing": missing, "result": None, "sweeps": summaries, "baseline_note": base_note,
    }  # fmt: skip
    if not summaries:
        return ctx
    created = {sm["id"]: datetime.fromisoformat(sm["created_at"]) for sm in summaries}
    picked = base if base in created else None
    base_id, others, how = compare_sets.choose_baseline(created, picked, what="sweeps")
    summaries.sort(key=lambda sm: sm["id"] != base_id)  # the baseline first (its colour)
    ctx["all_sweep_ids"] = [sm["id"] for sm in summaries]
    ctx["sweep_figures"] = sweep_figures(summaries, baseline=base_id if others else None)
    ctx["sweep_figure_keys"] = sweep_figure_keys()
    if not others:
        return ctx
    results = [
        json_safe(
            compare_svc.compare_sweeps(
                sessions, base_id, other, threshold_pct=threshold_pct, alpha=alpha,
                variable=variable, basis=basis,
            )
        )
        for other in others
    ]  # fmt: skip
    run_ids = {st[k] for r in results for st in r["steps"] for k in ("baseline", "candidate")}
    with session_scope(sessions) as s:
        rows = {rid: repo.get_run(s, rid) for rid in sorted(run_ids)}
        run_warnings = {rid: runs_view.run_warnings(row) for rid, row in rows.items()}
        run_names = {rid: row.name or rid for rid, row in rows.items()}
    shown_how = {compare_sets.OLDEST: OLDEST_SWEEP, compare_sets.CHOSEN: "chosen"}[how]
    ctx.update(
        sweep_base=base_id,
        sweep_base_how="saved baseline" if base_note is not None else shown_how,
        sweep_labels={sm["id"]: sm["label"] for sm in summaries},
        sweep_results=results,
        sweep_verdict=combine_verdicts([r["verdict"] for r in results]),
        sweep_flagged=_flagged_steps(results, run_warnings),
        run_warnings=run_warnings,
        run_names=run_names,
    )
    return ctx


def _flagged_steps(
    results: list[dict[str, Any]], warnings: dict[str, list[Issue]]
) -> list[dict[str, Any]]:
    """Each step run with a trust warning, once: its id, sweep and load (for the banner)."""
    out: dict[str, dict[str, Any]] = {}
    for r in results:
        for st in r["steps"]:
            for role in ("baseline", "candidate"):
                rid = st[role]
                if warnings.get(rid) and rid not in out:
                    out[rid] = {"run_id": rid, "sweep": r[role], "load": st["load"], "role": role}
    return list(out.values())


def sweep_figure_keys() -> list[str]:
    """The sweep charts' keys in the pages' order: throughput vs load, each latency vs the
    offered load, each latency vs throughput (``sweep_figures``)."""
    return [
        "sweep_tput",
        *(f"sweep_load_{m.key}" for m in shown("sweep_load")),
        *(f"sweep_{m.key}" for m in shown("sweep_figures")),
    ]


def sweep_steps_columns() -> list[tuple[str, str, str]]:
    """The sweep steps table's latency columns: (metric key, statistic, heading), p50 and
    p99 of each latency a sweep charts."""
    return [(m.key, st, f"{m.name} {st}") for m in shown("sweep_figures") for st in ("p50", "p99")]


def sweep_figures(
    summaries: list[dict[str, Any]], *, baseline: str | None = None
) -> dict[str, str]:
    """The sweep charts; ``baseline``: the id of the sweep the others are compared to (its
    legend entries say "(baseline)")."""
    slos = summaries[0].get("slos_ms") or {}

    def slo_of(m: Metric) -> float | None:
        return None if m.slo is None else slos.get(m.slo)

    out = {
        f"sweep_{m.key}": _json(
            fc.sweep_latency_figure(
                summaries, m.key, title=f"{m.name} vs throughput", slo_ms=slo_of(m),
                baseline=baseline,
            )
        )
        for m in shown("sweep_figures")
    }  # fmt: skip
    out["sweep_tput"] = _json(
        fc.sweep_throughput_figure(summaries, title="throughput vs load", baseline=baseline)
    )
    for m in shown("sweep_load"):
        out[f"sweep_load_{m.key}"] = _json(
            fc.sweep_latency_load_figure(
                summaries, m.key, title=f"{m.name} vs offered load",
                slo_ms=slo_of(m), baseline=baseline,
            )
        )  # fmt: skip
    return out
