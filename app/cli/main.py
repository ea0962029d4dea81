"""The ``tokentrace`` command line.

Exit codes: 0 success, 1 the run (or command) failed, 2 bad arguments (one-line reason).
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from sqlalchemy.orm import Session, sessionmaker

from app.analysis.profiles import ALL_PROFILES as PROFILE_CHOICES
from app.cli import series_cmd
from app.cli.args import (
    Parser,
    UsageError,
    add_bench_arguments,
    check_local_key,
    check_series,
    definitions_profile,
    flagged,
    spec_from_args,
)
from app.cli.render import render_file_figures, render_report, render_runs
from app.cli.serve_cmd import Handler
from app.client.datasets.base import DatasetError
from app.settings import get_settings


def build_parser() -> Parser:
    p = Parser(prog="tokentrace", description="Exact LLM-serving benchmarks, kept and explained.")
    sub = p.add_subparsers(dest="command", required=True, parser_class=Parser)

    sim = sub.add_parser(
        "sim", help="run the deterministic simulated inference server", add_help=False
    )
    sim.add_argument("sim_args", nargs=argparse.REMAINDER)

    bench = sub.add_parser("bench", help="benchmark an OpenAI-compatible server")
    add_bench_arguments(bench)

    runs = sub.add_parser("runs", help="list saved runs")
    runs.add_argument("--limit", type=int, default=50)
    runs.add_argument("--json", action="store_true")
    runs.add_argument("--database-url", default=None)

    rep = sub.add_parser("report", help="print a saved run's report (or write it as HTML)")
    rep.add_argument("run_id", nargs="?", default=None)
    rep.add_argument(
        "--compare",
        nargs=2,
        default=None,
        metavar=("BASELINE", "RUN"),
        help="a comparison of two runs instead (with --html)",
    )
    rep.add_argument(
        "--html",
        type=Path,
        default=None,
        metavar="FILE",
        help="write one self-contained HTML file (charts included; opens offline)",
    )
    rep.add_argument("--json", action="store_true")
    rep.add_argument("--profile", choices=PROFILE_CHOICES, default=None)
    rep.add_argument(
        "--goodput",
        nargs="+",
        default=None,
        metavar="KEY:MS",
        help="recompute goodput under these SLOs",
    )
    rep.add_argument("--database-url", default=None)

    imp = sub.add_parser("import", help="import results from a file")
    imp.add_argument("format", choices=("csv", "vllm", "guidellm", "aiperf"))
    imp.add_argument("file", type=Path)
    imp.add_argument("--name", default=None)
    imp.add_argument(
        "--time-unit",
        choices=("s", "ms", "us"),
        default=None,
        help="a CSV log's time unit (default s); other formats state theirs",
    )
    imp.add_argument("--json", action="store_true")
    imp.add_argument("--series", default=None, metavar="NAME", help="the series its runs join")
    imp.add_argument("--database-url", default=None)

    demo = sub.add_parser("demo", help="start the simulator, benchmark it, print the report")
    demo.add_argument("--num-prompts", type=int, default=200)
    demo.add_argument("--request-rate", type=float, default=20.0)
    demo.add_argument(
        "--real-model",
        action="store_true",
        help="benchmark a real llama.cpp server with SmolLM2-135M on CPU (extra: realmodel)",
    )
    demo.add_argument("--database-url", default=None)
    return p


def extra_handlers(p: Parser) -> dict[str, Handler]:
    """Subcommands defined in their own modules (serve, token, worker, ...)."""
    from app.cli import baseline_cmd, interop_cmd, probe_cmd, recover_cmd, serve_cmd, worker_cmd

    sub = next(a for a in p._actions if isinstance(a, argparse._SubParsersAction))
    handlers: dict[str, Handler] = {}
    modules = (serve_cmd, worker_cmd, probe_cmd, baseline_cmd, interop_cmd, recover_cmd, series_cmd)
    for module in modules:
        handlers |= module.register(sub)
    return handlers


def _sessions(url: str | None) -> sessionmaker[Session]:
    from app.services.runs import open_database

    return open_database(url or get_settings().database_url)


def _print_json(obj: Any) -> None:
    sys.stdout.write(json.dumps(obj, indent=2, default=str, allow_nan=False) + "\n")


def cmd_bench(ns: argparse.Namespace, console: Console) -> int:
    from app.services.runs import execute_bench

    spec = spec_from_args(ns)
    series_name = check_series(ns.series)
    if series_name is not None and ns.no_save:
        raise UsageError("--series: a run that is not saved joins no series; drop --no-save")
    if ns.server:
        from app.cli.worker_cmd import submit_and_follow

        if ns.realtime or ns.clock != "auto":
            flag = "--realtime" if ns.realtime else "--clock"
            raise UsageError(f"{flag}: a worker's own options decide it (tokentrace worker {flag})")
        return submit_and_follow(spec, ns, console)
    if ns.realtime:
        from app.client.sched import RealtimeRefused, check_realtime

        try:
            check_realtime()
        except RealtimeRefused as e:
            raise UsageError(f"--realtime: {e}") from None
    definitions = definitions_profile(ns)
    if definitions is not None and definitions not in PROFILE_CHOICES:
        raise UsageError(f"--profile: alone, or one of {', '.join(PROFILE_CHOICES)}")
    if spec.dataset == "jsonl" and spec.dataset_path and not Path(spec.dataset_path).is_file():
        raise UsageError(f"--dataset-path: no such file {spec.dataset_path}")
    check_local_key(spec)
    sessions = None if ns.no_save else _sessions(ns.database_url)
    err = Console(stderr=True)
    # a trace given no num_prompts: its count comes with the first progress
    total = None if spec.num_prompts is None else spec.num_prompts + spec.warmup_requests
    with Progress(
        TextColumn("[bold]bench[/]"),
        BarColumn(),
        MofNCompleteColumn(),
        TextColumn("{task.fields[info]}"),
        TimeElapsedColumn(),
        console=err,
        transient=True,
        disable=ns.json or not err.is_terminal,
    ) as bar:
        task = bar.add_task("bench", total=total, info="")
        generates = spec.surface()[0].generates  # embeddings, rerank: no tokens to count

        def on_progress(p: Any) -> None:
            rate = f"  {p.tokens_per_s:,.0f} tok/s" if generates else ""
            bar.update(
                task,
                total=p.planned + spec.warmup_requests,  # multi-turn: the sessions' turns
                completed=p.done,
                info=f"errors {p.errors}  in flight {p.in_flight}{rate}",
            )

        try:
            outcome = execute_bench(
                spec,
                sessions=sessions,
                name=ns.name,
                on_progress=on_progress,
                handle_sigint=True,
                profile=definitions,
                kernel_stamps=ns.clock == "auto",
                realtime=ns.realtime,
                series_name=series_name,
            )
        except DatasetError as e:  # the dataset refused before anything was sent
            raise UsageError(flagged(str(e), spec.dataset)) from None
    report = outcome.report
    if ns.json:
        _print_json(report)
    else:
        render_report(report, console)
    if series_name is not None and sessions is not None:
        series_cmd.alert_pass(sessions, err)
    return 1 if outcome.failed else 0


def cmd_runs(ns: argparse.Namespace, console: Console) -> int:
    from app.services.runs import list_runs

    runs = list_runs(_sessions(ns.database_url), limit=ns.limit)
    if ns.json:
        _print_json(runs)
    else:
        render_runs(runs, console)
    return 0


def cmd_report(ns: argparse.Namespace, console: Console) -> int:
    from app.cli.args import parse_goodput
    from app.services.runs import RunNotFound, run_report

    if ns.compare is not None:
        if ns.run_id is not None:
            raise UsageError("give a RUN or --compare BASELINE RUN, not both")
        if ns.html is None:
            raise UsageError("--compare: writes an HTML file; add --html FILE")
        return write_html(ns, console)
    if ns.run_id is None:
        raise UsageError("run_id: give a run id (or --compare BASELINE RUN --html FILE)")
    if ns.html is not None:
        return write_html(ns, console)
    slos = parse_goodput(ns.goodput) if ns.goodput else None
    sessions = _sessions(ns.database_url)
    try:
        report = run_report(sessions, ns.run_id, profile=ns.profile, slos_ms=slos)
    except RunNotFound:
        raise UsageError(f"run_id: no run {ns.run_id!r}") from None
    figures = file_figures(sessions, ns.run_id)
    if figures is not None:
        report["file_figures"] = figures
    if ns.json:
        _print_json(report)
    else:
        render_report(report, console)
        if figures is not None:
            render_file_figures(figures, console)
    return 0


def write_html(ns: argparse.Namespace, console: Console) -> int:
    """``report RUN --html FILE`` / ``report --compare A B --html FILE``: one offline file."""
    from app.services.errors import ServiceError
    from app.web import report_html

    if ns.html.exists() and ns.html.is_dir():
        raise UsageError(f"--html: {ns.html} is a directory")
    if not ns.html.parent.is_dir():
        raise UsageError(f"--html: no such directory {ns.html.parent}")
    sessions = _sessions(ns.database_url)
    try:
        if ns.compare is not None:
            text = report_html.compare_report(sessions, list(ns.compare))
        else:
            text = report_html.run_report(sessions, ns.run_id)
    except ServiceError as e:
        raise UsageError(e.detail) from None
    ns.html.write_text(text, encoding="utf-8")
    console.print(f"wrote {ns.html} ({len(text.encode()) / 1e6:.1f} MB)")
    return 0


def file_figures(sessions: Any, run_id: str) -> dict[str, Any] | None:
    """An imported run's own figures beside ours under the file's definitions, as the run
    page shows them (``app.web.interop_view.import_comparison``); None for other runs."""
    from app.services.import_compare import import_comparison
    from app.storage import interop as interop_repo
    from app.storage import repository as repo
    from app.storage.db import session_scope

    with session_scope(sessions) as s:
        info = interop_repo.get_import(s, run_id)
        if info is None or not info.figures:
            return None
        trace = repo.load_trace(s, run_id)
        group = interop_repo.group_runs(s, info.group_id)
    comp = import_comparison(info, trace, group)
    return {
        "tool": comp.tool,
        "profile": comp.profile,
        "file_name": comp.file_name,
        "window_note": comp.window_note,
        "rows": [
            {
                "metric": r.metric,
                "label": r.label,
                "unit": r.unit,
                "stat": r.stat,
                "file": r.file_value,
                "ours": r.ours,
                "diff_pct": r.diff_pct,
            }
            for r in comp.rows
        ],
    }


def cmd_import(ns: argparse.Namespace, console: Console) -> int:
    from app.importers.csv_log import ImportFormatError
    from app.services.file_imports import import_path
    from app.services.runs import run_report

    if not ns.file.is_file():
        raise UsageError(f"file: no such file {ns.file}")
    if ns.time_unit is not None and ns.format != "csv":
        raise UsageError("--time-unit: applies to CSV logs only (other formats state theirs)")
    series_name = check_series(ns.series)
    sessions = _sessions(ns.database_url)
    try:
        run_ids = import_path(sessions, ns.format, ns.file, name=ns.name, time_unit=ns.time_unit)
    except (ImportFormatError, UnicodeDecodeError) as e:
        raise UsageError(f"{ns.file}: {e}") from None
    if series_name is not None:
        series_cmd.join_imported(sessions, series_name, run_ids)
    if ns.json:
        _print_json({"runs": run_ids})
    else:
        for run_id in run_ids:
            render_report(run_report(sessions, run_id), console)
            figures = file_figures(sessions, run_id)
            if figures is not None:
                render_file_figures(figures, console)
    return 0


def cmd_demo(ns: argparse.Namespace, console: Console) -> int:
    from app.cli.demo_cmd import run_demo, run_real_model_demo

    if ns.real_model:
        return run_real_model_demo(_sessions(ns.database_url), console)
    return run_demo(
        _sessions(ns.database_url),
        console,
        num_prompts=ns.num_prompts,
        request_rate=ns.request_rate,
    )


def main(argv: Sequence[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    if args and args[0] == "sim":
        from app.targets.simulator.cli import main as sim_main

        return sim_main(args[1:])
    parser = build_parser()
    extra = extra_handlers(parser)
    ns = parser.parse_args(args)
    console = Console()
    if not console.is_terminal:
        console = Console(width=160)
    handlers: dict[str, Handler] = {
        **extra,
        "bench": cmd_bench,
        "runs": cmd_runs,
        "report": cmd_report,
        "import": cmd_import,
        "demo": cmd_demo,
    }
    try:
        return handlers[ns.command](ns, console)
    except UsageError as e:
        sys.stderr.write(f"tokentrace {ns.command}: error: {e}\n")
        return 2


if __name__ == "__main__":
    raise SystemExit(main())
