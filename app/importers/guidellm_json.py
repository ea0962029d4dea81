"""Parse a GuideLLM benchmark report (``--output kind=json``; checked against GuideLLM 0.8.1's
own files). Pure: no I/O.

Every benchmark in ``benchmarks`` becomes a run; together they form one sweep. GuideLLM keeps
no per-token times, only each request's first and last token iteration: the runs are
summary-only (two token events per request: the first token, then the rest at the last).

GuideLLM lists its warm-up and cool-down requests in ``requests`` too, but its metrics count
only those within the benchmark's measurement window (``start_time`` .. ``end_time``, which
are ``scheduler_metrics.measure_start_time`` / ``measure_end_time``): a request ending
before the window starts or starting after it ends. Such requests are imported as warm-up
requests, so our figures exclude them as GuideLLM's do.

Multi-turn benchmarks: a request's ``info.conversation_id`` and ``info.turn_index`` (from 0)
give its session (numbered 0, 1, ... in the order of each conversation's first request
start) and turn (from 1), when some request of the benchmark has a turn index above 0; a
single-turn benchmark keeps none. The server's cached prompt tokens are the request's
``cached_tokens`` (``input_metrics.cached_tokens``) where the file has them.
"""

from __future__ import annotations

from typing import Any

from app.analysis.percentiles import percentile_key
from app.domain import RequestRecord, RequestStatus
from app.importers.common import (
    FileFigures,
    ImportedRun,
    ImportFormatError,
    as_dict,
    as_list,
    failed_record,
    integer,
    json_objects,
    ns,
    numbered_name,
    opt_number,
    two_point_record,
)
from app.importers.csv_log import MAX_COUNT

# profile metric key -> (GuideLLM metric, scale to ms)
LATENCIES = {
    "ttft": ("time_to_first_token_ms", 1.0),
    "ttfot": ("time_to_first_output_token_ms", 1.0),
    "itl": ("inter_token_latency_ms", 1.0),
    "tpot": ("time_per_output_token_ms", 1.0),
    "e2el": ("request_latency", 1000.0),
}
RATES = {
    "request_throughput": "requests_per_second",
    "output_throughput": "output_tokens_per_second",
    "total_token_throughput": "tokens_per_second",
}


def _pct(key: str) -> float | None:
    """GuideLLM's percentile keys: p001 = 0.1, p01 = 1, p50 = 50, p999 = 99.9."""
    digits = key[1:]
    if not (key.startswith("p") and digits.isdigit()):
        return None
    if len(digits) == 3:
        return int(digits) / 10.0
    return float(int(digits))


def _summary(obj: Any, where: str, scale: float) -> dict[str, float | None]:
    d = as_dict(obj, where)
    out: dict[str, float | None] = {}
    for stat, key in (("mean", "mean"), ("std", "std_dev"), ("max", "max")):
        v = opt_number(d.get(key), f"{where}.{key}")
        out[stat] = None if v is None else v * scale
    pcts = as_dict(d.get("percentiles") or {}, f"{where}.percentiles")
    for key, value in pcts.items():
        p = _pct(key)
        if p is None:
            raise ImportFormatError(f"{where}.percentiles: unknown key {key!r}")
        v = opt_number(value, f"{where}.percentiles.{key}")
        out[percentile_key(p)] = None if v is None else v * scale
    count = d.get("count")
    if count is not None and integer(count, f"{where}.count", minimum=0) == 0:
        return {k: None for k in out}
    return out


def file_figures(metrics: dict[str, Any], where: str) -> FileFigures:
    figs: FileFigures = {}
    for key, (name, scale) in LATENCIES.items():
        if name in metrics:
            m = as_dict(metrics[name], f"{where}.{name}")
            figs[key] = _summary(m.get("successful"), f"{where}.{name}.successful", scale)
    for key, name in RATES.items():
        if name in metrics:
            m = as_dict(metrics[name], f"{where}.{name}")
            s = as_dict(m.get("successful"), f"{where}.{name}.successful")
            figs[key] = {"value": opt_number(s.get("mean"), f"{where}.{name}.successful.mean")}
    return figs


def _tokens(req: dict[str, Any], where: str, key: str, metrics_key: str) -> int | None:
    v = req.get(key)
    if v is None:
        block = req.get(metrics_key)
        if isinstance(block, dict):
            v = block.get("text_tokens")
    return None if v is None else integer(v, f"{where}.{key}", minimum=0)


def _cached(req: dict[str, Any], where: str) -> int | None:
    v = req.get("cached_tokens")
    if v is None:
        block = req.get("input_metrics")
        if isinstance(block, dict):
            v = block.get("cached_tokens")
    return None if v is None else integer(v, f"{where}.cached_tokens", minimum=0, maximum=MAX_COUNT)


def _sessions(
    parsed: list[tuple[str, str, dict[str, Any], dict[str, float | None]]],
) -> list[tuple[int, int]] | None:
    """Each request's (session, turn) for a multi-turn benchmark, None for a single-turn one."""
    keys: list[str] = []
    turns: list[int] = []
    starts: list[float] = []
    for _group, at, req, t in parsed:
        info = req["info"]
        raw = info.get("turn_index")
        turns.append(
            0
            if raw is None
            else integer(raw, f"{at}.info.turn_index", minimum=0, maximum=MAX_COUNT - 1)
        )
        conv = info.get("conversation_id")
        keys.append(f"c:{conv}" if isinstance(conv, str) and conv else f"request:{at}")
        start = t["request_start"] if t["request_start"] is not None else t["request_end"]
        starts.append(float("inf") if start is None else start)
    if not any(k > 0 for k in turns):
        return None
    first: dict[str, float] = {}
    for key, start in zip(keys, starts, strict=True):
        first[key] = min(start, first.get(key, start))
    number = {key: k for k, key in enumerate(sorted(first, key=lambda c: (first[c], c)))}
    return [(number[key], turn + 1) for key, turn in zip(keys, turns, strict=True)]


def measure_window(bench: dict[str, Any], where: str) -> tuple[float | None, float | None]:
    """The benchmark's measurement window (epoch seconds): ``start_time`` / ``end_time``, or
    the scheduler metrics' ``measure_start_time`` / ``measure_end_time``."""
    sched = bench.get("scheduler_metrics")
    sched = sched if isinstance(sched, dict) else {}
    out: list[float | None] = []
    for key, alt in (("start_time", "measure_start_time"), ("end_time", "measure_end_time")):
        v = opt_number(bench.get(key), f"{where}.{key}")
        if v is None:
            v = opt_number(sched.get(alt), f"{where}.scheduler_metrics.{alt}")
        out.append(v)
    return out[0], out[1]


def outside_window(
    start: float | None, end: float | None, window: tuple[float | None, float | None]
) -> bool:
    """GuideLLM's rule: a request counts when it ends at or after the window's start and
    starts at or before its end (a request without a start: ends at or before the end)."""
    lo, hi = window
    if lo is not None and end is not None and end < lo:
        return True
    if hi is not None:
        first = start if start is not None else end
        if first is not None and first > hi:
            return True
    return False


def _requests(bench: dict[str, Any], where: str) -> list[RequestRecord]:
    groups = as_dict(bench.get("requests"), f"{where}.requests")
    flat: list[tuple[str, int, dict[str, Any]]] = []
    for group in ("successful", "errored", "incomplete"):
        for j, req in enumerate(as_list(groups.get(group) or [], f"{where}.requests.{group}")):
            flat.append((group, j, as_dict(req, f"{where}.requests.{group}[{j}]")))
    parsed: list[tuple[str, str, dict[str, Any], dict[str, float | None]]] = []
    for group, j, req in flat:
        at = f"{where}.requests.{group}[{j}]"
        info = as_dict(req.get("info"), f"{at}.info")
        timings = as_dict(info.get("timings"), f"{at}.info.timings")
        t = {
            k: opt_number(timings.get(k), f"{at}.info.timings.{k}")
            for k in ("request_start", "first_token_iteration", "last_token_iteration")
        }
        t["request_end"] = opt_number(timings.get("request_end"), f"{at}.info.timings.request_end")
        parsed.append((group, at, req, t))
    starts = [t["request_start"] for _g, _a, _r, t in parsed if t["request_start"] is not None]
    origin = min(starts) if starts else 0.0

    def rel(v: float | None) -> int | None:
        return None if v is None else ns(v - origin)

    window = measure_window(bench, where)
    sessions = _sessions(parsed)
    records: list[RequestRecord] = []
    for i, (group, at, req, t) in enumerate(parsed):
        n_in = _tokens(req, at, "prompt_tokens", "input_metrics")
        sent = rel(t["request_start"])
        end = rel(t["request_end"])
        warmup = outside_window(t["request_start"], t["request_end"], window)
        if group != "successful":
            info = req["info"]
            error = info.get("error") or ("incomplete" if group == "incomplete" else "errored")
            rec = failed_record(i, sent_ns=sent, end_ns=end, error=str(error), input_tokens=n_in)
            if group == "incomplete":
                rec.status = RequestStatus.CANCELLED
            rec.warmup = warmup
            _place(rec, sessions, i)
            records.append(rec)
            continue
        for k in ("request_start", "first_token_iteration", "last_token_iteration", "request_end"):
            if t[k] is None:
                raise ImportFormatError(f"{at}.info.timings.{k}: missing")
        n_out = _tokens(req, at, "output_tokens", "output_metrics")
        if n_out is None:
            raise ImportFormatError(f"{at}.output_tokens: missing")
        first, last = rel(t["first_token_iteration"]), rel(t["last_token_iteration"])
        assert sent is not None and first is not None and last is not None and end is not None
        if first < sent:
            raise ImportFormatError(f"{at}: first_token_iteration before request_start")
        if last < first:
            raise ImportFormatError(f"{at}: last_token_iteration before first_token_iteration")
        rec = two_point_record(
            i,
            sent_ns=sent,
            first_ns=first,
            last_ns=last,
            end_ns=max(end, last),
            output_tokens=n_out,
            input_tokens=n_in,
        )
        rec.cached_prompt_tokens = _cached(req, at)
        rec.warmup = warmup
        _place(rec, sessions, i)
        records.append(rec)
    return records


def _place(rec: RequestRecord, sessions: list[tuple[int, int]] | None, i: int) -> None:
    if sessions is not None:
        rec.session, rec.turn = sessions[i]


def _window_notes(bench: dict[str, Any], records: list[RequestRecord], where: str) -> list[str]:
    """Say how many requests fell outside the measurement window, and whether the requests
    kept agree with GuideLLM's own count of successful requests."""
    notes: list[str] = []
    outside = sum(1 for r in records if r.warmup)
    if outside:
        notes.append(
            f"{outside} of {len(records)} requests in the file lie outside GuideLLM's "
            "measurement window (warm-up or cool-down): kept as warm-up and excluded, as "
            "GuideLLM's own metrics exclude them"
        )
    totals = (bench.get("metrics") or {}).get("request_totals")
    theirs = totals.get("successful") if isinstance(totals, dict) else None
    if isinstance(theirs, int) and not isinstance(theirs, bool):
        ours = sum(1 for r in records if not r.warmup and r.status is RequestStatus.OK)
        if ours != theirs:
            notes.append(
                f"GuideLLM counts {theirs} successful requests in its metrics, the file lists "
                f"{ours} in its measurement window (it may keep only a sample): figures differ"
            )
    return notes


def _strategy(bench: dict[str, Any]) -> str:
    cfg = bench.get("config") if isinstance(bench.get("config"), dict) else {}
    strat = cfg.get("strategy") if isinstance(cfg, dict) else None
    if not isinstance(strat, dict):
        return "benchmark"
    kind = str(strat.get("type_") or strat.get("type") or "benchmark")
    for key in ("streams", "rate", "max_concurrency"):
        if strat.get(key) is not None:
            return f"{kind} {key} {strat[key]}"
    return kind


def _load(bench: dict[str, Any]) -> tuple[float | None, str]:
    """The offered load of a benchmark: (rate in req/s, "rate") or (streams, "concurrency");
    (None, "index") for a throughput (unbounded) benchmark."""
    cfg = bench.get("config") if isinstance(bench.get("config"), dict) else {}
    strat = cfg.get("strategy") if isinstance(cfg, dict) else None
    if not isinstance(strat, dict):
        return None, "index"
    kind = str(strat.get("type_") or strat.get("type") or "")
    if kind == "synchronous":
        return 1.0, "concurrency"
    for key, load_kind in (
        ("rate", "rate"),
        ("streams", "concurrency"),
        ("max_concurrency", "concurrency"),
    ):
        v = strat.get(key)
        if isinstance(v, int | float) and not isinstance(v, bool) and v > 0:
            return float(v), load_kind
    return None, "index"


def parse_guidellm(text: str, *, name: str = "guidellm") -> list[ImportedRun]:
    """One run per benchmark; ``ImportFormatError`` names the first bad field."""
    objs = json_objects(text)
    if len(objs) != 1:
        raise ImportFormatError(f"expected one JSON document, found {len(objs)}")
    top = as_dict(objs[0], "file")
    benches = as_list(top.get("benchmarks"), "benchmarks")
    if not benches:
        raise ImportFormatError("benchmarks: the list is empty")
    metadata = top.get("metadata")
    version = metadata.get("guidellm_version") if isinstance(metadata, dict) else None
    tool = f"GuideLLM {version}" if version else "GuideLLM"
    spec = (top.get("config") or {}).get("spec") if isinstance(top.get("config"), dict) else None
    backend = spec.get("backend") if isinstance(spec, dict) else None
    model = backend.get("model") if isinstance(backend, dict) else None
    target = backend.get("target") if isinstance(backend, dict) else None
    runs: list[ImportedRun] = []
    for k, b in enumerate(benches):
        where = f"benchmarks[{k}]"
        bench = as_dict(b, where)
        metrics = as_dict(bench.get("metrics"), f"{where}.metrics")
        duration = opt_number(bench.get("duration"), f"{where}.duration", minimum=0)
        records = _requests(bench, where)
        strategy = _strategy(bench)
        runs.append(
            ImportedRun(
                name=numbered_name(name, f" #{k + 1} ({strategy})") if len(benches) > 1 else name,
                format="guidellm",
                tool=tool,
                profile="guidellm",
                records=records,
                summary_only=True,
                figures=file_figures(metrics, f"{where}.metrics"),
                model=str(model) if model else None,
                target_url=str(target) if target else None,
                window_s=duration,
                notes=[
                    "GuideLLM keeps only each request's first and last token times",
                    *_window_notes(bench, records, where),
                ],
                meta={
                    "guidellm_version": version,
                    "benchmark_index": k,
                    "strategy": strategy,
                    "load": _load(bench)[0],
                    "load_kind": _load(bench)[1],
                    "duration_s": duration,
                    "start_time": bench.get("start_time"),
                    "end_time": bench.get("end_time"),
                },
            )
        )
    return runs
