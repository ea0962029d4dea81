"""View models: the report dict and run rows rearranged for templates (no metric arithmetic)."""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

from app.analysis.metric_defs import (
    GOODPUT,
    INPUT_THROUGHPUT,
    ITEMS_PER_S,
    OUTPUT_THROUGHPUT,
    REQUEST_THROUGHPUT,
    TOTAL_TOKEN_THROUGHPUT,
    Metric,
    View,
    applies_to,
    format_value,
    headline_cells,
    headline_heading,
    shown,
)
from app.analysis.verdict import Issue, Verdict, verdict_of
from app.client.endpoints import items_noun
from app.services.client_health import as_float as _f
from app.services.runs import run_dict
from app.storage.models import Job, Run

PCTS: tuple[tuple[str, str], ...] = (
    ("p50", "p50"),
    ("p90", "p90"),
    ("p95", "p95"),
    ("p99", "p99"),
    ("p99_9", "p99.9"),
    ("max", "max"),
)
PROFILE_LABELS = {
    "tokentrace": "tokentrace (ours)",
    "vllm": "vLLM bench serve",
    "guidellm": "GuideLLM",
    "aiperf": "AIPerf",
}
ACTIVE_RUN_STATES = ("queued", "running")


def applying(view: View, spec: dict[str, Any] | None) -> list[Metric]:
    """The metrics ``view`` shows (``metric_defs.shown``) that apply to a run of ``spec``
    (its endpoint and stream mode; an import's spec says neither: all of them)."""
    return [m for m in shown(view) if applies_to(m, spec)]


def slo_fields() -> list[tuple[str, str]]:
    """(SLO name, label) of the SLOs a page lets one set: those of the run page's metrics
    (user-perceived TTFT needs connection phases: the API and the CLI take it)."""
    return [(m.slo, m.name) for m in shown("page") if m.slo is not None]


# ------------------------------------------------------------------------------ runs list


def load_text(spec: dict[str, Any] | None) -> str:
    """The load shape in a few words: rate, concurrency cap, request count."""
    if not spec:
        return "imported"
    rate = _f(spec.get("request_rate"))
    parts = ["all at once" if rate is None else f"{rate:g} req/s"]
    if rate is not None and spec.get("arrival") and spec.get("arrival") != "poisson":
        parts[0] += f" ({spec['arrival']})"
    if spec.get("max_concurrency"):
        parts.append(f"≤{spec['max_concurrency']} concurrent")
    if spec.get("num_prompts"):
        parts.append(f"{spec['num_prompts']} req")
    return ", ".join(parts)


DEFAULT_MAX_ERROR_RATE = 0.05  # a run's bound when its spec names none (as sweeps use)


def error_bound(spec: dict[str, Any] | None) -> float:
    """The error-rate bound of a run: its spec's ``max_error_rate``, else 5%."""
    v = _f((spec or {}).get("max_error_rate"))
    return v if v is not None and 0 <= v <= 1 else DEFAULT_MAX_ERROR_RATE


def row_verdict(run: Run) -> Verdict:
    """A stored run's verdict (``app.analysis.verdict``) from its row and cached headline."""
    return verdict_of(run_dict(run) | {"summary": run.summary or {}})


def run_warnings(run: Run) -> list[Issue]:
    """Why a run's figures cannot be taken as they stand: its verdict's flagged issues
    (none while it is queued or running: its verdict is "pending")."""
    v = row_verdict(run)
    return [] if v.pending else list(v.flagged)


@dataclass(frozen=True, slots=True)
class JobView:
    id: str
    state: str
    percent: float
    text: str


def job_view(job: Job | None) -> JobView | None:
    if job is None:
        return None
    prog = job.progress or {}
    planned = int(prog.get("planned") or (job.spec or {}).get("num_prompts") or 0)
    done = int(prog.get("done") or 0)
    pct = 100.0 * done / planned if planned else 0.0
    state = job_state_text(str(job.state))
    text = f"{state}: {done}/{planned}" if planned else state
    return JobView(id=job.id, state=str(job.state), percent=min(pct, 100.0), text=text)


@dataclass(frozen=True, slots=True)
class HeadCell:
    """One headline figure of a run in the runs list: its value and the text shown."""

    value: float | None
    text: str


def headline_columns() -> list[str]:
    """The runs list's headline column headings, in order (``headline_cells``)."""
    return [headline_heading(m, stat) for m, stat, _ in headline_cells()]


@dataclass(frozen=True, slots=True)
class RunRow:
    id: str
    name: str | None
    created_at: Any
    model: str | None
    target: str | None
    load: str
    status: str
    validity: str  # the verdict's word
    tags: list[str]
    headline: list[HeadCell]  # ``headline_columns``' figures, in order
    error_rate: float | None
    job: JobView | None = None
    warnings: list[Issue] = field(default_factory=list)
    validity_tone: str = ""
    validity_detail: str = ""


def run_row(run: Run, job: Job | None = None) -> RunRow:
    s = run.summary or {}
    verdict = row_verdict(run)
    return RunRow(
        id=run.id,
        name=run.name,
        created_at=run.created_at,
        model=run.model,
        target=run.target_url,
        load=load_text(run.spec),
        status=str(run.status),
        validity=verdict.word,
        tags=list(run.tags or []),
        headline=[
            HeadCell(v, format_value(v, m.key))
            for m, _, key in headline_cells()
            for v in (_f(s.get(key)),)
        ],
        error_rate=_f(s.get("error_rate")),
        job=job_view(job),
        # the do-not-trust reasons (a notice, cancelled, is the word itself, in amber)
        warnings=[] if verdict.pending else list(verdict.untrusted),
        validity_tone=verdict.tone,
        validity_detail=verdict.detail,
    )


# ------------------------------------------------------------------------------ run detail


@dataclass(frozen=True, slots=True)
class Cell:
    value: float | None
    lo: float | None = None
    hi: float | None = None


@dataclass(frozen=True, slots=True)
class MetricRow:
    key: str
    label: str
    aggregation: str
    count: int
    mean: float | None
    cells: list[Cell]
    reason: str | None
    ci_method: str | None


def metric_rows(report: dict[str, Any]) -> list[MetricRow]:
    """The run page's latency table: a row per metric it shows that applies to the run."""
    m = report["metrics"]
    agg = m.get("aggregation") or {}
    rows: list[MetricRow] = []
    for md in applying("page", report.get("spec")):
        key, label = md.key, md.title
        d = m.get(key)
        if not isinstance(d, dict):
            continue
        ci = d.get("ci95") or {}
        cells = []
        for pk, _ in PCTS:
            bounds = ci.get(pk)
            lo, hi = (bounds[0], bounds[1]) if bounds else (None, None)
            cells.append(Cell(_f(d.get(pk)), _f(lo), _f(hi)))
        rows.append(
            MetricRow(
                key=key,
                label=label,
                aggregation=str(agg.get(key, "")).replace("_", " "),
                count=int(d.get("count") or 0),
                mean=_f(d.get("mean")),
                cells=cells,
                reason=d.get("reason"),
                ci_method=d.get("ci_method"),
            )
        )
    return rows


@dataclass(frozen=True, slots=True)
class Card:
    label: str
    value: str
    detail: str = ""
    tone: str = ""  # "", "good", "warn", "bad"
    id: str = ""


def _rate(v: Any, unit: str) -> str:
    f = _f(v)
    if f is None:
        return "—"
    return f"{f:,.0f} {unit}" if f >= 100 else f"{f:.2f} {unit}"


JOB_STATE_TEXT = {"leased": "starting", "running": "running", "queued": "queued"}


def job_state_text(state: str) -> str:
    """A job's state as the run page's status card says it."""
    return JOB_STATE_TEXT.get(state, state)


def validity_card(verdict: Verdict) -> Card:
    """The run's verdict (``app.analysis.verdict``): its word, first reason and tone."""
    return Card("Validity", verdict.word, verdict.detail, verdict.tone, id="validity")


def summary_cards(
    report: dict[str, Any],
    verdict: Verdict,
    *,
    active: bool = False,
    job_state: str | None = None,
) -> list[Card]:
    """The run page's cards. While a job runs the run (``job_state``), the status card
    shows the job's state: the same source the progress bar follows and updates. The
    validity card is the run's ``verdict``."""
    m = report["metrics"]
    req = m.get("requests") or {}
    status = str(report.get("status") or "")
    if active and job_state:
        status = job_state_text(job_state)
    # an ended run's status card takes its verdict's colour: never green beside a warning
    status_tone = "" if active else verdict.tone
    err = _f(m.get("error_rate"))
    slos = m.get("slos_ms") or {}
    slo_text = ", ".join(f"{k} ≤ {float(ms):g} ms" for k, ms in slos.items()) or "no SLOs set"
    good = m.get("good_requests")
    window = m.get("window") or {}
    duration = _f(window.get("duration_s"))
    cut = int(req.get("cancelled") or 0)
    errors = f"{req.get('failed', 0)} failed of {req.get('sent', 0)} sent"
    if cut:
        errors += f"; {cut} cancelled (not errors)"
    if not req.get("sent") or duration is None:
        served = "no data yet" if active else "no data"
    else:
        served = f"{req.get('completed_ok', 0)} ok over {duration:.2f} s"
    return [
        Card(
            "Status",
            status or "—",
            f"source: {report.get('source') or '—'}",
            status_tone,
            id="status",
        ),
        validity_card(verdict),
        Card(
            "Error rate",
            "—" if err is None else f"{err * 100:.1f}%",
            errors,
            "bad" if err else "good" if err == 0 else "",
            id="error-rate",
        ),
        Card(
            "Request throughput",
            _rate(m.get(REQUEST_THROUGHPUT.key), REQUEST_THROUGHPUT.unit),
            served,
            id="throughput",
        ),
        *_answer_cards(m, report.get("spec") or {}),
        Card(
            "Goodput",
            _rate(m.get(GOODPUT.key), GOODPUT.unit),
            (f"{good} good requests; " if good is not None else "") + slo_text,
            id="goodput",
        ),
    ]


def _answer_cards(m: dict[str, Any], spec: dict[str, Any]) -> list[Card]:
    """The throughput cards: output tokens a second, or, for a surface that generates no
    tokens (embeddings, rerank), its items a second (inputs, documents); input tokens a
    second either way."""
    input_rate = _rate(m.get(INPUT_THROUGHPUT.key), INPUT_THROUGHPUT.unit)
    if m.get("e2e_end") != "answer":
        return [
            Card(
                "Output throughput",
                _rate(m.get(OUTPUT_THROUGHPUT.key), OUTPUT_THROUGHPUT.unit),
                f"total {_rate(m.get(TOTAL_TOKEN_THROUGHPUT.key), TOTAL_TOKEN_THROUGHPUT.unit)}; "
                f"input {input_rate}",
            )
        ]
    noun = items_noun(spec.get("endpoint"))
    return [
        Card(
            f"{noun.capitalize()} throughput",
            _rate(m.get(ITEMS_PER_S.key), f"{noun}/s"),
            f"{m.get('items_total') or 0:,} {noun} answered; input {input_rate}",
            id="items-throughput",
        ),
        Card("Output throughput", "n/a", "no tokens generated: one answer a request"),
    ]


@dataclass(frozen=True, slots=True)
class ProfileCell:
    mean: float | None
    p50: float | None
    p90: float | None
    p99: float | None
    value: float | None
    count: int
    reason: str | None


@dataclass(frozen=True, slots=True)
class ProfileRow:
    key: str
    label: str
    unit: str
    ours: ProfileCell | None
    theirs: ProfileCell | None
    definition: str
    aggregation: str


def _pcell(d: dict[str, Any] | None) -> ProfileCell | None:
    if d is None:
        return None
    return ProfileCell(
        mean=_f(d.get("mean")),
        p50=_f(d.get("p50")),
        p90=_f(d.get("p90")),
        p99=_f(d.get("p99")),
        value=_f(d.get("value")),
        count=int(d.get("count") or 0),
        reason=d.get("reason"),
    )


def profile_rows(ours: dict[str, Any], theirs: dict[str, Any]) -> list[ProfileRow]:
    """Rows of the profile comparison: every metric of ``theirs``, ours beside it."""
    om = ours.get("metrics") or {}
    tm = theirs.get("metrics") or {}
    rows = []
    for key, d in tm.items():
        rows.append(
            ProfileRow(
                key=key,
                label=str(d.get("label") or key),
                unit=str(d.get("unit") or ""),
                ours=_pcell(om.get(key)),
                theirs=_pcell(d),
                definition=str(d.get("definition") or ""),
                aggregation=str(d.get("aggregation") or ""),
            )
        )
    return rows


def parse_slos(query: dict[str, str]) -> tuple[dict[str, float] | None, dict[str, str]]:
    """SLOs from ``slo_<name>`` (ms) for each of ``slo_fields``: ``slo_ttft``, ``slo_tpot``,
    ``slo_e2el``. Returns (slos, errors): slos is None when the query does not set SLOs
    (the run's own apply)."""
    fields = slo_fields()
    if query.get("slo") is None and not any(f"slo_{k}" in query for k, _ in fields):
        return None, {}
    slos: dict[str, float] = {}
    errors: dict[str, str] = {}
    for key, label in fields:
        raw = (query.get(f"slo_{key}") or "").strip()
        if not raw:
            continue
        try:
            ms = float(raw)
        except ValueError:
            errors[key] = f"{label} SLO must be a number of ms"
            continue
        if not (ms > 0 and math.isfinite(ms)):
            errors[key] = f"{label} SLO must be a positive number of ms"
            continue
        slos[key] = ms
    return (None if errors else slos), errors
