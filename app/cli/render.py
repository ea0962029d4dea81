"""Terminal rendering of reports and run lists (rich)."""

from __future__ import annotations

from typing import Any

from rich.console import Console
from rich.markup import escape
from rich.table import Table

from app.analysis.agent_sessions import STATS_KEY as AGENT_STATS_KEY
from app.analysis.comparability import endpoint_text
from app.analysis.metric_defs import (
    ITEMS_PER_S,
    ITL,
    REQUEST_THROUGHPUT,
    TPOT,
    TTFT,
    Metric,
    applies_to,
    headline_cells,
    headline_heading,
    latencies,
    rates,
)
from app.analysis.prefix_cache import responses_prefix_cache
from app.analysis.server_controls import control_rows
from app.analysis.server_timing import client_mean_key
from app.analysis.turns import PER_TOKEN, turn_metrics
from app.analysis.verdict import verdict_of
from app.cli.render_groups import render_groups
from app.client.endpoints import items_noun
from app.services.client_health import client_health

PCT_KEYS = ("p50", "p90", "p95", "p99", "p99_9", "max")


def latency_rows(spec: dict[str, Any] | None = None) -> list[tuple[str, str, str]]:
    """The report's latency rows, in the order shown: (key, label, what one sample is), of
    every distribution of the registry that applies to a run of ``spec``."""
    return [(m.key, m.label, m.per) for m in latencies() if applies_to(m, spec)]


def fmt(v: Any, digits: int = 2) -> str:
    if v is None:
        return "no data"
    if isinstance(v, float):
        return f"{v:,.{digits}f}"
    return str(v)


def _pct(dist: dict[str, Any], key: str) -> Any:
    return dist.get(key)


def _n(v: object, digits: int) -> str:
    return f"{v:,.{digits}f}" if isinstance(v, int | float) else "—"


def process_line(p: dict[str, Any]) -> str:
    """One load process of a dealt run, e.g. "process 1: 12/12 ok, 1,204.5 tok/s, send lag
    p99 0.210 ms, loop lag p99 0.300 ms, start skew 0.045 ms"."""
    line = (
        f"process {p.get('process')}: {p.get('ok')}/{p.get('planned')} ok, "
        f"{_n(p.get('tokens_per_s'), 1)} tok/s, send lag p99 {_n(p.get('send_lag_p99_ms'), 3)} "
        f"ms, loop lag p99 {_n(p.get('loop_lag_p99_ms'), 3)} ms, start skew "
        f"{_n(p.get('start_skew_ms'), 3)} ms"
    )
    if p.get("lost"):
        line += f", {p['lost']} lost ({p.get('error')})"
    elif p.get("client_limited"):
        line += ", client-limited"
    return line


def shard_line(s: dict[str, Any]) -> str:
    """One shard of a run dealt over workers, e.g. "shard 1: 10/10 ok, 812.0 tok/s, send
    lag p99 0.310 ms, clock bound 0.920 ms, start skew 0.340 ms"."""
    line = (
        f"shard {s.get('shard')}: {s.get('ok')}/{s.get('planned')} ok, "
        f"{_n(s.get('tokens_per_s'), 1)} tok/s, send lag p99 {_n(s.get('send_lag_p99_ms'), 3)} "
        f"ms, clock bound {_n(s.get('clock_bound_ms'), 3)} ms, start skew "
        f"{_n(s.get('start_skew_ms'), 3)} ms"
    )
    if (s.get("processes") or 1) > 1:
        line += f", {s['processes']} load processes"
    if s.get("warmup_end_ms") is not None and s.get("measure_start_ms") is not None:
        line += (
            f", warm-ups end {_n(s['warmup_end_ms'], 1)} ms, measure start "
            f"{_n(s['measure_start_ms'], 1)} ms"
        )
    if s.get("lost"):
        line += f", {s['lost']} lost ({s.get('error')})"
    elif s.get("clock_flagged"):
        line += ", clock flagged"
    return line


def render_report(report: dict[str, Any], console: Console) -> None:
    m = report["metrics"]
    v = report["validity"]
    title = f"Run {report.get('run_id') or '(not saved)'}"
    if report.get("name"):
        title += f" · {report['name']}"
    console.print(f"[bold]{title}[/bold]  status={report.get('status')}")
    spec = report.get("spec") or {}
    if spec:
        console.print(
            f"target {spec.get('base_url')}  model {spec.get('model')}  endpoint "
            f"{endpoint_text(spec)}  in/out {spec.get('input_len')}/{spec.get('output_len')} "
            f"tokens  rate {spec.get('request_rate')} req/s  concurrency "
            f"{spec.get('max_concurrency') or '∞'}  seed {spec.get('seed')}  connections "
            f"{spec.get('connection_mode') or 'new (recorded before keep-alive)'}"
        )
    send_clock = (report.get("load") or {}).get("send_clock")
    console.print(
        f"clock source: {report.get('clock_source')}"
        + (f" (receive), {send_clock} (send)" if send_clock else "")
    )
    phases = phase_line(m.get("phases") or {})
    if phases:
        console.print("phases p50/p99 (ms): " + phases)
    health = client_health(report)
    if health:
        console.print("client: " + " · ".join(health))
    for p in (report.get("load") or {}).get("processes") or []:  # a dealt run's processes
        console.print(process_line(p))
    for s in (report.get("load") or {}).get("shards") or []:  # a run dealt over workers
        console.print(shard_line(s))
    render_verdict(v, console)
    for note in v.get("notes") or []:
        console.print(f"[yellow]note:[/] {note}")
    req = m.get("requests") or {}
    none_ok = bool(req.get("sent")) and not req.get("completed_ok")
    if none_ok:  # the cause first: nothing else of this run has figures
        _render_errors(req, console)

    counts = Table(title="Requests and throughput", show_header=False)
    window = m.get("window") or {}
    for label, val, digits in (
        ("requests sent", req.get("sent"), 0),
        ("completed", req.get("completed_ok"), 0),
        ("failed (error, timeout)", req.get("failed"), 0),
        ("cancelled (cut by the client)", req.get("cancelled"), 0),
        ("error rate", m.get("error_rate"), 4),
        ("observation window (s)", window.get("duration_s"), 3),
        *_answer_rows(m, spec),
        # each rate with one decimal more than the pages show (a terminal has the room)
        *(
            (_rate_label(r, spec), m.get(r.key), r.decimals + 1)
            for r in rates()
            if applies_to(r, spec) and not (r is ITEMS_PER_S and m.get(r.key) is None)
        ),
    ):
        if val is None and m.get("e2e_end") == "answer" and label.startswith("output"):
            counts.add_row(label, "not applicable (no tokens generated)")
            continue
        counts.add_row(label, fmt(val, digits) if isinstance(val, float) else fmt(val))
    load = report.get("load") or {}
    if load.get("achieved_send_rate_rps") is not None:
        counts.add_row("achieved send rate (req/s)", fmt(load["achieved_send_rate_rps"], 3))
    slos = report.get("slos_ms") or {}
    if slos:
        counts.add_row("SLOs (ms)", ", ".join(f"{k} <= {x:g}" for k, x in slos.items()))
    console.print(counts)
    steady_line = steady_text(report.get("steady"))
    if steady_line:
        console.print(steady_line)
    if none_ok:
        console.print("no request succeeded: no latencies to show")
    else:
        _render_latencies(m, console, spec)
        _render_errors(req, console)
    turns = report.get("turns")
    turn_rows = [r for r in turns if isinstance(r, dict)] if isinstance(turns, list) else []
    if turn_rows:
        render_turns(turn_rows, console)
    render_groups(report.get("groups"), console)  # several models / targets
    load_block = report.get("load") or {}
    agents = load_block.get(AGENT_STATS_KEY) if isinstance(load_block, dict) else None
    if isinstance(agents, dict):
        render_agent_sessions(agents, console)
    scrape = load_block.get("server_metrics")
    cache = scrape.get("prefix_cache") if isinstance(scrape, dict) else None
    if not isinstance(cache, dict):  # no server counters: what the responses said
        cache = load_block.get("prefix_cache_responses")
        if not isinstance(cache, dict) and turn_rows:  # a run stored before the run's share
            cache = responses_prefix_cache(turn_rows)
    if isinstance(cache, dict):
        console.print(prefix_cache_line(cache))
    timing = report.get("server_timing")
    if isinstance(timing, dict):
        render_server_timing(timing, console)
    for label, text in control_rows(load_block):  # server controls and identity
        console.print(f"{label}: {text}", highlight=False, markup=False)
    prof = report.get("profile")
    if prof:
        render_profile(prof, console)


def steady_text(block: Any) -> str:
    """One line on the steady window (``analysis.steady``): where it is and its request
    throughput beside the whole run's, or why there is none."""
    if not isinstance(block, dict):
        return ""
    w = block.get("window")
    if not isinstance(w, dict):
        return f"steady window: none ({block.get('reason')})"
    sm = block.get("metrics") or {}
    return (
        f"steady window: {w['start_s']:.3f}-{w['end_s']:.3f} s ({w['duration_s']:.3f} s, "
        f"{block.get('requests')} requests started inside); request throughput there "
        f"{fmt(sm.get(REQUEST_THROUGHPUT.key), 3)} req/s"
    )


def _answer_rows(m: dict[str, Any], spec: dict[str, Any]) -> list[tuple[str, Any, int]]:
    """A run of a surface that generates no tokens: the items its answers carried (inputs
    for embeddings, documents for rerank)."""
    if m.get("items_total") is None:
        return []
    return [(f"{items_noun(spec.get('endpoint'))} answered", m.get("items_total"), 0)]


def _rate_label(r: Metric, spec: dict[str, Any]) -> str:
    """A rate's row label: items/s named by the run's surface ("documents/s")."""
    if r is ITEMS_PER_S:
        noun = items_noun(spec.get("endpoint"))
        return f"{noun} throughput ({noun}/s)"
    return f"{r.label.lower()} ({r.unit})"


def render_turns(turns: list[dict[str, Any]], console: Console) -> None:
    """A multi-turn run's metrics by turn index (``report["turns"]``)."""
    t = Table(title="By turn (multi-turn sessions; ok requests)")
    metric_cols: list[tuple[str, str, str, int]] = []  # (row key, statistic, heading, digits)
    for m in turn_metrics():
        for st in ("mean", "p50"):
            metric_cols.append((m.key, st, f"{m.label} {st} ({m.unit})", m.decimals))
        if m is TTFT:
            metric_cols.append((PER_TOKEN, "mean", "TTFT/prompt token mean (ms)", 4))
    heads = [h for _, _, h, _ in metric_cols]
    for col in ("turn", "requests", "ok", "prompt tokens mean", *heads):
        t.add_column(col, justify="right")
    for col in ("cached prompt tokens mean", "cached share"):
        t.add_column(col, justify="right")
    for row in turns:
        t.add_row(
            fmt(row.get("turn")),
            fmt(row.get("requests")),
            fmt(row.get("ok")),
            fmt(_pct(row.get("prompt_tokens") or {}, "mean"), 1),
            *(fmt(_pct(row.get(key) or {}, st), d) for key, st, _, d in metric_cols),
            fmt(_pct(row.get("cached_prompt_tokens") or {}, "mean"), 1),
            _share(row.get("cached_share")),
        )
    console.print(t)


AGENT_SESSIONS_SHOWN = 20  # the slowest sessions listed; the JSON report has them all


def render_agent_sessions(tables: dict[str, Any], console: Console) -> None:
    """An agent trace's per-session figures (the slowest by wall time) and TTFT by depth
    (``load.agent_sessions``, ``app.analysis.agent_sessions``)."""
    rows = [r for r in tables.get("sessions") or [] if isinstance(r, dict)]
    rows.sort(
        key=lambda r: -float(r["wall_ms"]) if isinstance(r.get("wall_ms"), int | float) else 0
    )
    t = Table(title=f"Agent sessions (ms; the {min(len(rows), AGENT_SESSIONS_SHOWN)} slowest)")
    heads = ("session", "requests", "ok", "max depth", "wall", "critical path", "queueing",
             "generation", "queueing share")  # fmt: skip
    for col in heads:
        t.add_column(col, justify="right")
    for r in rows[:AGENT_SESSIONS_SHOWN]:
        t.add_row(
            fmt(r.get("session")), fmt(r.get("requests")), fmt(r.get("ok")),
            fmt(r.get("max_depth")), fmt(r.get("wall_ms"), 1), fmt(r.get("critical_path_ms"), 1),
            fmt(r.get("queueing_ms"), 1), fmt(r.get("generation_ms"), 1),
            _share(r.get("queueing_share")),
        )  # fmt: skip
    console.print(t)
    d = Table(title="TTFT by depth (ms; ok requests)")
    for col in ("depth", "requests", "ok", "mean", "p50", "p99"):
        d.add_column(col, justify="right")
    for r in tables.get("depths") or []:
        if isinstance(r, dict):
            st = r.get("ttft") or {}
            d.add_row(
                fmt(r.get("depth")), fmt(r.get("requests")), fmt(r.get("ok")),
                *(fmt(_pct(st, k), 2) for k in ("mean", "p50", "p99")),
            )  # fmt: skip
    console.print(d)


def _share(v: Any) -> str:
    return f"{v * 100:.1f}%" if isinstance(v, int | float) else "no data"


def prefix_cache_line(cache: dict[str, Any]) -> str:
    """The server's prefix-cache hit ratio over the run (``load.server_metrics.prefix_cache``,
    else the responses' cached-token counts: ``responses_prefix_cache``)."""
    ratio = cache.get("hit_ratio")
    if cache.get("source") == "responses":
        if not isinstance(ratio, int | float):
            return "server prefix cache (from the responses): no prompt tokens reported"
        return (
            f"server prefix cache: {ratio * 100:.1f}% of {fmt(cache.get('queried_tokens'))} "
            f"prompt tokens were served from the cache (source: the cached-token counts in "
            f"{cache.get('requests')} successful requests' responses; no /metrics counters)"
        )
    if not isinstance(ratio, int | float):
        return "server prefix cache: no prompt token was looked up during the run"
    return (
        f"server prefix cache: {ratio * 100:.1f}% of {fmt(cache.get('queried_tokens'), 0)} "
        f"queried prompt tokens were hits ({cache.get('source')} counters, warm-ups included)"
    )


def render_server_timing(t: dict[str, Any], console: Console) -> None:
    """The server's own prefill / decode time beside the client's TTFT / ITL / TPOT."""
    table = Table(title=f"Server's own timing ({t.get('source')} /metrics) beside the client's")
    table.add_column("server (ms)")
    table.add_column("value", justify="right")
    table.add_column("client (ms, mean)")
    table.add_column("value", justify="right")
    table.add_row(
        "prefill per request",
        fmt(t.get("server_prefill_ms_per_request"), 3),
        "TTFT",
        fmt(t.get(client_mean_key(TTFT)), 3),
    )
    table.add_row(
        "decode per token",
        fmt(t.get("server_decode_ms_per_token"), 3),
        "ITL / TPOT",
        f"{fmt(t.get(client_mean_key(ITL)), 3)} / {fmt(t.get(client_mean_key(TPOT)), 3)}",
    )
    console.print(table)
    if t.get("basis"):
        console.print(f"server timing: {t['basis']}")


def _render_errors(req: dict[str, Any], console: Console) -> None:
    errors = req.get("error_reasons") or []
    if errors:
        et = Table(title="Errors by reason")
        et.add_column("reason")
        et.add_column("count", justify="right")
        for e in errors:
            et.add_row(str(e["reason"]), str(e["count"]))
        console.print(et)


def _render_latencies(m: dict[str, Any], console: Console, spec: dict[str, Any]) -> None:
    table = Table(title="Latency (ms); TTFOT = time to first output (non-reasoning) token")
    table.add_column("metric")
    table.add_column("per")
    table.add_column("n", justify="right")
    table.add_column("mean", justify="right")
    for key in PCT_KEYS:
        table.add_column(key.replace("_", "."), justify="right")
    for key, label, agg in latency_rows(spec):
        dist = m.get(key)
        if not isinstance(dist, dict):
            continue
        if dist.get("count") in (0, None):
            reason = dist.get("reason") or "no data"
            table.add_row(label, agg, "0", reason, *[""] * len(PCT_KEYS))
            continue
        table.add_row(
            label,
            agg,
            str(dist.get("count")),
            fmt(dist.get("mean")),
            *[fmt(_pct(dist, k)) for k in PCT_KEYS],
        )
    console.print(table)


PHASE_LABELS = (
    ("queued", "queue wait"),
    ("connect", "connect"),
    ("tls", "tls"),
    ("sending", "sending"),
    ("waiting", "waiting"),
    ("first_token", "first token"),
)


def phase_line(phases: dict[str, Any]) -> str:
    """The run's phases as one line: "queue wait 0.000/0.010 · connect — · ..." ("" without)."""
    if not phases or "no_data" in phases:
        return ""
    parts = []
    for key, label in PHASE_LABELS:
        p = phases.get(key) or {}
        if not p.get("n"):
            parts.append(f"{label} —")
        else:
            parts.append(f"{label} {p['p50_ms']:.3f}/{p['p99_ms']:.3f}")
    return " · ".join(parts)


def render_profile(prof: dict[str, Any], console: Console) -> None:
    t = Table(title=f"As {prof.get('name')} defines them")
    t.add_column("metric")
    t.add_column("definition")
    t.add_column("mean / value", justify="right")
    for key in ("p50", "p90", "p99"):
        t.add_column(key, justify="right")
    for entry in (prof.get("metrics") or {}).values():
        if entry.get("value") is not None or entry.get("count") in (0, None):
            value = entry.get("value")
            t.add_row(
                f"{entry['label']} ({entry['unit']})",
                str(entry.get("definition", "")),
                fmt(value) if value is not None else (entry.get("reason") or "no data"),
                "",
                "",
                "",
            )
            continue
        t.add_row(
            f"{entry['label']} ({entry['unit']})",
            str(entry.get("definition", "")),
            fmt(entry.get("mean")),
            *[fmt(_pct(entry, k)) for k in ("p50", "p90", "p99")],
        )
    console.print(t)


TONE_STYLE = {"good": "green", "bad": "bold red", "warn": "bold yellow"}
SEVERITY_STYLE = {"bad": "bold red", "warn": "yellow", "info": "dim"}


def render_verdict(validity: dict[str, Any], console: Console) -> None:
    """The report's verdict (``app.analysis.verdict``): its word, then each issue."""
    word = validity.get("verdict")
    if not isinstance(word, str):
        return
    style = TONE_STYLE.get(str(validity.get("tone") or ""), "")
    console.print(f"verdict: [{style}]{word}[/]" if style else f"verdict: {word}")
    for issue in validity.get("issues") or []:
        if isinstance(issue, dict):
            sty = SEVERITY_STYLE.get(str(issue.get("severity")), "")
            text = escape(str(issue.get("text")))
            console.print(f"  [{sty}]{text}[/]" if sty else f"  {text}")


def _valid_cell(run: dict[str, Any]) -> str:
    """The runs table's verdict cell: the word, and its first issue's short form when that
    says more ("incomplete: lost 20")."""
    v = verdict_of(run)
    first = v.issues[0].short if v.issues else v.word
    return v.word if first == v.word else f"{v.word}: {first}"


def render_runs(runs: list[dict[str, Any]], console: Console) -> None:
    if not runs:
        console.print("No runs yet. Start one with: tokentrace bench --base-url URL --model NAME")
        return
    t = Table(title="Runs")
    heads = [headline_heading(hm, stat) for hm, stat, _ in headline_cells()]
    for col in ("id", "created", "source", "model", "status", "verdict", *heads, "error rate"):
        t.add_column(col)
    for r in runs:
        s = r.get("summary") or {}
        spec = r.get("spec") or {}
        t.add_row(
            str(r["id"]),
            str(r.get("created_at") or "")[:19],
            str(r.get("source")),
            str(spec.get("model") or r.get("name") or ""),
            str(r.get("status")),
            _valid_cell(r),
            *(fmt(s.get(key)) for _, _, key in headline_cells()),
            fmt(s.get("error_rate"), 4),
        )
    console.print(t)


def render_file_figures(figs: dict[str, Any], console: Console) -> None:
    """An imported file's own figures beside ours computed under its tool's definitions."""
    name = f" ({figs['file_name']})" if figs.get("file_name") else ""
    t = Table(title=f"{figs.get('tool')}'s own figures{name} beside ours, by its definitions")
    for col in ("metric", "stat", "file", "ours", "diff"):
        t.add_column(col, justify="left" if col in ("metric", "stat") else "right")
    for r in figs.get("rows") or []:
        unit = f" ({r['unit']})" if r.get("unit") else ""
        diff = r.get("diff_pct")
        t.add_row(
            f"{r['label']}{unit}",
            str(r["stat"]),
            fmt(r.get("file"), 3),
            fmt(r.get("ours"), 3),
            "—" if diff is None else f"{diff:+.2f}%",
        )
    console.print(t)
    if figs.get("window_note"):
        console.print(f"note: {figs['window_note']}")
