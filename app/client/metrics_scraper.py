"""Scrape the target's Prometheus ``/metrics`` about once a second while a run goes on.

Runs on its own thread (never on the measurement event loop). Sample times are
``time.monotonic_ns()`` when each answer arrived: the caller moves them onto the run's axis
by subtracting the run's ``start_mono_ns``. ``stop(final_scrape=True)``, called once the last
request has ended, takes one more scrape first: a server updates its counters when a request
ends, so without it the run's last wave would be missing from every counter. The scraper
stops by itself, saying why, when the target has no ``/metrics`` (404), answers something
that is not the text format, or cannot be reached before any scrape succeeded; later
failures are counted, not hidden (the last one's reason kept).

A target's ``/metrics`` is bounded like its other answers: at most ``MAX_SCRAPE_BYTES`` read,
in ``timeout_s`` in all (``app.client.bounded_get``), an endless body ends that scrape with
a reason. The text is parsed a block of lines at a time and only the wanted series are
kept, at most ``MAX_SERIES`` of them, each with at most ``MAX_LABELS`` labels of at most
``MAX_LABEL_CHARS`` characters: what a benchmark reads, not whatever an internal service
exposes.
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass, field
from typing import Protocol

import httpx

from app.client.bounded_get import get_bounded
from app.protocol.live_metrics import snapshot
from app.protocol.prometheus import (
    PrometheusFormatError,
    Sample,
    Series,
    add_scrape,
    parse_text,
    select,
)

PERIOD_S = 1.0
TIMEOUT_S = 2.0
MAX_SCRAPE_BYTES = 16 << 20
PARSE_BLOCK_CHARS = 256 << 10  # text parsed at once, about (whole lines)
MAX_SERIES = 128  # series (name + label set) kept per run; new ones past it are dropped
MAX_LABELS = 16
MAX_LABEL_CHARS = 128  # a label's name or value


class LiveSource(Protocol):
    """What a running run's live panel reads: one scraper (``MetricsScraper``), or a run's
    several targets together (``target_scrapes.TargetsLive``)."""

    def latest(self) -> tuple[int, dict[str, float]] | None: ...


@dataclass(slots=True)
class ScrapeResult:
    url: str
    status: str  # "ok", or why scraping stopped / never started
    scrapes: int = 0
    failures: int = 0
    last_failure: str | None = None  # why the last failed scrape failed
    dropped_samples: int = 0  # a new series past MAX_SERIES, or labels past the bounds
    series: list[Series] = field(default_factory=list)  # times on time.monotonic_ns()
    targets: list[dict[str, object]] = field(default_factory=list)  # several: each one's

    def summary(self) -> dict[str, object]:
        out: dict[str, object] = {
            "url": self.url,
            "status": self.status,
            "scrapes": self.scrapes,
            "failed_scrapes": self.failures,
            "series": sorted({s.name for s in self.series}),
        }
        if self.last_failure is not None:
            out["last_failure"] = self.last_failure
        if self.dropped_samples:
            out["dropped_samples"] = self.dropped_samples
        if self.targets:  # a run of several targets (app.client.target_scrapes)
            out["targets"] = list(self.targets)
        return out


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

    def _failed(self, why: str) -> bool:
        """A failed scrape: counted; before any success it stops scraping (False)."""
        res = self._result
        res.failures += 1
        res.last_failure = why
        if res.scrapes == 0:
            res.status = why
            return False
        return True

    def _scrape_once(self, client: httpx.Client) -> bool:
        """One scrape; False when scraping should stop."""
        res = self._result
        try:
            ans = get_bounded(
                client, self.url, max_bytes=MAX_SCRAPE_BYTES, deadline_s=self.timeout_s
            )
        except httpx.HTTPError as e:
            return self._failed(f"could not reach {self.url}: {type(e).__name__}")
        t_ns = time.monotonic_ns()
        if ans.status == 404:
            res.status = "no /metrics (HTTP 404)" if res.scrapes == 0 else "/metrics went away"
            return False
        if ans.status != 200:
            return self._failed(f"/metrics answered HTTP {ans.status}")
        if ans.body is None:
            return self._failed(f"/metrics not read: {ans.error}")
        try:
            samples, kinds = parse_blocks(ans.body.decode("utf-8", "replace"), self.names)
        except PrometheusFormatError:  # its content is not kept: it may be anything's page
            res.status = (
                f"/metrics is not Prometheus text ({ans.content_type}, {len(ans.body):,} bytes)"
            )
            return False
        chosen = self._bounded(samples)
        add_scrape(self._series, t_ns, chosen, kinds)
        self._latest = (t_ns, snapshot(chosen))  # one assignment: read whole by latest()
        res.scrapes += 1
        return True

    def latest(self) -> tuple[int, dict[str, float]] | None:
        """(monotonic ns, role -> value) of the last scrape (``live_metrics.snapshot``), or
        None before the first: what a running run's page follows live."""
        return self._latest

    def _bounded(self, samples: list[Sample]) -> list[Sample]:
        """The samples whose series may be kept: known ones, or new ones while fewer than
        ``MAX_SERIES`` are, with labels within the bounds."""
        out: list[Sample] = []
        new: set[tuple[str, tuple[tuple[str, str], ...]]] = set()
        for s in samples:
            key = (s.name, s.labels)
            if key not in self._series and key not in new:
                if (
                    len(self._series) + len(new) >= MAX_SERIES
                    or len(s.labels) > MAX_LABELS
                    or any(max(len(k), len(v)) > MAX_LABEL_CHARS for k, v in s.labels)
                ):
                    self._result.dropped_samples += 1
                    continue
                new.add(key)
            out.append(s)
        return out


def parse_blocks(text: str, names: frozenset[str]) -> tuple[list[Sample], dict[str, str]]:
    """``parse_text`` a block of whole lines at a time (the text format is line by line),
    keeping only the samples named in ``names``: the parser's objects for a big answer
    never exist all at once. Raises ``PrometheusFormatError`` as ``parse_text`` does."""
    samples: list[Sample] = []
    kinds: dict[str, str] = {}
    start = 0
    while start < len(text):
        end = text.find("\n", start + PARSE_BLOCK_CHARS)
        end = len(text) if end < 0 else end + 1
        block_samples, block_kinds = parse_text(text[start:end])
        samples += select(block_samples, names)
        kinds.update(block_kinds)
        start = end
    return samples, kinds


def to_run_axis(series: list[Series], start_mono_ns: int) -> list[Series]:
    """The same series with times relative to the run's start (ns)."""
    return [
        Series(s.name, dict(s.labels), s.kind, [t - start_mono_ns for t in s.t_ns], list(s.values))
        for s in series
    ]
