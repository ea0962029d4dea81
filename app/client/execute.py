"""Execute one load with its observers, and say what it was: the one path every bench run,
sweep step and worker job takes.

``execute`` asks each target which models it serves and which engine it is
(``target_identity``: GET /v1/models, /version, /server_info, once), scrapes its
``/metrics`` beside the load (``metrics_scraper``), runs the load, then builds the run's
metadata (``RunMeta``: validity notes, load statistics, token-count agreement, the scrape's
status and the server's own timing). The status of a finished load follows the one rule,
``app.analysis.trust.run_status``.
"""

from __future__ import annotations

import asyncio
import dataclasses
import platform
from collections.abc import Awaitable, Callable, Collection, Sequence
from dataclasses import dataclass, field
from typing import Any

from app import __version__
from app.analysis.agent_sessions import STATS_KEY as AGENT_KEY
from app.analysis.agent_sessions import agent_tables, rows_of_records
from app.analysis.groups import STATS_KEY as GROUPS_KEY
from app.analysis.groups import group_tables
from app.analysis.prefix_cache import prefix_cache, records_prefix_cache
from app.analysis.server_timing import server_timing
from app.analysis.trust import DEFAULT_MAX_ERROR_RATE, failure_note, run_status, tally
from app.analysis.turns import turn_table
from app.client import target_identity
from app.client.lanes import REFUSED_LINK_LOCAL, link_local_urls
from app.client.load_result import LagStats, LoadResult
from app.client.metrics_scraper import LiveSource, MetricsScraper, to_run_axis
from app.client.server_controls import STATS_KEY as SERVER_CONTROLS_KEY
from app.client.server_controls import metrics_url
from app.client.spec import RunSpec
from app.client.target_keys import key_may_reach, resolve_api_key
from app.client.target_scrapes import TargetsLive, scrape_urls, start_scrapers, stop_scrapers
from app.domain import RequestRecord, RequestStatus, RunStatus
from app.protocol.prometheus import Series, wanted
from app.protocol.wire import RunMeta, ServerMetricSeries

SCRAPE_STATS_KEY = "server_metrics"
NO_STREAM_NOTE = (
    "not streamed (stream false): each answer came whole, so TTFT is the end-to-end latency "
    "and there is no inter-token latency (ITL, TPOT: no data)"
)


@dataclass(frozen=True, slots=True)
class Executed:
    """A load's outcome: its result and metadata, or the exception it raised."""

    spec: RunSpec
    result: LoadResult | None  # None: the load raised ``error``
    error: Exception | None
    meta: RunMeta | None  # None with ``result``
    series: list[Series]  # the target's /metrics, on the run's time axis

    def status(self) -> RunStatus:
        """The finished load's status by the one rule (``outcome_status``)."""
        if self.result is None:
            return RunStatus.FAILED
        return outcome_status(self.result, self.spec.max_error_rate)


async def execute(
    spec: RunSpec,
    load: Callable[[], Awaitable[LoadResult]],
    *,
    on_scraper: Callable[[LiveSource], None] | None = None,
    allow_link_local: bool = True,
) -> Executed:
    """Run ``load()`` with the served-models check and the /metrics scraper around it
    (``on_scraper`` is handed the scraper once started, a run of several targets' all
    together (``TargetsLive``): a worker reads its latest values into its heartbeats).

    An ``Exception`` from the load is returned (``Executed.error``); anything else (a
    cancellation, Ctrl-C) stops the scraper and propagates. A key of this machine's that may
    not go to the target (``target_keys``) is returned as the error before anything is sent.
    ``allow_link_local=False`` (a worker's default): a target or /metrics URL resolving to a
    link-local address is neither asked its identity nor scraped (the load refuses it too:
    ``lanes.resolve_lanes``)."""
    try:
        keyed = resolve_api_key(spec)
    except ValueError as e:
        return Executed(spec, None, e, None, [])
    refused: set[str] = set()
    if not allow_link_local:
        refused = await link_local_urls([*keyed.targets(), *scrape_targets(keyed)])
    why = f"it {REFUSED_LINK_LOCAL}"
    identities = await asyncio.to_thread(  # each target's
        target_identity.fetch, keyed, {b: why for b in keyed.targets() if b in refused}
    )
    scraper = start_scraper(keyed, refused)
    if scraper is not None and on_scraper is not None:  # several: all targets', summed
        on_scraper(TargetsLive(scraper) if isinstance(scraper, list) else scraper)
    try:
        result = await load()
    except Exception as e:
        await asyncio.to_thread(finish_scrape, scraper, None)
        return Executed(spec, None, e, None, [])
    except BaseException:
        await asyncio.to_thread(finish_scrape, scraper, None)
        raise
    scraped = await asyncio.to_thread(finish_scrape, scraper, result.start_mono_ns)
    not_scraped = [u for u in scrape_targets(keyed) if u in refused]
    if not_scraped and scraper is None:
        scraped = ScrapeOutcome({"status": f"not scraped: {not_scraped[0]} {why}"})
    meta = run_meta(result, spec.max_error_rate)
    if not spec.stream:
        meta.load_stats["stream"] = False
        if spec.surface()[0].streams:  # a surface that never streams needs no such note
            meta.validity.append(NO_STREAM_NOTE)
    attach_scrape(meta.load_stats, scraped, result.records)
    target_identity.record(meta.load_stats, meta.validity, spec, identities)
    return Executed(spec, result, None, meta, scraped.series)


def token_count_check(records: list[RequestRecord]) -> dict[str, Any]:
    """How often the tokenizer's count and the server's usage disagreed."""
    both = [
        r
        for r in records
        if not r.warmup
        and r.status is RequestStatus.OK
        and r.usage_completion_tokens is not None
        and r.tokenizer_output_tokens is not None
    ]
    differing = [r for r in both if r.usage_completion_tokens != r.tokenizer_output_tokens]
    sources = sorted({r.token_source for r in records if r.token_source})
    prompts = [
        r
        for r in records
        if not r.warmup
        and r.status is RequestStatus.OK
        and r.usage_prompt_tokens is not None
        and r.tokenizer_input_tokens is not None
    ]
    n_prompts = len(prompts)
    usage_in = sum(r.usage_prompt_tokens or 0 for r in prompts)
    client_in = sum(r.tokenizer_input_tokens or 0 for r in prompts)
    server_used = bool(prompts) and all(r.input_tokens == r.usage_prompt_tokens for r in prompts)
    return {
        "requests_with_both_counts": len(both),
        "requests_disagreeing": len(differing),
        "tokenizer_output_tokens": sum(r.tokenizer_output_tokens or 0 for r in both),
        "usage_completion_tokens": sum(r.usage_completion_tokens or 0 for r in both),
        "token_sources": sources,
        "prompt_requests_with_both_counts": n_prompts,
        "prompt_requests_disagreeing": sum(
            1 for r in prompts if r.usage_prompt_tokens != r.tokenizer_input_tokens
        ),
        "usage_prompt_tokens": usage_in,
        "tokenizer_prompt_tokens": client_in,
        "prompt_token_source": ("usage" if server_used else "tokenizer") if n_prompts else None,
    }


def prompt_token_note(check: dict[str, Any]) -> str | None:
    """The note when the two prompt counts disagreed on any request, e.g. "prompt tokens:
    server usage 158 vs client tokenizer 128 on average ...; the server's count is used"."""
    n = check.get("prompt_requests_with_both_counts") or 0
    if not n or not check.get("prompt_requests_disagreeing"):
        return None
    usage = check["usage_prompt_tokens"] / n
    client = check["tokenizer_prompt_tokens"] / n
    whose = "the server's" if check.get("prompt_token_source") == "usage" else "the client's"
    return (
        f"prompt tokens: server usage {usage:,.4g} vs client tokenizer {client:,.4g} on average "
        f"({check['prompt_requests_disagreeing']} of {n} requests differ); {whose} count is used"
    )


def validity_notes(
    result: LoadResult, check: dict[str, Any], max_error_rate: float = DEFAULT_MAX_ERROR_RATE
) -> list[str]:
    failed = failure_note(result.records, max_error_rate)
    notes = ([failed] if failed else []) + list(result.client_limited_reasons) + list(result.notes)
    if result.stopped == "stopped":
        notes.append("stopped before the end: the report covers what was measured")
    elif result.stopped == "max_duration":
        notes.append("the run reached its time limit (--max-duration): unsent requests skipped")
    if check["requests_disagreeing"]:
        notes.append(
            f"token counts disagree on {check['requests_disagreeing']} of "
            f"{check['requests_with_both_counts']} requests: tokenizer "
            f"{check['tokenizer_output_tokens']} vs server usage "
            f"{check['usage_completion_tokens']} output tokens"
        )
    prompt_note = prompt_token_note(check)
    if prompt_note:
        notes.append(prompt_note)
    image_note = image_token_note(result)
    if image_note:
        notes.append(image_note)
    return notes


def image_token_note(result: LoadResult) -> str | None:
    """The note of a run whose prompts carry images (``Workload.stats["images"]``) when a
    successful request's prompt tokens are not the server's: the client's tokenizer counts
    the text only, so its images are not counted there."""
    images = (result.workload_stats or {}).get("images")
    if not isinstance(images, int) or not images:
        return None
    ok = [r for r in result.records if not r.warmup and r.status is RequestStatus.OK]
    uncounted = sum(
        1 for r in ok if r.usage_prompt_tokens is None or r.input_tokens != r.usage_prompt_tokens
    )
    if not uncounted:
        return None
    return (
        f"prompt tokens: the image parts are not counted on {uncounted} of {len(ok)} requests "
        f"(the server's usage.prompt_tokens not used; the client's tokenizer counts the text "
        f"only; the run's prompts carry {images:,} images)"
    )


def trace_lateness(records: Sequence[RequestRecord]) -> LagStats:
    """How late each measured request was sent against its scheduled time, which for a
    trace run is the trace's own time (sent - trace time; a request that waited for a
    concurrency slot counts its wait too)."""
    return LagStats.of_ns(
        [r.sent_ns - r.scheduled_ns for r in records if not r.warmup and r.sent_ns is not None]
    )


def load_stats(result: LoadResult) -> dict[str, Any]:
    out: dict[str, Any] = {
        "achieved_send_rate_rps": result.achieved_send_rate,
        "send_lag_ms": dataclasses.asdict(result.send_lag),
        "loop_lag_ms": dataclasses.asdict(result.loop_lag),
        "read_delay_ms": dataclasses.asdict(result.read_delay),
        "cpu_wait_ms": dataclasses.asdict(result.cpu_wait),
        "cpu_wait_total_ms": result.cpu_wait_total_ms,
        "scheduling": result.scheduling.as_dict(),
        "max_in_flight": result.max_in_flight,
        "stopped": result.stopped,
        "counts": result.counts,
        "clock_drift_max_ns": result.clock_drift_max_ns,
        "tokenizer": result.tokenizer,
        "measure_start_ns": result.measure_start_ns,
        "end_ns": result.end_ns,
        "notes": result.notes,
        "send_clock": result.send_clock_source.value,
        "connections": dict(result.connections),
        "dataset_source": result.dataset_source,
    }
    if result.server_controls:  # reset, profile, speculative decoding (server_controls)
        out[SERVER_CONTROLS_KEY] = dict(result.server_controls)
    if result.processes:  # a run dealt over load processes (app.client.shards)
        out["processes"] = [dict(p) for p in result.processes]
    if result.workload_stats is not None:
        out["workload"] = dict(result.workload_stats)
        if result.workload_stats.get("kind") == "trace":
            out["trace_lateness_ms"] = dataclasses.asdict(trace_lateness(result.records))
    return out


def outcome_status(result: LoadResult, max_error_rate: float = DEFAULT_MAX_ERROR_RATE) -> RunStatus:
    """The run's status by the one rule (``app.analysis.trust.run_status``)."""
    return run_status(
        tally(result.records),
        stopped=result.stopped == "stopped",
        max_error_rate=max_error_rate,
        lost=result.counts.get("lost", 0),  # a load process that died (app.client.shards)
    )


def run_meta(result: LoadResult, max_error_rate: float = DEFAULT_MAX_ERROR_RATE) -> RunMeta:
    """What a finished load says about the run as a whole (validity, client health)."""
    check = token_count_check(result.records)
    return RunMeta(
        start_mono_ns=result.start_mono_ns,
        started_at=result.start_wall,
        clock_source=result.clock_source.value,
        client_limited=result.client_limited,
        validity=validity_notes(result, check, max_error_rate),
        load_stats=load_stats(result)
        | {"token_counts": check}
        | _turns(result.records)
        | _agents(result.records)
        | _groups(result.records)
        | _cached(result.records),
        client_host=platform.node(),
        client_version=__version__,
    )


def _turns(records: list[RequestRecord]) -> dict[str, Any]:
    """A multi-turn run's metrics by turn index (``app.analysis.turns``), computed where the
    load ran and stored with the run's load statistics (its stored report reads them)."""
    table = turn_table(records)
    return {"turns": table} if table else {}


def _agents(records: list[RequestRecord]) -> dict[str, Any]:
    """An agent trace's per-session and per-depth figures (``app.analysis.agent_sessions``),
    computed where the load ran and kept in the run's load statistics."""
    rows = rows_of_records(records)
    return {AGENT_KEY: agent_tables(rows)} if rows else {}


def _groups(records: list[RequestRecord]) -> dict[str, Any]:
    """A run of several models or targets: its figures per model and per target
    (``app.analysis.groups``), kept in the run's load statistics."""
    tables = group_tables(records)
    return {GROUPS_KEY: tables} if tables else {}


def _cached(records: list[RequestRecord]) -> dict[str, Any]:
    """The share of prompt tokens the responses said the server's prefix cache served
    (``records_prefix_cache``), when any response said."""
    share = records_prefix_cache(records)
    return {"prefix_cache_responses": share} if share is not None else {}


@dataclass(slots=True)
class ScrapeOutcome:
    status: dict[str, Any]  # goes to load_stats["server_metrics"]
    series: list[Series] = field(default_factory=list)  # run-relative times


Scrapers = MetricsScraper | list[tuple[str, MetricsScraper]]


def scrape_targets(spec: RunSpec) -> list[str]:
    """The /metrics URLs the run scrapes."""
    if spec.base_urls:
        return list(scrape_urls(spec).values())
    url = metrics_url(spec)
    return [] if url is None else [url]


def start_scraper(spec: RunSpec, refused: Collection[str] = ()) -> Scrapers | None:
    """The run's scraper; a run of several targets: one per target (``target_scrapes``).
    A URL in ``refused`` is not scraped."""
    if spec.base_urls:
        return start_scrapers(spec, refused) or None
    url = metrics_url(spec)
    if url is None or url in refused:
        return None
    keyed = spec.api_key and key_may_reach(spec, url)
    headers = {"Authorization": f"Bearer {spec.api_key}"} if keyed else None
    return MetricsScraper(url, wanted(spec.metrics_series), headers=headers).start()


def finish_scrape(scraper: Scrapers | None, start_mono_ns: int | None) -> ScrapeOutcome:
    """Stop the scraper; series move onto the run's axis (``start_mono_ns``). A finished
    load (``start_mono_ns`` given) gets one last scrape, after its last request ended."""
    if scraper is None:
        return ScrapeOutcome({"status": "off (scrape_metrics is false)"})
    final = start_mono_ns is not None
    if isinstance(scraper, list):
        res = stop_scrapers(scraper, final)
    else:
        res = scraper.stop(final_scrape=final)
    series = to_run_axis(res.series, start_mono_ns) if start_mono_ns is not None else []
    return ScrapeOutcome(res.summary(), series)


def attach_scrape(
    load_stats: dict[str, Any], outcome: ScrapeOutcome, records: Sequence[RequestRecord] = ()
) -> None:
    """The scrape's status in the run's load statistics, with the server's own prefill and
    decode time (``timing``) and prefix-cache hit ratio (``prefix_cache``) where its
    counters give them."""
    status = dict(outcome.status)
    ok = sum(1 for r in records if r.status is RequestStatus.OK)
    timing = server_timing(outcome.series, requests=ok)
    if timing is not None:
        status["timing"] = timing
    cache = prefix_cache(outcome.series)
    if cache is not None:  # the server's prefix-cache hit ratio over the run
        status["prefix_cache"] = cache
    load_stats[SCRAPE_STATS_KEY] = status


def series_to_wire(series: list[Series]) -> list[ServerMetricSeries]:
    return [
        ServerMetricSeries(name=s.name, labels=s.labels, kind=s.kind, t_ns=s.t_ns, values=s.values)
        for s in series
    ]
