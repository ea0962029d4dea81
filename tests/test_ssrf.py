"""Runs may not target the dashboard itself or link-local addresses (cloud metadata), by
default; ``metrics_url`` passes the same checks; what a non-target answers is not kept."""

from __future__ import annotations

import socket
import threading
from collections.abc import Iterator
from typing import Any

import pytest

from app.client.runner import run_load_sync
from app.client.spec import RunSpec
from app.domain import RequestStatus
from app.services import targets
from app.settings import Settings
from app.storage.models import Job, Run
from tests.api_support import SPEC, api_client


def _count(api: Any, model: type) -> int:
    from sqlalchemy import func, select

    from app.storage.db import make_engine

    engine = make_engine(api.db_url)
    try:
        with engine.connect() as c:
            return int(c.execute(select(func.count()).select_from(model)).scalar_one())
    finally:
        engine.dispose()


@pytest.mark.parametrize(
    ("url", "why"),
    [
        ("http://169.254.169.254/latest", "link-local"),
        ("http://[fe80::1]:80", "link-local"),
        ("http://[::ffff:169.254.169.254]", "link-local"),
        ("http://127.0.0.1:8000", "dashboard itself"),
        ("http://localhost:8000/v1", "dashboard itself"),
        ("http://127.5.6.7:8000", "dashboard itself"),
        ("http://dash.lab:8443", "dashboard itself"),
    ],
)
def test_default_refusals(url: str, why: str) -> None:
    s = Settings(database_url="sqlite://", port=8000, public_url="https://dash.lab:8443")
    assert why in (targets.refusal(url, s) or "")


def test_other_targets_and_opt_ins() -> None:
    s = Settings(database_url="sqlite://", port=8000)
    for url in ("http://127.0.0.1:9000", "http://10.0.0.5:8000", "https://vllm.lab"):
        assert targets.refusal(url, s) is None
    opted = Settings(
        database_url="sqlite://", port=8000, target_allow_self=True, target_allow_link_local=True
    )
    assert targets.refusal("http://169.254.169.254", opted) is None
    assert targets.refusal("http://127.0.0.1:8000", opted) is None


def test_api_refuses_a_metrics_url_the_base_url_check_would_refuse(sqlite_url: str) -> None:
    """A run pinned to an allowed host:port could point its scraper at the dashboard's own
    API (same host, another port): metrics_url is checked like base_url."""
    with api_client(sqlite_url, target_allowlist=["127.0.0.1:9"], port=8000) as api:
        body = SPEC | {"metrics_url": "http://127.0.0.1:8000/api/v1/runs"}
        r = api.client.post("/api/v1/runs", json=body, headers=api.h(api.run))
        assert r.status_code == 422, r.text
        detail = r.json()["detail"][0]
        assert detail["loc"] == ["body", "metrics_url"]
        assert _count(api, Run) == 0 and _count(api, Job) == 0
        body = SPEC | {"base_url": "http://169.254.169.254:9"}
        r = api.client.post("/api/v1/runs", json=body, headers=api.h(api.run))
        assert r.status_code == 422 and "link-local" in r.text
        assert api.client.post("/api/v1/runs", json=SPEC, headers=api.h(api.run)).status_code == 201


def _serve(head: bytes, page: bytes) -> Iterator[str]:
    """A server answering every request with ``head`` and ``page`` (a "secret" in it)."""
    srv = socket.create_server(("127.0.0.1", 0))
    stop = threading.Event()

    def serve() -> None:
        srv.settimeout(0.2)
        while not stop.is_set():
            try:
                conn, _ = srv.accept()
            except (TimeoutError, OSError):
                continue
            with conn:
                conn.recv(65536)
                conn.sendall(head + b"content-length: %d\r\n\r\n%b" % (len(page), page))

    t = threading.Thread(target=serve, daemon=True)
    t.start()
    yield f"http://127.0.0.1:{srv.getsockname()[1]}"
    stop.set()
    srv.close()
    t.join(2)


@pytest.fixture
def html_server() -> Iterator[str]:
    """Answers every request with an HTML 403 page holding a "secret"."""
    yield from _serve(
        b"HTTP/1.1 403 Forbidden\r\ncontent-type: text/html\r\nconnection: close\r\n",
        b"<html><body>internal admin console: secret-token-123</body></html>",
    )


@pytest.fixture
def page_server() -> Iterator[str]:
    """Answers 200 with an HTML page holding a "secret" (not Prometheus text)."""
    yield from _serve(
        b"HTTP/1.1 200 OK\r\ncontent-type: text/html\r\nconnection: close\r\n",
        b"<html>\nadmin console secret-token-123\n</html>\n",
    )


def test_a_non_target_answer_is_not_kept_in_request_errors(html_server: str) -> None:
    """An HTTP error whose body is not an OpenAI-style JSON error is recorded by its status
    line and size only: a run cannot be used to read another service's pages."""
    spec = RunSpec(base_url=html_server, model="m", num_prompts=2, input_len=4, output_len=2,
                   scrape_metrics=False, max_concurrency=1)  # fmt: skip
    res = run_load_sync(spec, run_tag="x", handle_sigint=False)
    for r in res.records:
        assert r.status is RequestStatus.ERROR and r.http_status == 403
        assert "secret" not in (r.error or "") and "403" in (r.error or "")
        assert "text/html" in (r.error or "")


def test_scraper_keeps_a_status_line_not_the_body(page_server: str) -> None:
    import time

    from app.client.metrics_scraper import MetricsScraper

    sc = MetricsScraper(page_server + "/metrics", frozenset(), period_s=0.05).start()
    time.sleep(0.3)
    res = sc.stop()
    assert "not Prometheus text" in res.status and "text/html" in res.status
    assert "secret" not in res.status and "admin" not in res.status


def test_worker_refuses_a_target_resolving_to_link_local() -> None:
    """The server cannot see what a name resolves to on the worker: the worker's client
    checks the resolved address (here an IP literal) and sends nothing."""
    spec = RunSpec(base_url="http://169.254.1.1:9", model="m", num_prompts=3, input_len=4,
                   output_len=2, scrape_metrics=False, request_timeout_s=2)  # fmt: skip
    import asyncio

    from app.client.runner import run_load

    res = asyncio.run(run_load(spec, run_tag="ll", allow_link_local=False))
    assert res.counts["error"] == 3
    assert all("link-local" in (r.error or "") for r in res.records)
    assert res.connections["opened"] == 0


def test_every_base_url_of_a_run_passes_the_target_checks(sqlite_url: str) -> None:
    """A run of several targets (``base_urls``): each one is checked like ``base_url``; the
    refused one is named, and nothing is queued."""
    with api_client(sqlite_url, target_allowlist=["127.0.0.1:9", "127.0.0.1:10"]) as api:
        for second, why in (
            ("http://127.0.0.1:11", "allow-list"),
            ("http://169.254.169.254:9", "link-local"),
        ):
            body = SPEC | {"base_urls": ["http://127.0.0.1:9", second]}
            r = api.client.post("/api/v1/runs", json=body, headers=api.h(api.run))
            assert r.status_code == 422 and why in r.text, r.text
            assert r.json()["detail"][0]["loc"] == ["body", "base_urls"]
            assert _count(api, Run) == 0 and _count(api, Job) == 0
        body = SPEC | {"base_urls": ["http://127.0.0.1:9", "http://127.0.0.1:10"]}
        assert api.client.post("/api/v1/runs", json=body, headers=api.h(api.run)).status_code == 201


def test_a_worker_fails_only_the_requests_to_a_link_local_target() -> None:
    """Of a run's targets, the one that resolves to a link-local address gets nothing: its
    requests fail saying so; the other's are sent (and fail on its closed port here)."""
    import asyncio

    from app.client.runner import run_load

    spec = RunSpec(base_urls=["http://127.0.0.1:9", "http://169.254.1.1:9"], model="m",
                   num_prompts=4, input_len=4, output_len=2, scrape_metrics=False,
                   request_timeout_s=2)  # fmt: skip
    res = asyncio.run(run_load(spec, run_tag="ll2", allow_link_local=False))
    link_local = [r for r in res.records if r.target == "http://169.254.1.1:9"]
    other = [r for r in res.records if r.target == "http://127.0.0.1:9"]
    assert len(link_local) == len(other) == 2
    assert all("link-local" in (r.error or "") for r in link_local)
    assert all("link-local" not in (r.error or "") for r in other)


def test_a_worker_sends_a_link_local_target_no_identity_get_and_no_scrape(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """On a worker that refuses link-local targets, such a target of a run is not asked for
    its models or identity and its /metrics is not scraped (every HTTP request the identity
    reads and the scrapers make is seen here); the other target is asked and scraped, and
    the run says why the refused one was not."""
    import asyncio

    import httpx

    from app.client.execute import execute
    from app.client.runner import run_load
    from app.targets.sim_config import SimConfig
    from app.targets.simulator import start_simulator_process

    asked: list[str] = []
    real_send = httpx.Client.send

    def send(self: httpx.Client, request: httpx.Request, **kw: Any) -> httpx.Response:
        asked.append(str(request.url))
        return real_send(self, request, **kw)

    monkeypatch.setattr(httpx.Client, "send", send)
    refused = "http://169.254.1.1:9"
    with start_simulator_process(SimConfig(ttft_ms=1, itl_ms=1, seed=2)) as sim:
        for bases in ([refused], [sim.base_url, refused]):
            asked.clear()
            one = len(bases) == 1
            spec = RunSpec(
                **({"base_url": refused} if one else {"base_urls": bases}),
                model="tokentrace-sim", num_prompts=4, input_len=4, output_len=2,
                scrape_metrics=True, request_timeout_s=2,
            )  # fmt: skip

            async def go(spec: RunSpec = spec) -> Any:
                return await execute(
                    spec,
                    lambda: run_load(spec, run_tag="llx", allow_link_local=False),
                    allow_link_local=False,
                )

            done = asyncio.run(go())
            assert done.result is not None and done.meta is not None
            assert not [u for u in asked if "169.254" in u], asked
            stats = done.meta.load_stats
            if one:
                assert asked == []
                assert "link-local" in stats["server_metrics"]["status"]
                assert done.result.counts["error"] == 4
            else:
                assert f"{sim.base_url}/v1/models" in asked
                assert f"{sim.base_url}/metrics" in asked
                ident = stats["server_identity"]["targets"][refused]
                assert "link-local" in ident["not_asked"]
            notes = " ".join(done.meta.validity)
            assert "not asked: it resolves to a link-local address" in notes
