"""CLI: ``tokentrace series list | show NAME | create NAME | add NAME RUN | remove NAME RUN |
baseline NAME RUN | alert NAME`` (named series of runs, their trends, change points and
alerts); a run joins one with ``bench/sweep/import --series NAME``, and ``tokentrace
compare RUN --series NAME`` gates a run against its series (``baseline_cmd``)."""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any

from rich.console import Console
from rich.table import Table
from sqlalchemy.orm import Session, sessionmaker

from app.cli.args import UsageError
from app.cli.serve_cmd import Handler
from app.services.errors import ServiceError
from app.settings import get_settings


def register(sub: argparse._SubParsersAction) -> dict[str, Handler]:  # type: ignore[type-arg]
    p = sub.add_parser("series", help="named series of runs: trends, change points, alerts")
    ssub = p.add_subparsers(dest="series_command", required=True)
    lst = ssub.add_parser("list", help="every series")
    show = ssub.add_parser("show", help="a series' trend, change points and current verdict")
    show.add_argument("name")
    show.add_argument("--metric", default="ttft:p99", help="ttft:p99, e2el:p50, goodput ...")
    show.add_argument("--track", default=None, help="a sweep step's load (series of sweeps)")
    create = ssub.add_parser("create", help="create an empty series")
    create.add_argument("name")
    create.add_argument(
        "--vary",
        nargs="*",
        default=None,
        metavar="FIELD",
        help="comparability fields its runs may differ in (default: engine_version)",
    )
    create.add_argument(
        "--on-mismatch",
        choices=("flag", "refuse"),
        default="flag",
        help="a run whose key differs in another field: flagged (kept apart) or refused",
    )
    for verb, text in (("add", "move a run into the series"), ("remove", "take a run out")):
        q = ssub.add_parser(verb, help=text)
        q.add_argument("name")
        q.add_argument("run_id", metavar="RUN")
    base = ssub.add_parser("baseline", help="the run relative thresholds are judged against")
    base.add_argument("name")
    base.add_argument("run_id", metavar="RUN", nargs="?", default=None, help="none: unset")
    alert = ssub.add_parser("alert", help="alert a webhook on a threshold or a change point")
    alert.add_argument("name")
    alert.add_argument("--metric", default="ttft:p99")
    alert.add_argument("--webhook", required=True, help="http(s) URL: JSON with a text field")
    alert.add_argument("--max-value", type=float, default=None, help="absolute threshold")
    alert.add_argument(
        "--max-relative-pct", type=float, default=None, help="worse than the baseline by, %%"
    )
    alert.add_argument(
        "--no-change-points", action="store_true", help="thresholds only, no change points"
    )
    for q in (lst, show, create, *ssub.choices.values()):
        if not any(a.dest == "json" for a in q._actions):
            q.add_argument("--json", action="store_true")
            q.add_argument("--database-url", default=None)
    return {"series": cmd_series}


def _sessions(url: str | None) -> sessionmaker[Session]:
    from app.services.runs import open_database

    return open_database(url or get_settings().database_url)


def _print_json(obj: Any) -> None:
    from app.storage.jsonsafe import json_safe

    sys.stdout.write(json.dumps(json_safe(obj), indent=2, default=str, allow_nan=False) + "\n")


def cmd_series(ns: argparse.Namespace, console: Console) -> int:
    try:
        return _run(ns, console)
    except ServiceError as e:
        raise UsageError(e.detail) from None


def _run(ns: argparse.Namespace, console: Console) -> int:
    from app.services import series as svc
    from app.storage.db import session_scope

    sessions = _sessions(ns.database_url)
    cmd = ns.series_command
    if cmd == "show":
        return show(sessions, ns, console)
    with session_scope(sessions) as s:
        if cmd == "list":
            out: Any = svc.list_all(s)
        elif cmd == "create":
            out = svc.create(s, ns.name, vary=ns.vary, on_mismatch=ns.on_mismatch)
        elif cmd == "baseline":
            out = svc.set_baseline(s, ns.name, ns.run_id)
        elif cmd == "alert":
            out = _alert(s, ns)
        else:
            out = None
    if cmd in ("add", "remove"):
        svc.checked_name(ns.name, loc=("name",))
        if cmd == "remove":
            with session_scope(sessions) as s:
                current = svc.series_of_run(s, ns.run_id)
            if current is None or current["name"] != ns.name:
                raise UsageError(f"run {ns.run_id!r} is not in series {ns.name!r}")
        out = svc.move(sessions, ns.run_id, ns.name if cmd == "add" else None)
    if ns.json:
        _print_json(out)
    elif cmd == "list":
        render_list(out, console)
    elif cmd == "alert":
        console.print(
            f"alert {out['id']} on {out['metric_text']} of series {ns.name} -> {out['webhook']}"
        )
    elif cmd in ("add", "remove"):
        where = f"series {out['series']} ({out['state']})" if out["series"] else "no series"
        console.print(f"run {out['run_id']}: {where}")
    else:
        console.print(f"series {out['name']}: {json.dumps(out, default=str)}")
    return 0


def _alert(s: Session, ns: argparse.Namespace) -> dict[str, Any]:
    from app.services import series_alerts
    from app.services.secretbox import SecretBox

    settings = get_settings()
    rel = None if ns.max_relative_pct is None else ns.max_relative_pct / 100.0
    return series_alerts.add_rule(
        s,
        settings,
        SecretBox.from_settings(settings),
        ns.name,
        metric=ns.metric,
        webhook=ns.webhook,
        max_value=ns.max_value,
        max_relative=rel,
        change_points=not ns.no_change_points,
    )


def render_list(items: list[dict[str, Any]], console: Console) -> None:
    table = Table("series", "runs", "flagged", "refused", "pending", "last run", "alerts")
    for it in items:
        st = it["states"]
        table.add_row(
            it["name"],
            str(st.get("member", 0)),
            str(st.get("flagged", 0)),
            str(st.get("refused", 0)),
            str(st.get("pending", 0)),
            (it["last_run_at"] or "")[:19],
            str(it["alerts"])
            + (f" ({it['failed_deliveries']} failed)" if it["failed_deliveries"] else ""),
        )
    console.print(table)


def _v(v: Any) -> str:
    return "—" if v is None else f"{v:,.2f}"


def show(sessions: sessionmaker[Session], ns: argparse.Namespace, console: Console) -> int:
    from app.services import series_view

    _view, out = series_view.detail(sessions, ns.name, ns.metric, ns.track)
    if ns.json:
        _print_json(out)
        return 0
    t = out["trend"]
    console.print(
        f"[bold]series {out['name']}[/] · {t['label']} ({t['unit']})"
        + (f" · track {t['track']}" if t["track"] else "")
        + f" · {len(t['points'])} runs · lets vary: {', '.join(out['vary']) or 'nothing'}"
    )
    table = Table("run", "created", "value", "95% interval", "state", "note")
    changes = {c["index"]: c for c in t["change_points"]}
    for i, p in enumerate(t["points"]):
        if i in changes:
            c = changes[i]
            table.add_row(
                "[bold magenta]change point[/]", "", "", "",
                f"[magenta]{c['kind']}[/]", _change_line(c, t["unit"]),
            )  # fmt: skip
        ci = "—" if p["ci_low"] is None else f"{_v(p['ci_low'])}–{_v(p['ci_high'])}"
        note = "; ".join(p["trust_issues"]) or (p["reason"] or "")
        state = p["state"] if p["trusted"] else f"{p['state']}, untrusted"
        table.add_row(p["label"], p["created_at"][:19], _v(p["value"]), ci, state, note[:80])
    console.print(table)
    if not t["change_points"]:
        console.print("change points: none")
    verdict = out.get("verdict")
    if verdict:
        console.print(
            f"current verdict (run {verdict['run_id']}): [bold]{verdict['verdict']}[/] "
            f"({verdict['reason']})"
        )
    for a in out["alerts"]:
        parts = [f"alert {a['id']}: {a['metric_text']} -> {a['webhook']}"]
        if a["max_value"] is not None:
            parts.append(f"max {a['max_value']:g}")
        if a["max_relative"] is not None:
            parts.append(f"relative {a['max_relative'] * 100:g}%")
        if a["change_points"]:
            parts.append("change points")
        console.print(" · ".join(parts))
    for e in out["events"][:10]:
        err = f" · last error: {e['last_error']}" if e["last_error"] else ""
        console.print(
            f"  {e['created_at'][:19]} {e['kind']} {e['state']} ({e['attempts']} tries){err}"
        )
    console.print(f"[dim]{t['method']}[/]")
    return 0


def _change_line(c: dict[str, Any], unit: str) -> str:
    rel = "" if c["relative"] is None else f" ({c['relative'] * 100:+.1f}%)"
    text = f"{_v(c['before'])} -> {_v(c['after'])} {unit}{rel}, p={c['p_value']:.3g}"
    if c["changed_fields"]:
        text += "; changed: " + ", ".join(f["label"] for f in c["changed_fields"])
    return text


def alert_pass(sessions: Any, err: Console) -> None:
    """After runs joined a series here: settle, judge and deliver its alerts once (a failed
    delivery stays pending: the dashboard's alert loop, or the next run here, retries it)."""
    from app.services import series_alerts
    from app.services.secretbox import SecretBox

    settings = get_settings()
    try:
        series_alerts.process(sessions, settings, SecretBox.from_settings(settings))
    except Exception as e:  # the run is stored: an alert problem does not fail it
        err.print(f"[yellow]series alerts not processed now: {type(e).__name__}: {e}[/]")


def join_imported(sessions: Any, name: str, run_ids: list[str]) -> None:
    """Imported runs join the series (settled now: they are finished), then its alerts."""
    from app.services import series as series_svc
    from app.storage.db import session_scope

    for run_id in run_ids:
        with session_scope(sessions) as s:
            series_svc.join_run(s, name, run_id)
        series_svc.settle_run(sessions, run_id)
    alert_pass(sessions, Console(stderr=True))
