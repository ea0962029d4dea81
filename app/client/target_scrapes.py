"""``/metrics`` of a run of several targets (``RunSpec.base_urls``): one scraper per target
(``metrics_scraper``), each at its base URL + ``/metrics``, each with the run's key only
where it may go (``target_keys.key_may_reach``). Their series are kept apart: each carries
the label ``TARGET_LABEL`` naming its target's base URL; the scrape's status lists each
target's own (``targets``)."""

from __future__ import annotations

from app.client.metrics_scraper import MetricsScraper, ScrapeResult
from app.client.server_identity import control_base
from app.client.spec import RunSpec
from app.client.target_keys import key_may_reach
from app.protocol.prometheus import Series, wanted

TARGET_LABEL = "tokentrace_target"


def start_scrapers(spec: RunSpec) -> list[tuple[str, MetricsScraper]]:
    """(base URL, its started scraper) per target; [] when scraping is off."""
    if not spec.scrape_metrics:
        return []
    out: list[tuple[str, MetricsScraper]] = []
    for base in spec.targets():
        url = f"{control_base(base)}/metrics"
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
