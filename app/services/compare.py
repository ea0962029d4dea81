"""Comparisons: read the samples of stored runs (or sweeps), check comparability, run the
statistics of ``app.analysis.compare`` and attach diagnosis notes. No SQL, no arithmetic
of its own beyond arranging the inputs.

A run is read from its stored page summary (``run_summaries``), never from its events: the
report, the per-request values of the compared metrics (``Metric.views`` "compare": TTFT,
TPOT, E2E; the diagnosis and the comparability key) and a bounded, seeded sample of each
compared pooled metric (the ITL gaps). Each metric's samples are bounded
(``SAMPLE_MAX`` per run: ``analysis.compare.bounded``), so a comparison holds a few MB
whatever the runs' sizes; a run still queued or running is refused (409: it has no
summary yet). At most ``MAX_RUNS`` runs at once, each once."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
import numpy.typing as npt
from sqlalchemy.orm import Session, sessionmaker

from app.analysis import diagnosis
from app.analysis.comparability import check, comparability_key
from app.analysis.compare import (
    COMPARE_PERCENTILES,
    SAMPLE_MAX,
    SAMPLE_SEED,
    CompareOptions,
    FullStats,
    MetricComparison,
    Verdict,
    bounded,
    combine_verdicts,
    compare_error_rates,
    compare_samples,
    relative,
)
from app.analysis.metric_defs import TPOT, TTFT, Metric, shown
from app.analysis.percentiles import percentile, percentile_key
from app.analysis.request_columns import RequestColumns, request_columns
from app.analysis.verdict import run_trust_issues
from app.domain import RunStatus, RunTrace
from app.services import hardware, run_summaries
from app.services import runs as run_svc
from app.services.errors import Conflict, Invalid, NotFound
from app.storage import compare_repo
from app.storage import repository as repo
from app.storage.db import session_scope

F64 = npt.NDArray[np.float64]
MIN_RUNS, MAX_RUNS = 2, 6
POOLED_NOTE = (
    "{label} samples are pooled per {per}: gaps within one request are not independent, so "
    "its rank-test p-value is optimistic"
)


@dataclass(frozen=True, slots=True)
class RunSamples:
    """What a comparison reads of one run."""

    run: dict[str, Any]
    report: dict[str, Any]
    samples_ms: dict[str, F64]  # per metric: every finite sample, or SAMPLE_MAX of them
    full: dict[str, FullStats]  # per subsampled metric: its count and exact percentiles
    key: dict[str, Any]
    sweep_id: str | None
    diagnosis: list[dict[str, str]]
    weight_floor_ms: float | None = None  # the roofline's TPOT floor (run annotation)
    device: str = hardware.DEFAULT_DEVICE_TEXT


def latency_metrics() -> list[Metric]:
    """The distributions a comparison judges, in order."""
    return [m for m in shown("compare") if m.aggregation != "per_run"]


def scalar_metrics() -> list[Metric]:
    """The one-number-per-run metrics a comparison shows beside them."""
    return [m for m in shown("compare") if m.aggregation == "per_run"]


def latency_labels() -> dict[str, str]:
    """Metric key -> label of the distributions a comparison judges (its CDFs), in order."""
    return {m.key: m.label for m in latency_metrics()}


def _request_samples(cols: RequestColumns) -> tuple[dict[str, F64], F64, F64, F64]:
    """The compared per-request metrics' samples (ms; all NaN where the run did not record
    one) and (sent, input, output) of the valid requests."""
    nan = np.full(cols.n_requests, np.nan)
    out: dict[str, F64] = {}
    for m in latency_metrics():
        if m.aggregation == "per_request":
            got = cols.ms(m.key)
            out[m.key] = nan if got is None else got
    ok = cols.valid
    inp = np.where(ok & (cols.input_tokens >= 0), cols.input_tokens, -1).astype(np.float64)
    outp = np.where(ok, cols.n_tokens, -1).astype(np.float64)
    sent = np.where(ok, cols.sent_ns, -1).astype(np.float64)
    return out, sent, inp, outp


def _measured_p50(values: F64) -> float | None:
    return percentile(values[values >= 0], 50)


def _exact(report: dict[str, Any], key: str) -> dict[float, float | None]:
    """The run's exact percentiles of ``key`` (its report, from every sample)."""
    d = report["metrics"].get(key)
    if not isinstance(d, dict):
        return {}
    return {p: d.get(percentile_key(p)) for p in COMPARE_PERCENTILES}


def _bounded_samples(
    summary: run_summaries.RunSummary, report: dict[str, Any], per_request: dict[str, F64],
    sample_max: int,
) -> tuple[dict[str, F64], dict[str, FullStats]]:  # fmt: skip
    """Each metric's samples, at most ``sample_max`` (a seeded subsample past it, with the
    exact count and percentiles beside it). A pooled metric (ITL): the summary's stored
    sample (already at most ``ITL_SAMPLE_MAX`` of the run's ``sample_counts`` samples)."""
    samples: dict[str, F64] = {}
    full: dict[str, FullStats] = {}
    stored = summary.samples or {}
    pooled = {
        m.key: stored.get(m.key, np.zeros(0)) if not summary.summary_only else np.zeros(0)
        for m in latency_metrics()
        if m.aggregation != "per_request"
    }
    counts = summary.sample_counts
    for key, values in (per_request | pooled).items():
        samples[key], n = bounded(values, sample_max, SAMPLE_SEED)
        n = max(n, counts.get(key, 0))
        if samples[key].shape[0] < n:
            full[key] = FullStats(n, _exact(report, key))
    return samples, full


def _refuse_active(run: dict[str, Any]) -> None:
    status = run.get("status")
    if status in (RunStatus.QUEUED, RunStatus.RUNNING):
        shown = status.value if isinstance(status, RunStatus) else str(status)
        raise Conflict(
            f"run {run['id']!r} is {shown}: compare it once it has finished",
            loc=("query", "ids"),
        )


# what a comparison reads of each run: all of it, or its steady window
BASES = ("run", "steady")


def _steady(
    run: dict[str, Any], report: dict[str, Any], cols: RequestColumns
) -> tuple[dict[str, Any], npt.NDArray[np.bool_]]:
    """The report with the steady window's metrics in place of the whole run's (labelled
    ``basis: steady``) and the requests that start inside the window; 422 naming ``basis``
    for a run without one."""
    block = report.get("steady") or {}
    window = block.get("window")
    if not isinstance(window, dict):
        why = block.get("reason") or "not computed"
        raise Invalid(
            f"basis: run {run['id']!r} has no steady window ({why})", loc=("query", "basis")
        )
    keep = (cols.sent_ns >= int(window["start_ns"])) & (cols.sent_ns <= int(window["end_ns"]))
    return report | {"metrics": block["metrics"], "basis": "steady"}, keep


def load_samples(
    sessions: sessionmaker[Session],
    run_id: str,
    *,
    sample_max: int = SAMPLE_MAX,
    basis: str = "run",
) -> RunSamples:
    """A finished run's report, bounded latency samples (ms), diagnosis and comparability
    key, from its stored summary (computed and stored first when missing or stale).
    ``basis`` "steady": the steady window's figures and the samples of the requests that
    start inside it (``analysis.steady``); a pooled metric (ITL) has no such samples: not
    compared there."""
    with session_scope(sessions) as s:
        row = repo.find_run(s, run_id)
        if row is None:
            raise NotFound(f"no run with id {run_id!r}")
        run = run_svc.run_dict(row)
        step = compare_repo.step_of_run(s, run_id)
        floor_ms, device = hardware.roofline_floor(s, run_id, row.load_stats)
        hw = hardware.run_hardware(s, run_id, row.load_stats)
        target = row.target_url
    _refuse_active(run)
    summary = run_summaries.page_summary(sessions, run_id, itl_sample=True)
    report = run_svc.summary_report(run, summary)
    per_request, sent, inp, outp = _request_samples(summary.columns)
    steady = basis == "steady"
    if steady:
        report, keep = _steady(run, report, summary.columns)
        per_request = {k: v[keep] for k, v in per_request.items()}
        sent, inp, outp = sent[keep], inp[keep], outp[keep]
    notes = _diagnose(report, per_request, sent, inp, outp, floor_ms, device)
    key = comparability_key(
        run.get("spec") or {},
        measured_input_p50=_measured_p50(inp),
        measured_output_p50=_measured_p50(outp),
        hardware=hw,
        dataset_source=(row.load_stats or {}).get("dataset_source"),
        url=target,
        load_stats=row.load_stats,
    )
    del sent, inp, outp
    samples, full = _bounded_samples(summary, report, per_request, sample_max)
    if steady:  # the pooled samples are the whole run's: none for the window
        for m in latency_metrics():
            if m.aggregation != "per_request":
                samples[m.key] = np.zeros(0)
                full.pop(m.key, None)
    del summary, per_request
    sweep_id = step.sweep_id if step else None
    return RunSamples(run, report, samples, full, key, sweep_id, notes, floor_ms, device)


def trace_diagnosis(
    run: dict[str, Any],
    trace: RunTrace,
    report: dict[str, Any],
    *,
    weight_floor_ms: float | None = None,
    device: str = hardware.DEFAULT_DEVICE_TEXT,
) -> list[dict[str, str]]:
    """Diagnosis notes of a run already loaded (the run page's trace and report)."""
    return columns_diagnosis(
        run, request_columns(trace), report, weight_floor_ms=weight_floor_ms, device=device
    )


def columns_diagnosis(
    run: dict[str, Any],
    cols: RequestColumns,
    report: dict[str, Any],
    *,
    weight_floor_ms: float | None = None,
    device: str = hardware.DEFAULT_DEVICE_TEXT,
) -> list[dict[str, str]]:
    """Diagnosis notes from the run's per-request values (the rules read no ITL sample)."""
    samples, sent, inp, outp = _request_samples(cols)
    return _diagnose(report, samples, sent, inp, outp, weight_floor_ms, device)


def run_diagnosis(rs: RunSamples) -> list[dict[str, str]]:
    """Diagnosis notes of one run (SPEC §7), as ``load_samples`` found them."""
    return list(rs.diagnosis)


def _diagnose(
    report: dict[str, Any], samples: dict[str, F64], sent_ns: F64, input_tokens: F64,
    output_tokens: F64, weight_floor_ms: float | None, device: str,
) -> list[dict[str, str]]:  # fmt: skip
    """Diagnosis notes of one run from every request's values (SPEC §7); the roofline rule
    when the run's annotation gives a weight-read floor (``hardware.roofline_floor``)."""
    m = report["metrics"]
    reqs = m.get("requests") or {}
    tpot = m.get(TPOT.key) or {}
    notes = diagnosis.run_notes(
        input_tokens=input_tokens,
        output_tokens=output_tokens,
        sent_ns=np.where(sent_ns >= 0, sent_ns, np.nan),
        ttft_ms=samples[TTFT.key],
        tpot_ms=samples[TPOT.key],
        error_rate=m.get("error_rate"),
        sent=int(reqs.get("sent") or 0),
        tpot_p50_ms=tpot.get("p50") if isinstance(tpot, dict) else None,
        weight_floor_ms=weight_floor_ms,
        device=device,
    )
    return [n.to_dict() for n in notes]


def _options(threshold_pct: float, alpha: float, seed: int = 0) -> CompareOptions:
    try:
        return CompareOptions(threshold=threshold_pct / 100.0, alpha=alpha, seed=seed)
    except ValueError as e:
        field = "threshold_pct" if "threshold" in str(e) else "alpha"
        raise Invalid(str(e), loc=("query", field)) from None


def _pair(base: RunSamples, cand: RunSamples, opts: CompareOptions) -> dict[str, Any]:
    metrics: dict[str, MetricComparison] = {}
    for lm in latency_metrics():
        key, offset = lm.key, lm.compare_seed or 0
        o = CompareOptions(opts.threshold, opts.alpha, opts.ps, opts.resamples, opts.seed + offset)
        mc = compare_samples(
            key,
            base.samples_ms[key],
            cand.samples_ms[key],
            o,
            baseline_full=base.full.get(key),
            candidate_full=cand.full.get(key),
        )
        if lm.aggregation != "per_request" and mc.rank_test is not None:
            mc.notes.append(POOLED_NOTE.format(label=lm.label, per=lm.per))
        metrics[key] = mc
    bm, cm = base.report["metrics"], cand.report["metrics"]
    br, cr = bm.get("requests") or {}, cm.get("requests") or {}
    err = compare_error_rates(
        int(br.get("failed") or 0),
        int(br.get("sent") or 0),
        int(cr.get("failed") or 0),
        int(cr.get("sent") or 0),
        opts,
    )
    verdicts: dict[str, Verdict] = {k: v.verdict for k, v in metrics.items()}
    verdicts["error_rate"] = err.verdict
    scalars = {
        k: {
            "baseline": bm.get(k),
            "candidate": cm.get(k),
            "rel_delta": relative(bm.get(k), cm.get(k)),
        }
        for k in (sm.key for sm in scalar_metrics())
    }
    return {
        "baseline": base.run["id"],
        "candidate": cand.run["id"],
        "metrics": {k: v.to_dict() for k, v in metrics.items()},
        "error_rate": err.to_dict(),
        "throughput": scalars,
        "verdicts": verdicts,
        "verdict": combine_verdicts(list(verdicts.values())),
    }


def run_trust(rs: RunSamples) -> list[str]:
    """Why the run's figures cannot be trusted (``run_trust_issues``: client-limited, failed,
    lost requests, over its error bound), from what the comparison loaded; empty when none."""
    err = rs.report["metrics"].get("error_rate")
    rate = float(err) if isinstance(err, int | float) and not isinstance(err, bool) else None
    return run_trust_issues(rs.run, error_rate=rate)


def _run_entry(rs: RunSamples) -> dict[str, Any]:
    return {
        "id": rs.run["id"],
        "name": rs.run.get("name"),
        "status": str(rs.run.get("status")),
        "model": (rs.run.get("spec") or {}).get("model"),
        "sweep_id": rs.sweep_id,
        "headline": run_svc.headline(rs.report),
        "key": rs.key,
        "diagnosis": list(rs.diagnosis),
        "trust_issues": run_trust(rs),
    }


def unique_ids(ids: list[str]) -> list[str]:
    """``ids`` without repeats, in their first order (a run is compared once)."""
    return list(dict.fromkeys(ids))


def _check_ids(ids: list[str]) -> None:
    if not MIN_RUNS <= len(ids) <= MAX_RUNS:
        raise Invalid(
            f"compare {MIN_RUNS} to {MAX_RUNS} runs at once (got {len(ids)})", loc=("query", "ids")
        )
    if len(set(ids)) != len(ids):
        raise Invalid("a run appears twice in the comparison", loc=("query", "ids"))


def _method(opts: CompareOptions, threshold_pct: float, alpha: float) -> dict[str, str]:
    return {
        "percentile_ci": f"bootstrap of the difference, {opts.resamples} resamples, "
        f"level {1 - alpha:g}",
        "rank_test": "Mann-Whitney U, two-sided, normal approximation with tie and "
        "continuity correction",
        "rule": f"regressed/improved when |delta| >= {threshold_pct:g}% and the interval "
        f"excludes 0 (and, at p50, Mann-Whitney p < {alpha:g})",
        "samples": f"at most {SAMPLE_MAX:,} samples of a metric per run: past that, the "
        f"interval, the rank test and the CDF use a seeded random subsample (seed "
        f"{SAMPLE_SEED}) and the percentiles shown are the run's exact ones",
    }


def compare_loaded(
    runs: list[RunSamples],
    *,
    threshold_pct: float = 5.0,
    alpha: float = 0.01,
    variable: str | None = None,
    seed: int = 0,
) -> dict[str, Any]:
    """The first run (baseline) against each other one, from loaded samples."""
    _check_ids([r.run["id"] for r in runs])
    opts = _options(threshold_pct, alpha, seed)
    try:
        comp = check([r.key for r in runs], variable=variable)
    except ValueError as e:
        raise Invalid(str(e), loc=("query", "variable")) from None
    pairs = [_pair(runs[0], c, opts) for c in runs[1:]]
    return {
        "kind": "runs",
        "baseline": runs[0].run["id"],
        "threshold_pct": threshold_pct,
        "alpha": alpha,
        "method": _method(opts, threshold_pct, alpha),
        "comparability": comp.to_dict(),
        "runs": [_run_entry(r) for r in runs],
        "pairs": pairs,
        "verdict": combine_verdicts([p["verdict"] for p in pairs]),
    }


def compare_runs(
    sessions: sessionmaker[Session],
    baseline_id: str,
    candidate_ids: list[str],
    *,
    threshold_pct: float = 5.0,
    alpha: float = 0.01,
    variable: str | None = None,
    seed: int = 0,
    basis: str = "run",
) -> dict[str, Any]:
    """The baseline against each candidate (2 to 6 runs in all): comparability first, then
    per-metric statistics and verdicts (see ``app.analysis.compare``); ``basis`` "steady":
    each run's steady window (``load_samples``)."""
    ids = [baseline_id, *candidate_ids]
    _check_ids(ids)
    _options(threshold_pct, alpha, seed)  # bad options: 422 before any loading
    runs = [load_samples(sessions, i, basis=basis) for i in ids]
    out = compare_loaded(
        runs, threshold_pct=threshold_pct, alpha=alpha, variable=variable, seed=seed
    )
    return out | {"basis": basis}


def _sweep_steps(sessions: sessionmaker[Session], sweep_id: str) -> dict[float, str]:
    with session_scope(sessions) as s:
        if compare_repo.find_sweep(s, sweep_id) is None:
            raise NotFound(f"no sweep with id {sweep_id!r}")
        return {
            round(st.load, 6): st.run_id
            for st in compare_repo.sweep_steps(s, sweep_id)
            if st.role == "step"
        }


def compare_sweeps(
    sessions: sessionmaker[Session],
    baseline_sweep: str,
    candidate_sweep: str,
    *,
    threshold_pct: float = 5.0,
    alpha: float = 0.01,
    variable: str | None = None,
    basis: str = "run",
) -> dict[str, Any]:
    """Step by step at the loads both sweeps ran (``basis`` "steady": each step's steady
    window); steps at other loads are listed, unjudged.
    A step whose baseline or candidate run cannot be trusted is judged and flagged, as run
    comparisons flag such runs: its ``trust_issues`` (run id -> why), ``untrusted`` and the
    comparison's ``untrusted_loads``."""
    opts = _options(threshold_pct, alpha)
    base, cand = _sweep_steps(sessions, baseline_sweep), _sweep_steps(sessions, candidate_sweep)
    common = sorted(set(base) & set(cand))
    steps: list[dict[str, Any]] = []
    keys: list[dict[str, Any]] = []
    for i, load in enumerate(common):
        a = load_samples(sessions, base[load], basis=basis)
        b = load_samples(sessions, cand[load], basis=basis)
        if not keys:
            keys = [a.key, b.key]
        pair = _pair(a, b, CompareOptions(opts.threshold, opts.alpha, seed=i))
        issues = {r.run["id"]: t for r in (a, b) if (t := run_trust(r))}
        steps.append({"load": load, **pair, "trust_issues": issues, "untrusted": bool(issues)})
        del a, b
    try:
        comp = check(keys, variable=variable) if keys else None
    except ValueError as e:
        raise Invalid(str(e), loc=("query", "variable")) from None
    verdicts = [s["verdict"] for s in steps]
    return {
        "kind": "sweeps",
        "basis": basis,
        "baseline": baseline_sweep,
        "candidate": candidate_sweep,
        "threshold_pct": threshold_pct,
        "alpha": alpha,
        "method": _method(opts, threshold_pct, alpha),
        "comparability": comp.to_dict() if comp else None,
        "common_loads": common,
        "only_baseline": sorted(set(base) - set(cand)),
        "only_candidate": sorted(set(cand) - set(base)),
        "steps": steps,
        "untrusted_loads": [st["load"] for st in steps if st["untrusted"]],
        "verdict": combine_verdicts(verdicts) if verdicts else "no data",
    }


def compare_to_baseline(
    sessions: sessionmaker[Session],
    candidate_ids: list[str],
    baseline_name: str,
    *,
    threshold_pct: float = 5.0,
    alpha: float = 0.01,
    variable: str | None = None,
) -> dict[str, Any]:
    """Runs against a run baseline, or one sweep against a sweep baseline."""
    from app.services import baselines as baseline_svc

    with session_scope(sessions) as s:
        b = baseline_svc.current(s, baseline_name)
        base_run, base_sweep, version = b.run_id, b.sweep_id, b.version
        targets = [baseline_svc.resolve_target(s, c) for c in candidate_ids]
    info = {"name": baseline_name, "version": version}
    if base_run is not None:
        if any(t.run_id is None for t in targets):
            raise Invalid(
                f"baseline {baseline_name!r} is a run: compare runs against it, not sweeps",
                loc=("query", "ids"),
            )
        out = compare_runs(
            sessions,
            base_run,
            [t.id for t in targets],
            threshold_pct=threshold_pct,
            alpha=alpha,
            variable=variable,
        )
        return out | {"baseline_ref": info}
    assert base_sweep is not None
    if len(targets) != 1 or targets[0].sweep_id is None:
        raise Invalid(
            f"baseline {baseline_name!r} is a sweep: compare one sweep against it",
            loc=("query", "ids"),
        )
    out = compare_sweeps(
        sessions,
        base_sweep,
        targets[0].id,
        threshold_pct=threshold_pct,
        alpha=alpha,
        variable=variable,
    )
    return out | {"baseline_ref": info}


def trust_issues(sessions: sessionmaker[Session], run_ids: list[str]) -> dict[str, list[str]]:
    """Run id -> why its figures cannot be trusted (``run_trust_issues``), for those with any."""
    out: dict[str, list[str]] = {}
    with session_scope(sessions) as s:
        for run_id in dict.fromkeys(run_ids):
            row = repo.find_run(s, run_id)
            if row is None:
                continue
            issues = run_trust_issues(run_svc.run_dict(row) | {"summary": row.summary or {}})
            if issues:
                out[run_id] = issues
    return out
