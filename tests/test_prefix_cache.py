"""The server's prefix-cache hit ratio from its scraped counters, by hand."""

from __future__ import annotations

from typing import Any

import pytest

from app.analysis.prefix_cache import prefix_cache
from app.client.execute import ScrapeOutcome, attach_scrape
from app.protocol.prometheus import Series, wanted


def counter(name: str, values: list[float], **labels: str) -> Series:
    return Series(name, labels, "counter", [i * 10**9 for i in range(len(values))], values)


def test_hit_ratio_over_the_run_by_hand() -> None:
    series = [
        counter("vllm:prefix_cache_queries_total", [100.0, 300.0, 50.0, 150.0]),  # reset: 0->50
        counter("vllm:prefix_cache_hits_total", [10.0, 110.0, 20.0, 70.0]),
    ]
    got = prefix_cache(series)
    assert got is not None
    assert got["queried_tokens"] == pytest.approx(200 + 50 + 100)
    assert got["hit_tokens"] == pytest.approx(100 + 20 + 50)
    assert got["hit_ratio"] == pytest.approx(170 / 350)


def test_two_names_of_one_counter_count_once_and_labels_add_up() -> None:
    series = [
        counter("vllm:prefix_cache_queries_total", [0.0, 100.0], engine="0"),
        counter("vllm:prefix_cache_queries_total", [0.0, 300.0], engine="1"),
        counter("vllm:prefix_cache_hits_total", [0.0, 50.0], engine="0"),
        counter("vllm:prefix_cache_hits_total", [0.0, 150.0], engine="1"),
        counter("vllm:gpu_prefix_cache_queries_total", [0.0, 400.0]),
        counter("vllm:gpu_prefix_cache_hits_total", [0.0, 200.0]),
    ]
    got = prefix_cache(series)
    assert got is not None and (got["queried_tokens"], got["hit_tokens"]) == (400.0, 200.0)
    old = prefix_cache(series[4:])  # only the older name
    assert old is not None and old["hit_ratio"] == pytest.approx(0.5)


def test_no_counters_no_ratio_and_no_query_no_ratio() -> None:
    assert prefix_cache([counter("vllm:prompt_tokens_total", [0.0, 5.0])]) is None
    assert prefix_cache([counter("vllm:prefix_cache_queries_total", [0.0, 5.0])]) is None
    idle = prefix_cache(
        [
            counter("vllm:prefix_cache_queries_total", [7.0, 7.0]),
            counter("vllm:prefix_cache_hits_total", [3.0, 3.0]),
        ]
    )
    assert idle is not None and idle["hit_ratio"] is None


def test_scraped_by_default_and_stored_with_the_runs_load_statistics() -> None:
    names = wanted()
    assert "vllm:prefix_cache_hits_total" in names and "vllm:prefix_cache_queries_total" in names
    series = [
        counter("vllm:prefix_cache_queries_total", [0.0, 80.0]),
        counter("vllm:prefix_cache_hits_total", [0.0, 20.0]),
    ]
    load: dict[str, Any] = {}
    attach_scrape(load, ScrapeOutcome({"status": "ok"}, series))
    assert load["server_metrics"]["prefix_cache"]["hit_ratio"] == pytest.approx(0.25)
    plain: dict[str, Any] = {}
    attach_scrape(plain, ScrapeOutcome({"status": "ok"}, series[:0]))
    assert "prefix_cache" not in plain["server_metrics"]


def test_the_cli_reports_line_of_the_ratio() -> None:
    from app.cli.render import prefix_cache_line

    cache = {"source": "vllm", "queried_tokens": 1200.0, "hit_tokens": 300.0, "hit_ratio": 0.25}
    assert prefix_cache_line(cache) == (
        "server prefix cache: 25.0% of 1,200 queried prompt tokens were hits "
        "(vllm counters, warm-ups included)"
    )
    assert "no prompt token" in prefix_cache_line(cache | {"hit_ratio": None})
