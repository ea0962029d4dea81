"""Scrape the target's Prometheus ``/metrics`` about once a second while a run goes on.

Runs on its own thread (never on the measurement event loop). Sample times are
``time.monotonic_ns()`` when each answer arrived: the caller moves them onto the run's axis
by subtracting the run's ``start_mono_ns``. ``stop(final_scrape=True)``, called once the last
request has ended, takes one more scrape first: a server updates its counters when a request
ends, so without it the run's last wave would be missing from every counter. The scraper
stops by itself, saying why, when the target has no ``/metrics`` (404), answers something
that is not the text format, or cannot be reached before any scrape succeeded; later
failures are counted, not hidden.
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass, field

import httpx

from app.protocol.live_metrics import snapshot
from app.protocol.prometheus import (
    PrometheusFormatError,
    Series,
    add_scrape,
    parse_text,
    select,
)

PERIOD_S = 1.0
TIMEOUT_S = 2.0


@dataclass(slots=True)
class ScrapeResult:
    url: str
    status: str  # "ok", or why scraping stopped / never started
    scrapes: int = 0
    failures: int = 0
    series: list[Series] = field(default_factory=list)  # times on time.monotonic_ns()

    def summary(self) -> dict[str, object]:
        return {
            "url": self.url,
            "status": self.status,
            "scrapes": self.scrapes,
            "failed_scrapes": self.failures,
            "series": sorted({s.name for s in self.series}),
        }


class MetricsScraper:
    def __init__(
        self,
        url: str,
        names: frozenset[str],
        *,
        period_s: float = PERIOD_S,
        timeout_s: float = TIMEOUT_S,
        headers: dict[str, str] | None = None,
    ) -> None:
        self.url = url
        self.names = names
        self.period_s = period_s
        self.timeout_s = timeout_s
        self.headers = headers or {}
        self._stop = threading.Event()
        self._final = False
        self._series: dict[tuple[str, tuple[tuple[str, str], ...]], Series] = {}
        self._latest: tuple[int, dict[str, float]] | None = None  # the live roles, last scrape
        self._result = ScrapeResult(url=url, status="ok")
        self._thread = threading.Thread(target=self._main, name="tokentrace-scrape", daemon=True)

    def start(self) -> MetricsScraper:
        self._thread.start()
        return self

    def stop(self, *, final_scrape: bool = False) -> ScrapeResult:
        """Stop and return what was scraped; with ``final_scrape`` one last scrape is taken
        first (while scraping still works)."""
        self._final = final_scrape
        self._stop.set()
        self._thread.join(self.timeout_s * (2 if final_scrape else 1) + 1.0)
        self._result.series = list(self._series.values())
        return self._result

    def _main(self) -> None:
        with httpx.Client(timeout=self.timeout_s, headers=self.headers) as client:
            while not self._stop.is_set():
                if not self._scrape_once(client):
                    return
                self._stop.wait(self.period_s)
            if self._final:
                self._scrape_once(client)

    def _scrape_once(self, client: httpx.Client) -> bool:
        """One scrape; False when scraping should stop."""
        res = self._result
        try:
            resp = client.get(self.url)
        except httpx.HTTPError as e:
            res.failures += 1
            if res.scrapes == 0:
                res.status = f"could not reach {self.url}: {type(e).__name__}"
                return False
            return True
        t_ns = time.monotonic_ns()
        if resp.status_code == 404:
            res.status = "no /metrics (HTTP 404)" if res.scrapes == 0 else "/metrics went away"
            return False
        if resp.status_code != 200:
            res.failures += 1
            if res.scrapes == 0:
                res.status = f"/metrics answered HTTP {resp.status_code}"
                return False
            return True
        try:
            samples, kinds = parse_text(resp.text)
        except PrometheusFormatError:  # its content is not kept: it may be anything's page
            kind = resp.headers.get("content-type", "no content type").split(";")[0][:60]
            res.status = f"/metrics is not Prometheus text ({kind}, {len(resp.content):,} bytes)"
            return False
        chosen = select(samples, self.names)
        add_scrape(self._series, t_ns, chosen, kinds)
        self._latest = (t_ns, snapshot(chosen))  # one assignment: read whole by latest()
        res.scrapes += 1
        return True

    def latest(self) -> tuple[int, dict[str, float]] | None:
        """(monotonic ns, role -> value) of the last scrape (``live_metrics.snapshot``), or
        None before the first: what a running run's page follows live."""
        return self._latest


def to_run_axis(series: list[Series], start_mono_ns: int) -> list[Series]:
    """The same series with times relative to the run's start (ns)."""
    return [
        Series(s.name, dict(s.labels), s.kind, [t - start_mono_ns for t in s.t_ns], list(s.values))
        for s in series
    ]
