"""Parse an AIPerf per-request export (``profile_export.jsonl``) and, when given, its summary
(``profile_export_aiperf.json``); checked against AIPerf 0.13's own files. Pure: no I/O.

Each JSONL line is one request: ``metadata.request_start_ns`` / ``request_end_ns`` (epoch
ns), ``metrics.time_to_first_token`` and the per-chunk ``metrics.inter_chunk_latency`` list
give every token-bearing response's time (first at start + TTFT, the next ones a chunk gap
apart). A line with ``error`` is a failed request, its reason built from AIPerf's
``ErrorDetails`` (``code``: an HTTP status or None, ``type``, ``message``). Warm-up lines are
kept, flagged.

Multi-turn files: each line's ``metadata.x_correlation_id`` (shared by a session's turns;
else ``session_num``) and ``metadata.turn_index`` (from 0) give the request's session
(numbered 0, 1, ... in the order of each session's first request start) and turn (from 1),
when some line has a turn index above 0; a single-turn file keeps none. The server's cached
prompt tokens are ``metrics.usage_prompt_cache_read_tokens`` where the file has them.
"""

from __future__ import annotations

from typing import Any

from app.analysis.percentiles import percentile_key
from app.domain import RequestRecord
from app.importers.common import (
    FileFigures,
    ImportedRun,
    ImportFormatError,
    as_dict,
    as_list,
    chunk_record,
    failed_record,
    integer,
    json_objects,
    number,
    opt_number,
)
from app.importers.csv_log import MAX_COUNT

_TO_MS = {"ms": 1.0, "s": 1000.0, "sec": 1000.0, "us": 1e-3, "ns": 1e-6}
SUMMARY_LATENCIES = {
    "ttft": "time_to_first_token",
    "ttst": "time_to_second_token",
    "itl": "inter_token_latency",
    "inter_chunk_latency": "inter_chunk_latency",
    "e2el": "request_latency",
}
SUMMARY_RATES = {
    "request_throughput": "request_throughput",
    "output_throughput": "output_token_throughput",
    "total_token_throughput": "total_token_throughput",
}


def _ms(metric: Any, where: str) -> float | list[float]:
    m = as_dict(metric, where)
    unit = str(m.get("unit", "ms"))
    if unit not in _TO_MS:
        raise ImportFormatError(f"{where}.unit: unexpected unit {unit!r}")
    value = m.get("value")
    if isinstance(value, list):
        scale = _TO_MS[unit]
        return [number(v, f"{where}.value[{j}]", minimum=0) * scale for j, v in enumerate(value)]
    return number(value, f"{where}.value", minimum=0) * _TO_MS[unit]


def _count(metrics: dict[str, Any], key: str, where: str) -> int | None:
    if key not in metrics:
        return None
    m = as_dict(metrics[key], f"{where}.{key}")
    return integer(m.get("value"), f"{where}.{key}.value", minimum=0)


def failure_reason(err: Any) -> str:
    """A failed line's reason: "HTTP 500: message", "ClientConnectorError: message", the
    text of an older string error; never "None" (a missing part is left out)."""
    if isinstance(err, dict):
        code, kind, msg = err.get("code"), err.get("type"), err.get("message")
        head = ""
        if isinstance(code, int) and not isinstance(code, bool):
            head = f"HTTP {code}" if 100 <= code <= 599 else f"code {code}"
        elif isinstance(kind, str) and kind.strip():
            head = kind.strip()
        text = msg.strip() if isinstance(msg, str) else ""
        if head and text:
            return f"{head}: {text}"
        if head or text:
            return head or text
    elif err is not None:
        text = str(err).strip()
        if text and text not in ("None", "null"):
            return text
    return "error (AIPerf recorded no code, type or message)"


def _record(i: int, line_no: int, obj: Any, origin_ns: int) -> RequestRecord:
    where = f"line {line_no}"
    d = as_dict(obj, where)
    meta = as_dict(d.get("metadata"), f"{where}.metadata")
    metrics = as_dict(d.get("metrics") or {}, f"{where}.metrics")
    start = integer(meta.get("request_start_ns"), f"{where}.metadata.request_start_ns")
    end_raw = meta.get("request_end_ns")
    end = None if end_raw is None else integer(end_raw, f"{where}.metadata.request_end_ns")
    sent = start - origin_ns
    end_rel = None if end is None else end - origin_ns
    warmup = meta.get("benchmark_phase") not in (None, "profiling")
    if d.get("error") is not None or meta.get("was_cancelled"):
        err = d.get("error")
        msg = "cancelled" if err is None else failure_reason(err)
        n_in = _count(metrics, "error_isl", f"{where}.metrics")
        rec = failed_record(i, sent_ns=sent, end_ns=end_rel, error=msg, input_tokens=n_in)
        rec.warmup = warmup
        return rec
    if "time_to_first_token" not in metrics:
        raise ImportFormatError(f"{where}.metrics.time_to_first_token: missing")
    ttft = _ms(metrics["time_to_first_token"], f"{where}.metrics.time_to_first_token")
    gaps: list[float] = []
    if "inter_chunk_latency" in metrics:
        raw = _ms(metrics["inter_chunk_latency"], f"{where}.metrics.inter_chunk_latency")
        gaps = raw if isinstance(raw, list) else [raw]
    assert isinstance(ttft, float)
    t = sent + round(ttft * 1e6)
    chunk_t = [t]
    for g in gaps:
        t += round(g * 1e6)
        chunk_t.append(t)
    n_out = _count(metrics, "output_sequence_length", f"{where}.metrics")
    rec = chunk_record(
        i,
        sent_ns=sent,
        chunk_t_ns=chunk_t,
        output_tokens=n_out,
        input_tokens=_count(metrics, "input_sequence_length", f"{where}.metrics"),
        end_ns=end_rel if end_rel is not None and end_rel >= chunk_t[-1] else None,
        usage_completion_tokens=_count(metrics, "usage_completion_tokens", f"{where}.metrics"),
        usage_prompt_tokens=_count(metrics, "usage_prompt_tokens", f"{where}.metrics"),
    )
    cached = metrics.get("usage_prompt_cache_read_tokens")
    if cached is not None:
        at = f"{where}.metrics.usage_prompt_cache_read_tokens"
        value = as_dict(cached, at).get("value")
        rec.cached_prompt_tokens = integer(value, f"{at}.value", minimum=0, maximum=MAX_COUNT)
    rec.warmup = warmup
    return rec


def _session_keys(objs: list[tuple[int, Any]], starts: list[int]) -> list[tuple[int, int]] | None:
    """Each line's (session, turn) for a multi-turn file, None for a single-turn one."""
    keys: list[str] = []
    turns: list[int] = []
    for no, obj in objs:
        md = obj["metadata"]
        where = f"line {no}.metadata"
        raw_turn = md.get("turn_index")
        turns.append(
            0
            if raw_turn is None
            else integer(raw_turn, f"{where}.turn_index", minimum=0, maximum=MAX_COUNT - 1)
        )
        corr = md.get("x_correlation_id")
        if isinstance(corr, str) and corr:
            keys.append(f"c:{corr}")
        elif md.get("session_num") is not None:
            num = integer(
                md.get("session_num"), f"{where}.session_num", minimum=0, maximum=MAX_COUNT
            )
            keys.append(f"n:{num}")
        else:
            keys.append(f"line:{no}")
    if not any(t > 0 for t in turns):
        return None
    first: dict[str, int] = {}
    for key, start in zip(keys, starts, strict=True):
        first[key] = min(start, first.get(key, start))
    number = {key: k for k, key in enumerate(sorted(first, key=lambda c: (first[c], c)))}
    return [(number[key], t + 1) for key, t in zip(keys, turns, strict=True)]


def _stats(metric: Any, where: str) -> dict[str, float | None]:
    m = as_dict(metric, where)
    unit = str(m.get("unit", "ms"))
    scale = _TO_MS.get(unit)
    if scale is None:
        raise ImportFormatError(f"{where}.unit: unexpected unit {unit!r}")
    out: dict[str, float | None] = {}
    for key, value in m.items():
        if key in ("unit", "count", "sum", "min"):
            continue
        stat = {"avg": "mean", "std": "std", "max": "max"}.get(key)
        if stat is None and key.startswith("p") and key[1:].replace(".", "", 1).isdigit():
            stat = percentile_key(float(key[1:]))
        if stat is None:
            continue
        v = opt_number(value, f"{where}.{key}")
        out[stat] = None if v is None else v * scale
    return out


def summary_figures(summary: dict[str, Any]) -> FileFigures:
    figs: FileFigures = {}
    for key, name in SUMMARY_LATENCIES.items():
        if name in summary:
            figs[key] = _stats(summary[name], f"summary.{name}")
    for key, name in SUMMARY_RATES.items():
        if name in summary:
            m = as_dict(summary[name], f"summary.{name}")
            figs[key] = {"value": opt_number(m.get("avg"), f"summary.{name}.avg")}
    return figs


def parse_aiperf(
    jsonl: str, summary_text: str | None = None, *, name: str = "aiperf"
) -> ImportedRun:
    """The export as one run; ``ImportFormatError`` names the first bad line or field."""
    lines = [(no, line) for no, line in enumerate(jsonl.splitlines(), start=1) if line.strip()]
    if not lines:
        raise ImportFormatError("the file has no records")
    objs: list[tuple[int, Any]] = []
    for no, line in lines:
        try:
            (obj,) = json_objects(line, what=f"line {no}")
        except ImportFormatError as e:
            raise ImportFormatError(f"line {no}: {str(e).split(': ', 1)[-1]}") from None
        except ValueError:
            raise ImportFormatError(f"line {no}: more than one JSON value") from None
        objs.append((no, obj))
    starts = []
    for no, obj in objs:
        md = as_dict(as_dict(obj, f"line {no}").get("metadata"), f"line {no}.metadata")
        starts.append(integer(md.get("request_start_ns"), f"line {no}.metadata.request_start_ns"))
    origin = min(starts)
    records = [_record(i, no, obj, origin) for i, (no, obj) in enumerate(objs)]
    sessions = _session_keys(objs, starts)
    if sessions is not None:
        for rec, (session, turn) in zip(records, sessions, strict=True):
            rec.session, rec.turn = session, turn
    figures: FileFigures = {}
    meta: dict[str, Any] = {"requests": len(records)}
    window_s: float | None = None
    notes: list[str] = []
    if summary_text is not None:
        (top,) = json_objects(summary_text, what="summary")[:1]
        summary = as_dict(top, "summary")
        figures = summary_figures(summary)
        dur = summary.get("benchmark_duration")
        if isinstance(dur, dict):
            window_s = opt_number(dur.get("avg"), "summary.benchmark_duration.avg", minimum=0)
        for key in ("aiperf_version", "benchmark_id", "start_time", "end_time", "schema_version"):
            if key in summary:
                meta[key] = summary[key]
    else:
        notes.append("no summary file (profile_export_aiperf.json): AIPerf's own figures absent")
    version = meta.get("aiperf_version")
    return ImportedRun(
        name=name,
        format="aiperf",
        tool=f"AIPerf {version}" if version else "AIPerf",
        profile="aiperf",
        records=records,
        summary_only=False,
        figures=figures,
        window_s=window_s,
        notes=notes,
        meta=meta,
    )


__all__ = ["as_list", "parse_aiperf", "summary_figures"]
