"""Server metrics during a run: start the scraper beside the load, put its series on the
run's time axis, state what happened in the run's load statistics, and store the series."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from sqlalchemy.orm import Session

from app.analysis.server_timing import server_timing
from app.domain import RequestRecord, RequestStatus, RunSpec
from app.importers.prometheus import Series, wanted
from app.loadgen.metrics_scraper import MetricsScraper, ScrapeResult, to_run_axis
from app.storage import interop as interop_repo
from app.wire import ServerMetricSeries

STATS_KEY = "server_metrics"


@dataclass(slots=True)
class ScrapeOutcome:
    status: dict[str, Any]  # goes to load_stats["server_metrics"]
    series: list[Series] = field(default_factory=list)  # run-relative times


def metrics_url(spec: RunSpec) -> str | None:
    """Where to scrape: ``spec.metrics_url``, else ``base_url`` + ``/metrics`` (``/v1`` cut);
    None when scraping is off."""
    if not spec.scrape_metrics:
        return None
    if spec.metrics_url:
        return spec.metrics_url
    base = spec.base_url.rstrip("/")
    base = base.removesuffix("/v1")
    return f"{base}/metrics"


def start_scraper(spec: RunSpec) -> MetricsScraper | None:
    url = metrics_url(spec)
    if url is None:
        return None
    headers = {"Authorization": f"Bearer {spec.api_key}"} if spec.api_key else None
    return MetricsScraper(url, wanted(spec.metrics_series), headers=headers).start()


def finish(scraper: MetricsScraper | None, start_mono_ns: int | None) -> ScrapeOutcome:
    """Stop the scraper; series move onto the run's axis (``start_mono_ns``). A finished
    load (``start_mono_ns`` given) gets one last scrape, after its last request ended."""
    if scraper is None:
        return ScrapeOutcome({"status": "off (scrape_metrics is false)"})
    res: ScrapeResult = scraper.stop(final_scrape=start_mono_ns is not None)
    series = to_run_axis(res.series, start_mono_ns) if start_mono_ns is not None else []
    return ScrapeOutcome(res.summary(), series)


def attach(
    load_stats: dict[str, Any], outcome: ScrapeOutcome, records: Sequence[RequestRecord] = ()
) -> None:
    """The scrape's status in the run's load statistics, with the server's own prefill and
    decode time (``timing``) where its counters give them."""
    status = dict(outcome.status)
    ok = sum(1 for r in records if r.status is RequestStatus.OK)
    timing = server_timing(outcome.series, requests=ok)
    if timing is not None:
        status["timing"] = timing
    load_stats[STATS_KEY] = status


def store(session: Session, run_id: str, series: list[Series]) -> int:
    return interop_repo.replace_server_metrics(session, run_id, series)


def to_wire(series: list[Series]) -> list[ServerMetricSeries]:
    return [
        ServerMetricSeries(name=s.name, labels=s.labels, kind=s.kind, t_ns=s.t_ns, values=s.values)
        for s in series
    ]


def store_wire(session: Session, run_id: str, series: list[ServerMetricSeries]) -> int:
    """Store series a worker sent with its completion (a ``Invalid`` names a bad one)."""
    from app.services.errors import Invalid

    out: list[Series] = []
    for i, s in enumerate(series):
        if len(s.t_ns) != len(s.values):
            raise Invalid(f"server_metrics[{i}]: t_ns and values differ in length")
        out.append(Series(s.name, dict(s.labels), s.kind, list(s.t_ns), list(s.values)))
    return store(session, run_id, out)
