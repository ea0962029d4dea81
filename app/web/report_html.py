"""Single-file HTML reports of a run or a comparison (``tokentrace report RUN --html FILE``,
``tokentrace report --compare A B --html FILE``, the pages' "download report" links).

One file holds everything: the dashboard's stylesheet, plotly.js (``static/plotly.min.js``)
and the renderer (``static/report.js``) inlined, each chart's figure as a JSON block, the
tables (percentiles with their intervals, verdicts), validity and trust warnings, and the
spec. It opens offline in any browser. The same view models as the pages build it
(``runs_page.run_context``; ``app.services.compare``), so the numbers are the page's.

A run still queued or running is refused (409, naming its state): its figures would be a
snapshot of a moving run."""

from __future__ import annotations

import datetime as dt
import json
import re
from typing import Any

from markupsafe import Markup
from sqlalchemy.orm import Session, sessionmaker

from app.analysis.metric_defs import metric, shown
from app.figures import compare as fc
from app.figures.scriptjson import plotly_json
from app.services import compare as compare_svc
from app.services import series as series_svc
from app.services.errors import Conflict, Invalid, NotFound
from app.storage import repository as repo
from app.storage.db import session_scope
from app.storage.jsonsafe import json_safe
from app.web.context import asset_dir, templates
from app.web.runs_page import load_run, report_warnings, run_context
from app.web.runs_view import ACTIVE_RUN_STATES

# the run page's charts after its distributions (``run_figures``), in its order (a run has
# those its summary holds)
OTHER_FIGURES: tuple[tuple[str, str], ...] = (
    ("timeline", "requests over time"),
    ("phases", "phases"),
    ("throughput", "throughput"),
    ("send_lag", "send lag"),
    ("itl_position", "ITL by token position"),
    ("ttft_input", "TTFT vs input length"),
)


def run_figures() -> list[tuple[str, str]]:
    """(figure key, title) of the run page's charts, in its order: each distribution the
    registry shows there (``Metric.views`` "figures"), its CDF then its histogram."""
    dists = [
        (f"{kind}_{m.short_key}", f"{m.name} {what}")
        for m in shown("figures")
        for kind, what in (("cdf", "CDF"), ("hist", "histogram"))
    ]
    return [*dists, *OTHER_FIGURES]


_CLOSE = re.compile(r"</(script|style)", re.IGNORECASE)
_PLOTLY_VERSION = re.compile(r"plotly\.js v([0-9][0-9.]*)")


def _inline(text: str) -> Markup:
    """File text safe inside ``<script>``/``<style>`` (no closing tag can end it early)."""
    return Markup(_CLOSE.sub(lambda m: "<\\/" + m.group(1), text))


def _assets() -> dict[str, Any]:
    static = asset_dir("static")
    plotly = (static / "plotly.min.js").read_text(encoding="utf-8")
    found = _PLOTLY_VERSION.search(plotly[:400])
    return {
        "css": _inline((static / "style.css").read_text(encoding="utf-8")),
        "plotly_js": _inline(plotly),
        "report_js": _inline((static / "report.js").read_text(encoding="utf-8")),
        "plotly_version": found.group(1) if found else "",
        "written_at": dt.datetime.now(dt.UTC).strftime("%Y-%m-%d %H:%M:%S UTC"),
    }


def _render(name: str, ctx: dict[str, Any]) -> str:
    return templates.env.get_template(name).render(ctx | _assets())


def refuse_active(sessions: sessionmaker[Session], run_id: str) -> None:
    """NotFound, or a 409 naming the state of a run still queued or running."""
    with session_scope(sessions) as s:
        row = repo.find_run(s, run_id)
        if row is None:
            raise NotFound(f"no run with id {run_id!r}")
        status = str(row.status)
    if status in ACTIVE_RUN_STATES:
        raise Conflict(
            f"run {run_id!r} is {status}: its report is written once it has finished",
            loc=("path", "run_id"),
        )


def run_report(sessions: sessionmaker[Session], run_id: str) -> str:
    """The run's single-file report (HTML text)."""
    refuse_active(sessions, run_id)
    data = load_run(sessions, run_id)
    ctx = run_context(data, slos_ms=None, slo_errors={}, profile="tokentrace")
    figures: dict[str, str] = ctx["figures"]
    ctx["figure_titles"] = [(k, t) for k, t in run_figures() if k in figures]
    ctx["warnings"] = report_warnings(ctx["run"], ctx["report"])
    with session_scope(sessions) as s:
        ctx["series"] = series_svc.series_of_run(s, run_id)
    return _render("report_run.html", ctx)


def compare_report(sessions: sessionmaker[Session], ids: list[str]) -> str:
    """The comparison's single-file report: the first run is the baseline."""
    wanted = compare_svc.unique_ids([i.strip() for i in ids if i.strip()])
    if not compare_svc.MIN_RUNS <= len(wanted) <= compare_svc.MAX_RUNS:
        raise Invalid(
            f"compare {compare_svc.MIN_RUNS} to {compare_svc.MAX_RUNS} distinct runs "
            f"(got {len(wanted)})",
            loc=("query", "ids"),
        )
    for run_id in wanted:
        refuse_active(sessions, run_id)
    loaded = [compare_svc.load_samples(sessions, i) for i in wanted]
    result = json_safe(compare_svc.compare_loaded(loaded))
    labels = {r.run["id"]: str(r.run.get("name") or r.run["id"]) for r in loaded}
    figures: dict[str, str] = {}
    titles: list[tuple[str, str]] = []
    for i, pair in enumerate(result["pairs"]):
        title = f"{labels[pair['candidate']]} vs baseline (% change, interval)"
        figures[f"delta_{i}"] = plotly_json(json_safe(fc.delta_figure(pair, title=title)))
        titles.append((f"delta_{i}", title))
    labels_of = compare_svc.latency_labels()
    for key, label in labels_of.items():
        fig = fc.overlaid_cdf_figure(
            [(labels[r.run["id"]], r.samples_ms[key]) for r in loaded],
            title=f"{label} CDF",
            xtitle=metric(key).heading,
        )
        figures[f"cdf_{key}"] = plotly_json(json_safe(fig))
        titles.append((f"cdf_{key}", f"{label} CDF"))
    warnings = {r.run["id"]: report_warnings(r.run, r.report) for r in loaded}
    ctx = {
        "result": result,
        "figures": figures,
        "figure_titles": titles,
        "metric_labels": labels_of,
        "run_warnings": warnings,
        "warned_ids": [k for k, v in warnings.items() if v],
        "specs": {
            r.run["id"]: json.dumps(r.run.get("spec") or {}, indent=2, sort_keys=True)
            for r in loaded
        },
    }
    return _render("report_compare.html", ctx)


def filename(kind: str, ident: str) -> str:
    """A download's file name: ``tokentrace-run-<id>.html``, characters kept safe."""
    safe = re.sub(r"[^A-Za-z0-9._-]", "_", ident)[:80]
    return f"tokentrace-{kind}-{safe}.html"
