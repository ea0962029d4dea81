"""``/metrics`` of a run of several targets (``RunSpec.base_urls``): one scraper per target
(``metrics_scraper``), each at its base URL + ``/metrics``, each with the run's key only
where it may go (``target_keys.key_may_reach``). Their series are kept apart: each carries
the label ``TARGET_LABEL`` naming its target's base URL; the scrape's status lists each
target's own (``targets``). A worker's live panel follows them together (``TargetsLive``)."""

from __future__ import annotations

import time
from collections.abc import Collection

from app.client.metrics_scraper import MetricsScraper, ScrapeResult
from app.client.server_identity import control_base
from app.client.spec import RunSpec
from app.client.target_keys import key_may_reach
from app.protocol.prometheus import Series, wanted

TARGET_LABEL = "tokentrace_target"
JOIN_GRACE_S = 5.0  # how long the live values wait for every target's first scrape
MEAN_ROLES = frozenset({"kv_cache_usage"})  # a share of each engine's cache: averaged


class TargetsLive:
    """The live panel's values of a run of several targets: each role summed over the
    targets' last scrapes (requests running and waiting, token counters), KV-cache usage
    averaged, at the latest scrape's time. None until every target has scraped once, or
    ``JOIN_GRACE_S`` has passed (a target that joins later steps its counters up once)."""

    def __init__(self, scrapers: list[tuple[str, MetricsScraper]]) -> None:
        self.scrapers = [s for _, s in scrapers]
        self.since = time.monotonic()

    def latest(self) -> tuple[int, dict[str, float]] | None:
        got = [x for s in self.scrapers if (x := s.latest()) is not None]
        waiting = time.monotonic() - self.since < JOIN_GRACE_S
        if not got or (len(got) < len(self.scrapers) and waiting):
            return None
        out: dict[str, float] = {}
        counts: dict[str, int] = {}
        for _, roles in got:
            for role, value in roles.items():
                out[role] = out.get(role, 0.0) + value
                counts[role] = counts.get(role, 0) + 1
        for role in MEAN_ROLES & out.keys():
            out[role] /= counts[role]
        return max(t for t, _ in got), out


def scrape_urls(spec: RunSpec) -> dict[str, str]:
    """Each target's /metrics URL (base URL -> it); {} when scraping is off."""
    if not spec.scrape_metrics:
        return {}
    return {base: f"{control_base(base)}/metrics" for base in spec.targets()}


def start_scrapers(
    spec: RunSpec, refused: Collection[str] = ()
) -> list[tuple[str, MetricsScraper]]:
    """(base URL, its started scraper) per target but those whose URL is ``refused``; []
    when scraping is off."""
    out: list[tuple[str, MetricsScraper]] = []
    for base, url in scrape_urls(spec).items():
        if url in refused:
            continue
        keyed = spec.api_key and key_may_reach(spec, url)
        headers = {"Authorization": f"Bearer {spec.api_key}"} if keyed else None
        scraper = MetricsScraper(url, wanted(spec.metrics_series), headers=headers)
        out.append((base, scraper.start()))
    return out


def stop_scrapers(scrapers: list[tuple[str, MetricsScraper]], final_scrape: bool) -> ScrapeResult:
    """Every scraper stopped; their results as one: the first target's URL, ``ok`` when any
    target's scrape worked, the counts summed, each series labelled with its target."""
    results = [(base, s.stop(final_scrape=final_scrape)) for base, s in scrapers]
    first = results[0][1]
    ok = [r for _, r in results if r.status == "ok"]
    out = ScrapeResult(url=first.url, status="ok" if ok else first.status)
    for base, r in results:
        out.scrapes += r.scrapes
        out.failures += r.failures
        out.dropped_samples += r.dropped_samples
        out.last_failure = r.last_failure or out.last_failure
        out.targets.append({"target": base, **r.summary()})
        out.series += [
            Series(s.name, {**s.labels, TARGET_LABEL: base}, s.kind, s.t_ns, s.values)
            for s in r.series
        ]
    return out
