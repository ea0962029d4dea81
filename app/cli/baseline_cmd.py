"""CLI: ``tokentrace baseline save|list|pin|unpin|history``, ``tokentrace compare`` (a CI gate:
exit 1 on a regression) and ``tokentrace sweep`` (run a sweep here and store it)."""

from __future__ import annotations

import argparse
import json
import math
import sys
from typing import Any

from rich.console import Console
from rich.table import Table
from sqlalchemy.orm import Session, sessionmaker

from app.analysis import series as sa
from app.analysis.metric_defs import OUTPUT_THROUGHPUT, shown
from app.analysis.slo_search import FIND_KINDS
from app.cli.args import (
    UsageError,
    add_bench_arguments,
    check_local_key,
    check_series,
    flagged,
    spec_from_args,
)
from app.cli.serve_cmd import Handler
from app.client.datasets.base import DatasetError
from app.services.errors import ServiceError
from app.settings import get_settings

VERDICT_STYLE = {
    "regressed": "red",
    "improved": "green",
    "no significant change": "",
    "no data": "dim",
}


def register(sub: argparse._SubParsersAction) -> dict[str, Handler]:  # type: ignore[type-arg]
    """Add this module's subcommands to ``sub``; return command name -> handler."""
    base = sub.add_parser("baseline", help="save, list, pin or show named baselines")
    bsub = base.add_subparsers(dest="baseline_command", required=True)
    save = bsub.add_parser("save", help="save a run or sweep as a named baseline")
    save.add_argument("target", metavar="RUN", help="a run id or a sweep id")
    save.add_argument("--name", required=True)
    save.add_argument("--pin", action="store_true", help="pinned: not replaced until unpinned")
    save.add_argument("--note", default=None)
    save.add_argument("--json", action="store_true")
    save.add_argument("--database-url", default=None)
    lst = bsub.add_parser("list", help="list baselines (current versions)")
    lst.add_argument("--json", action="store_true")
    lst.add_argument("--database-url", default=None)
    for name, text in (("pin", "pin a baseline"), ("unpin", "unpin a baseline")):
        p = bsub.add_parser(name, help=text)
        p.add_argument("name")
        p.add_argument("--database-url", default=None)
    hist = bsub.add_parser("history", help="every version of a baseline")
    hist.add_argument("name")
    hist.add_argument("--json", action="store_true")
    hist.add_argument("--database-url", default=None)

    cmp_ = sub.add_parser("compare", help="compare runs with a baseline; exit 1 on a regression")
    cmp_.add_argument("runs", nargs="+", metavar="RUN", help="run ids (or one sweep id)")
    cmp_.add_argument("--baseline", default=None, help="baseline name (default: first RUN)")
    cmp_.add_argument(
        "--series",
        default=None,
        nargs="?",
        const="",
        metavar="NAME",
        help="judge RUN against its series (NAME, or the run's own series) instead",
    )
    cmp_.add_argument(
        "--metric",
        action="append",
        default=None,
        help="with --series: the metrics judged (repeatable; default "
        + " ".join(sa.gate_defaults())
        + ")",
    )
    cmp_.add_argument("--threshold-pct", type=float, default=5.0)
    cmp_.add_argument("--alpha", type=float, default=0.01)
    cmp_.add_argument("--variable", default=None, help="the key field under test")
    cmp_.add_argument(
        "--allow-invalid",
        action="store_true",
        help="give a verdict even on runs that are client-limited or over their error bound",
    )
    cmp_.add_argument("--json", action="store_true")
    cmp_.add_argument("--database-url", default=None)

    sweep = sub.add_parser("sweep", help="run the same workload at several loads, here")
    add_bench_arguments(sweep)
    loads = sweep.add_mutually_exclusive_group(required=True)
    loads.add_argument("--rates", nargs="+", type=float, metavar="RPS")
    loads.add_argument("--concurrencies", nargs="+", type=int, metavar="C")
    loads.add_argument("--auto", action="store_true", help="sync run, max run, rates between")
    loads.add_argument(
        "--find-max",
        metavar="|".join(FIND_KINDS),
        help="search the largest concurrency or rate meeting every --slo (docs/sweeps.md)",
    )
    sweep.add_argument("--auto-steps", type=int, default=5)
    sweep.add_argument("--min-ratio", type=float, default=0.8, help="saturated below this")
    sweep.add_argument(
        "--slo",
        action="append",
        default=[],
        metavar="METRIC:PCT:LIMIT",
        help="find-max: an SLO, e.g. tpot:p99:50 (ms); repeat for several",
    )
    sweep.add_argument(
        "--confidence", type=float, default=0.95, help="find-max: the SLOs' confidence, (0, 1)"
    )
    sweep.add_argument("--max-steps", type=int, default=10, help="find-max: probed steps, most")
    sweep.add_argument("--find-max-start", type=float, default=1.0, help="find-max: first load")
    sweep.add_argument(
        "--find-max-limit", type=float, default=1024.0, help="find-max: highest load tried"
    )
    return {"baseline": cmd_baseline, "compare": cmd_compare, "sweep": cmd_sweep}


def _sessions(url: str | None) -> sessionmaker[Session]:
    from app.services.runs import open_database

    return open_database(url or get_settings().database_url)


def _print_json(obj: Any) -> None:
    sys.stdout.write(json.dumps(obj, indent=2, default=str, allow_nan=False) + "\n")


def cmd_baseline(ns: argparse.Namespace, console: Console) -> int:
    from app.services import baselines as svc
    from app.storage.db import session_scope

    sessions = _sessions(ns.database_url)
    try:
        with session_scope(sessions) as s:
            if ns.baseline_command == "save":
                row = svc.save(s, ns.target, ns.name, pin=ns.pin, note=ns.note)
                out: Any = row
            elif ns.baseline_command == "list":
                out = svc.list_all(s)
            elif ns.baseline_command == "history":
                out = svc.history(s, ns.name)
            else:
                out = svc.set_pin(s, ns.name, ns.baseline_command == "pin")
    except ServiceError as e:
        raise UsageError(e.detail) from None
    if getattr(ns, "json", False):
        _print_json(out)
    elif isinstance(out, list):
        table = Table("name", "version", "run", "sweep", "pinned", "created", "replaced")
        for b in out:
            table.add_row(
                b["name"],
                str(b["version"]),
                b["run_id"] or "",
                b["sweep_id"] or "",
                "yes" if b["pinned"] else "",
                b["created_at"][:19],
                (b["replaced_at"] or "")[:19],
            )
        console.print(table)
    else:
        target = out["run_id"] or out["sweep_id"]
        pin = " (pinned)" if out["pinned"] else ""
        console.print(f"baseline {out['name']!r} version {out['version']} -> {target}{pin}")
    return 0


def _pct(v: Any) -> str:
    return "—" if v is None else f"{v * 100:+.1f}%"


def _num(v: Any) -> str:
    return "—" if v is None else f"{v:,.2f}"


def render_pair(pair: dict[str, Any], console: Console, title: str) -> None:
    table = Table(title=title)
    for col in (
        "metric",
        "pct",
        "baseline",
        "candidate",
        "delta",
        "CI of delta",
        "MW p",
        "verdict",
    ):
        table.add_column(col)
    for key, mc in pair["metrics"].items():
        mw = mc.get("mann_whitney") or {}
        for i, p in enumerate(mc["percentiles"]):
            ci = "—" if p["ci_low"] is None else f"[{p['ci_low']:+.2f}, {p['ci_high']:+.2f}]"
            style = VERDICT_STYLE.get(p["verdict"], "")
            table.add_row(
                key if i == 0 else "",
                p["key"],
                _num(p["baseline"]),
                _num(p["candidate"]),
                _pct(p["rel_delta"]),
                ci,
                f"{mw['p_value']:.2g}" if i == 0 and mw else "",
                f"[{style}]{p['verdict']}[/]" if style else p["verdict"],
            )
    e = pair["error_rate"]
    table.add_row(
        "error rate", "", _num(e["baseline"]), _num(e["candidate"]), "", "",
        "" if e["p_value"] is None else f"{e['p_value']:.2g}", e["verdict"],
    )  # fmt: skip
    for key, t in pair["throughput"].items():
        table.add_row(key, "", _num(t["baseline"]), _num(t["candidate"]), _pct(t["rel_delta"]),
                      "", "", "(no test: one value per run)")  # fmt: skip
    console.print(table)
    console.print(f"verdict: [bold]{pair['verdict']}[/]")


def render_comparison(result: dict[str, Any], console: Console) -> None:
    comp = result.get("comparability")
    if comp:
        style = "green" if comp["comparable"] else "yellow"
        console.print(f"[{style}]comparability: {comp['message']}[/]")
        for d in comp["differing"]:
            console.print(f"  {d['label']}: " + " | ".join(str(v) for v in d["values"]))
    if result["kind"] == "runs":
        for pair in result["pairs"]:
            render_pair(pair, console, f"{pair['candidate']} vs baseline {pair['baseline']}")
    else:
        if not result["steps"]:
            console.print("no load in common between the two sweeps: nothing to judge")
        for step in result["steps"]:
            render_pair(
                step, console, f"load {step['load']:g}: {step['candidate']} vs {step['baseline']}"
            )
    console.print(
        f"[bold]overall: {result['verdict']}[/] (threshold {result['threshold_pct']:g}%, "
        f"alpha {result['alpha']:g})"
    )


def cmd_compare(ns: argparse.Namespace, console: Console) -> int:
    from app.services import compare as svc

    if not (ns.threshold_pct >= 0 and math.isfinite(ns.threshold_pct)):
        raise UsageError("--threshold-pct must be a non-negative number")
    if not 0 < ns.alpha < 1:
        raise UsageError("--alpha must be in (0, 1)")
    if ns.series is not None:
        return cmd_series_gate(ns, console)
    if ns.metric is not None:
        raise UsageError("--metric: applies with --series")
    sessions = _sessions(ns.database_url)
    try:
        if ns.baseline is not None:
            result = svc.compare_to_baseline(
                sessions,
                list(ns.runs),
                ns.baseline,
                threshold_pct=ns.threshold_pct,
                alpha=ns.alpha,
                variable=ns.variable,
            )
        else:
            if len(ns.runs) < 2:
                raise UsageError(
                    "give --baseline NAME, or two or more runs (the first is the baseline)"
                )
            result = svc.compare_runs(
                sessions,
                ns.runs[0],
                list(ns.runs[1:]),
                threshold_pct=ns.threshold_pct,
                alpha=ns.alpha,
                variable=ns.variable,
            )
    except ServiceError as e:
        raise UsageError(e.detail) from None
    issues = svc.trust_issues(sessions, compared_runs(result))
    if issues and not ns.allow_invalid:
        first = next(iter(issues.values()))[0]
        more = sum(len(v) for v in issues.values()) - 1
        extra = f" (and {more} more)" if more else ""
        raise UsageError(f"no verdict: {first}{extra}; --allow-invalid compares anyway")
    result["trust_issues"] = issues
    if ns.json:
        _print_json(result)
    else:
        for run_issues in issues.values():
            for issue in run_issues:
                console.print(f"[bold yellow]untrusted:[/] {issue}")
        render_comparison(result, console)
    return 1 if result["verdict"] == "regressed" else 0


def cmd_series_gate(ns: argparse.Namespace, console: Console) -> int:
    """``tokentrace compare RUN --series [NAME]``: the run against its series; exit 1 on a
    regression, 2 when it gets no verdict (untrusted, flagged, not in the series)."""
    from app.services import series_gate

    if ns.baseline is not None:
        raise UsageError("--series: judge against a series or a --baseline, not both")
    if len(ns.runs) != 1:
        raise UsageError("--series: give exactly one RUN")
    name = check_series(ns.series) if ns.series else None
    sessions = _sessions(ns.database_url)
    try:
        result = series_gate.gate(
            sessions,
            name,
            ns.runs[0],
            metrics=ns.metric or sa.gate_defaults(),
            threshold_pct=ns.threshold_pct,
            allow_invalid=ns.allow_invalid,
        )
    except ServiceError as e:
        raise UsageError(e.detail) from None
    if ns.json:
        _print_json(result)
    else:
        render_gate(result, console)
    return 1 if result["verdict"] == "regressed" else 0


def render_gate(result: dict[str, Any], console: Console) -> None:
    for c in result["caveats"]:
        console.print(f"[bold yellow]untrusted:[/] {c}")
    table = Table(title=f"run {result['run_id']} vs series {result['series']}")
    for col in ("metric", "value", "95% interval", "series median", "change", "verdict", "why"):
        table.add_column(col)
    for r in result["results"]:
        ci = "—" if r["ci_low"] is None else f"{_num(r['ci_low'])}–{_num(r['ci_high'])}"
        style = VERDICT_STYLE.get(r["verdict"], "")
        table.add_row(
            r["label"], _num(r["value"]), ci, _num(r["reference"]), _pct(r["relative"]),
            f"[{style}]{r['verdict']}[/]" if style else r["verdict"], r["reason"],
        )  # fmt: skip
    console.print(table)
    console.print(f"[bold]overall: {result['verdict']}[/] ({result['rule']})")


def compared_runs(result: dict[str, Any]) -> list[str]:
    """Every run a comparison judged, in order (a sweep comparison: its steps' runs)."""
    if result["kind"] == "runs":
        return [str(r["id"]) for r in result["runs"]]
    ids: list[str] = []
    for step in result["steps"]:
        ids += [str(step["baseline"]), str(step["candidate"])]
    return ids


def cmd_sweep(ns: argparse.Namespace, console: Console) -> int:
    from app.client.sweep_plan import SweepPlan
    from app.services.sweeps import execute_sweep

    spec = spec_from_args(ns)
    series_name = check_series(ns.series)
    if ns.no_save:
        raise UsageError("--no-save: a sweep stores its steps; drop --no-save")
    try:
        if ns.find_max is not None:
            plan = SweepPlan(
                "find-max", (), 5, ns.min_ratio, ns.max_error_rate, find_max_from_args(ns)
            )
        elif ns.slo:
            raise UsageError("--slo: give it with --find-max concurrency|rate")
        elif ns.auto:
            plan = SweepPlan("auto", (), ns.auto_steps, ns.min_ratio, ns.max_error_rate)
        elif ns.rates:
            plan = SweepPlan("rates", tuple(ns.rates), 5, ns.min_ratio, ns.max_error_rate)
        else:
            loads = tuple(float(c) for c in ns.concurrencies)
            plan = SweepPlan("concurrencies", loads, 5, ns.min_ratio, ns.max_error_rate)
    except ValueError as e:
        raise UsageError(str(e).replace("loads:", "--rates/--concurrencies:")) from None
    if ns.server:
        return submit_sweep_and_follow(spec, plan, ns, console)
    check_local_key(spec)
    err = Console(stderr=True)

    def on_step(idx: int, load: float, kind: str) -> None:
        what = "max throughput" if math.isinf(load) else f"{kind} {load:g}"
        if not ns.json:
            err.print(f"step {idx}: {what}")

    sessions = _sessions(ns.database_url)
    try:
        out = execute_sweep(spec, plan, sessions=sessions, name=ns.name, on_step=on_step)
    except DatasetError as e:  # the dataset refused before a step sent anything
        raise UsageError(flagged(str(e), spec.dataset)) from None
    if series_name is not None:
        join_sweep_here(sessions, series_name, out.sweep_id, err)
    if ns.json:
        _print_json(out.summary)
    else:
        render_sweep(out.summary, console)
    return 0


FLAGS = {
    "find_max": "--find-max",
    "slo": "--slo",
    "confidence": "--confidence",
    "max_steps": "--max-steps",
    "find_max_start": "--find-max-start",
    "find_max_limit": "--find-max-limit",
}


def find_max_from_args(ns: argparse.Namespace) -> Any:
    """The find-max search of the command line; exit 2 naming the flag when refused."""
    from app.analysis.slo_search import FindMax, SloError, parse_slo

    try:
        if not ns.slo:
            raise SloError("slo", "give at least one, e.g. --slo tpot:p99:50")
        return FindMax(
            ns.find_max,
            tuple(parse_slo(t) for t in ns.slo),
            ns.confidence,
            ns.max_steps,
            ns.find_max_start,
            ns.find_max_limit,
        )
    except SloError as e:
        raise UsageError(f"{FLAGS.get(e.field, e.field)}: {e.message}") from None


def join_sweep_here(sessions: Any, name: str, sweep_id: str, err: Console) -> None:
    """A sweep run here joins its series: its step runs settle now, then its alerts."""
    from app.cli.series_cmd import alert_pass
    from app.services import series as series_svc
    from app.storage.db import session_scope

    with session_scope(sessions) as s:
        series_svc.join_sweep(s, name, sweep_id)
    series_svc.settle_pending(sessions)
    alert_pass(sessions, err)


def render_sweep(summary: dict[str, Any], console: Console) -> None:
    table = Table(title=f"sweep {summary['id']} ({summary['mode']})")
    lat_cols = [  # p50 and p99 of each latency a sweep charts (the sweep page's table)
        (m.key, st, f"{m.name} {st}") for m in shown("sweep_figures") for st in ("p50", "p99")
    ]
    for col in ("step", "load", "achieved req/s", "tok/s", *(h for _, _, h in lat_cols),
                "errors", "run"):  # fmt: skip
        table.add_column(col)
    for s in summary["steps"]:
        lat = s["latency_ms"]
        load = "max" if s["load"] is None else f"{s['load']:g}"
        table.add_row(
            str(s["index"]) + (" (probe)" if s["role"] != "step" else ""),
            f"{load} {'req/s' if s['load_kind'] == 'rate' else 'conc'}",
            _num(s["achieved_rps"]),
            _num(s[OUTPUT_THROUGHPUT.key]),
            *(_num((lat.get(key) or {}).get(st)) for key, st, _ in lat_cols),
            "—" if s["error_rate"] is None else f"{s['error_rate']:.1%}",
            s["run_id"] or "",
        )
    console.print(table)
    if summary.get("stop_reason"):
        console.print(f"[yellow]{summary['stop_reason']}[/]")
    console.print(f"max goodput: {summary['max_goodput']['reason']}")
    fm = summary.get("find_max")
    if isinstance(fm, dict):
        for p in fm.get("probes") or []:
            console.print(f"  {p['load']:g}: {'pass' if p['passes'] else 'fail'} ({p['why']})")
        console.print(f"[bold]find-max: {fm.get('text')}[/]")
    for n in summary.get("diagnosis") or []:
        console.print(f"note: {n['text']}")


def sweep_body(spec: Any, plan: Any, ns: argparse.Namespace) -> dict[str, Any]:
    """POST /api/v1/sweeps body: the bench fields, the plan, the stop rules and the name."""
    from app.cli.worker_cmd import submission_body

    body = submission_body(spec, ns.name, getattr(ns, "series", None))
    if plan.find_max is not None:
        fm = plan.find_max.to_dict()
        body["find_max"] = {k: fm[k] for k in ("kind", "confidence", "max_steps", "start")} | {
            "max_load": fm["max_load"],
            "slos": [s.text for s in plan.find_max.slos],
        }
    elif plan.mode == "auto":
        body |= {"auto": True, "auto_steps": plan.auto_steps}
    elif plan.mode == "rates":
        body["rates"] = list(plan.loads)
    else:
        body["concurrencies"] = [int(x) for x in plan.loads]
    return body | {"min_ratio": plan.min_ratio, "max_error_rate": plan.max_error_rate}


def _follow_sequenced(
    http: Any, sweep_id: str, quiet: bool, err: Console
) -> tuple[str | None, dict[str, Any]]:
    """A sweep whose steps are each dealt over workers: its steps are several jobs, so the
    sweep itself is followed until it ended (its status then stands for the job's state)."""
    import time

    from app.cli import worker_cmd as wc

    seen = 0
    while True:
        summary: dict[str, Any] = wc._check(http.get(f"/sweeps/{sweep_id}"), "sweep")
        steps = len(summary.get("steps") or [])
        if steps != seen and not quiet:
            seen = steps
            err.print(f"step {steps} (each over {summary.get('shards') or 'its'} workers)")
        status = summary.get("status")
        if status not in ("queued", "running"):
            return ("failed" if status == "failed" else str(status)), summary
        time.sleep(wc.POLL_S * 2)


def submit_sweep_and_follow(spec: Any, plan: Any, ns: argparse.Namespace, console: Console) -> int:
    """``tokentrace sweep --server URL``: queue the sweep on a dashboard (a worker runs it),
    follow its job's progress, then print the sweep. Exit 1 when it failed."""
    import os

    import httpx

    from app.cli import worker_cmd as wc

    server = wc._check_url("--server", ns.server)
    token = ns.token or os.environ.get(wc.SUBMIT_TOKEN_ENV)
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    err = Console(stderr=True)
    try:
        with httpx.Client(
            base_url=server + "/api/v1", headers=headers, timeout=30.0, trust_env=False
        ) as http:
            sub = wc._check(http.post("/sweeps", json=sweep_body(spec, plan, ns)), "submit")
            sweep_id, job_id = sub.get("sweep_id"), sub.get("job_id")
            if not sweep_id or not job_id:
                raise wc.Failure(f"submit: unexpected answer {json.dumps(sub)[:200]}")
            err.print(f"submitted sweep {sweep_id} (job {job_id}) to {server}")
            seen: dict[str, Any] = {}

            def on_progress(p: dict[str, Any]) -> None:
                step = p.get("step")
                if step is not None and step != seen.get("step") and not ns.json:
                    seen["step"] = step
                    err.print(f"step {int(step) + 1} of {p.get('steps')}")

            if spec.shards > 1:  # the server sequences the steps, each one dealt run
                state, summary = _follow_sequenced(http, str(sweep_id), ns.json, err)
            else:
                state = wc._Follower(http, str(job_id), on_progress).follow()
                summary = wc._check(http.get(f"/sweeps/{sweep_id}"), "sweep")
    except wc.Failure as e:
        return wc._fail(f"tokentrace sweep: error: {e}")
    except httpx.TransportError as e:
        return wc._fail(f"tokentrace sweep: error: cannot reach {server}: {type(e).__name__}: {e}")
    if ns.json:
        _print_json(summary)
    else:
        render_sweep(summary, console)
    return 1 if state == "failed" or summary.get("status") == "failed" else 0
