"""tokentrace's own ``/metrics`` keeps a bounded set of label values (issue 14, item 12):
the HTTP latency histogram is labelled by route template (not the raw path) and by a fixed
set of methods, any other method counted as ``other``; unknown paths are ``unmatched``.
Before, every invented method (``FOO1``, ``FOO2``, ...) became a new series: a client could
grow the server's memory and every scrape without limit."""

from __future__ import annotations

import re
from collections.abc import Iterator

import pytest

from tests.api_support import Api, api_client

SERIES = re.compile(r"^tokentrace_http_request_duration_seconds_count\{(.*)\} \S+$", re.M)
LABEL = re.compile(r'(\w+)="([^"]*)"')


@pytest.fixture
def api(sqlite_url: str) -> Iterator[Api]:
    with api_client(sqlite_url) as a:
        yield a


def _series(api: Api) -> list[dict[str, str]]:
    text = api.client.get("/metrics").text
    return [dict(LABEL.findall(m)) for m in SERIES.findall(text)]


def test_methods_and_paths_cannot_grow_the_label_set(api: Api) -> None:
    run_id = api.create_run()["run_id"]
    for i in range(40):
        api.client.request(f"FOO{i}", f"/api/v1/runs/{run_id}")
        api.client.request(f"BAR{i}", f"/no/such/path/{i}")
        api.client.get(f"/api/v1/runs/run-{i}")  # 404s of one route template
        api.client.get(f"/nothing-here-{i}")
    api.client.request("PATCH", "/api/v1/runs")
    series = _series(api)
    methods = {s["method"] for s in series}
    routes = {s["route"] for s in series}
    assert methods <= {"GET", "HEAD", "POST", "PUT", "PATCH", "DELETE", "OPTIONS", "other"}
    assert "other" in methods and "GET" in methods and "POST" in methods
    assert "/api/v1/runs/{run_id}" in routes and "unmatched" in routes
    assert not [r for r in routes if "run-" in r or "nothing-here" in r or "/no/such" in r]
    assert len(series) < 25, sorted((s["method"], s["route"], s["status"]) for s in series)
