"""A target cannot exhaust the client (issue 23, item 6): every answer is bounded.

Each flood of ``tests/flood_target.py`` (a real server on loopback) meets a load run in a
child process, whose peak resident memory (``VmHWM``) is read when it ends, so the bound
is on the process that measures, not on this test's. The request that went past a limit
fails naming the limit; the run goes on and records every request.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from app.client.limits import CUT_EVENTS_KEPT
from app.client.spec import RunSpec
from tests.flood_target import FloodServer, valid_events

ROOT = Path(__file__).resolve().parents[1]
MB = 1 << 20

CHILD = """
import asyncio, json, sys
from app.client.execute import execute
from app.client.runner import run_load
from app.client.spec import RunSpec

def status(key):
    for line in open("/proc/self/status"):
        if line.startswith(key):
            return int(line.split()[1]) / 1024

spec = RunSpec(**json.loads(sys.argv[1]))
before = status("VmRSS:")
ex = asyncio.run(execute(spec, lambda: run_load(spec, run_tag="h")))
recs = sorted(ex.result.records, key=lambda r: r.index)
print(json.dumps({
    "before_mb": before,
    "peak_mb": status("VmHWM:"),
    "records": [
        {"status": r.status.value, "error": r.error, "output_tokens": r.output_tokens,
         "events": int(r.event_t_ns.size)}
        for r in recs
    ],
    "load": ex.meta.load_stats,
}))
"""


def _run_child(spec: dict[str, Any], timeout_s: float = 240) -> dict[str, Any]:
    """The load of ``spec`` (with the /v1/models check and the /metrics scraper) in a
    fresh process."""
    RunSpec(**spec)  # a bad spec fails here, not in the child
    out = subprocess.run(
        [sys.executable, "-c", CHILD, json.dumps(spec)],
        capture_output=True,
        text=True,
        timeout=timeout_s,
        cwd=ROOT,
        env={"PYTHONPATH": str(ROOT), "PATH": "/usr/bin:/bin"},
    )
    assert out.returncode == 0, out.stderr[-3000:]
    result: dict[str, Any] = json.loads(out.stdout.strip().splitlines()[-1])
    return result


def _spec(url: str, **kw: Any) -> dict[str, Any]:
    base: dict[str, Any] = {
        "base_url": url,
        "model": "m",
        "input_len": 8,
        "output_len": 4,
        "num_prompts": 2,
        "max_concurrency": 2,
        "request_timeout_s": 60.0,
        "scrape_metrics": False,
    }
    return base | kw


@pytest.fixture(scope="module")
def flood() -> Any:
    with FloodServer() as srv:
        yield srv


@pytest.mark.slow
def test_endless_streams_fail_at_the_response_cap_and_memory_stays_bounded(flood: Any) -> None:
    """4 endless streams against the default limits: each request ends at 64 MiB as an error
    naming the limit, keeping its first 1,000 events (not the 1.1M it holds); peak RSS stays
    near the 4 x 64 MiB captured, not a multiple of it."""
    res = _run_child(_spec(flood.url + "/endless", num_prompts=4, max_concurrency=4))
    recs = res["records"]
    assert len(recs) == 4
    for r in recs:
        assert r["status"] == "error"
        assert r["error"] == "response exceeded 67,108,864 bytes (max_response_bytes)"
        assert r["events"] == CUT_EVENTS_KEPT
    assert res["peak_mb"] - res["before_mb"] < 600, res


def test_the_run_budget_fails_the_read_that_passes_it(flood: Any) -> None:
    """With a 16 MiB run budget and 64 MiB per response, 4 endless streams cannot all reach
    their own cap: the read that takes the run past 16 MiB fails its request, saying so,
    and the run goes on (every request recorded)."""
    limits = {"max_buffered_bytes": 16 * MB, "max_response_bytes": 64 * MB}
    res = _run_child(_spec(flood.url + "/endless", num_prompts=6, max_concurrency=4, limits=limits))
    recs = res["records"]
    assert len(recs) == 6
    budget = "response cut off: the run's buffered responses exceeded 16,777,216 bytes"
    assert all(r["status"] == "error" and budget in r["error"] for r in recs), recs
    assert res["peak_mb"] - res["before_mb"] < 300, res


def test_response_cap_is_configurable_and_named(flood: Any) -> None:
    limits = {"max_response_bytes": 1 * MB}
    res = _run_child(_spec(flood.url + "/endless", limits=limits))
    for r in res["records"]:
        assert r["error"] == "response exceeded 1,048,576 bytes (max_response_bytes)"
        assert r["events"] == CUT_EVENTS_KEPT  # of the ~17,000 it read


def test_an_8_mib_event_fails_its_request_naming_the_event_cap(flood: Any) -> None:
    res = _run_child(_spec(flood.url + "/bigevent", limits={"max_response_bytes": 32 * MB}))
    for r in res["records"]:
        assert r["status"] == "error"
        assert r["error"] == "SSE event larger than 1048576 bytes", r["error"]
    assert res["peak_mb"] - res["before_mb"] < 300, res


def test_too_many_events_fail_their_request(flood: Any) -> None:
    """A response's events are bounded too (a decoded event costs far more memory than its
    bytes): a complete 1 MB stream of 16,393 events against a bound of 5,000 (its first
    1,000 kept); an endless stream of tiny events ends at the byte cap first, and says so."""
    limits = {"max_response_events": 5_000}
    res = _run_child(_spec(flood.url + "/valid1", limits=limits))
    for r in res["records"]:
        assert r["error"] == "response exceeded 5,000 events (max_response_events)"
        assert r["events"] == CUT_EVENTS_KEPT
    res = _run_child(_spec(flood.url + "/tiny", limits=limits | {"max_response_bytes": MB}))
    for r in res["records"]:
        assert r["error"] == "response exceeded 1,048,576 bytes (max_response_bytes)"
        assert r["events"] == CUT_EVENTS_KEPT


def test_endless_error_body_and_json_answer(flood: Any) -> None:
    """An error status's body is read up to 64 KiB (only its message could be kept); a JSON
    answer (stream false) is one event: bounded by the event cap."""
    res = _run_child(_spec(flood.url + "/error"))
    for r in res["records"]:
        assert r["error"] == "HTTP 500 (text/html, 65,536+ bytes; not shown: not a JSON error)"
    res = _run_child(_spec(flood.url + "/json", stream=False))
    for r in res["records"]:
        assert r["error"] == "JSON answer larger than 1,048,576 bytes (max_event_bytes)"


def test_endless_metrics_and_model_list_end_with_a_reason(flood: Any) -> None:
    """The /metrics scrape and the /v1/models check read at most 16 MiB and 1 MiB: the run
    says why they stopped, and its requests (valid ones here) are unaffected."""
    res = _run_child(_spec(flood.url + "/sideband", scrape_metrics=True))
    assert [r["status"] for r in res["records"]] == ["ok", "ok"]
    scrape = res["load"]["server_metrics"]
    assert scrape["status"] == "/metrics not read: answer larger than 16,777,216 bytes"
    assert scrape["failed_scrapes"] == 1 and scrape["scrapes"] == 0
    assert res["load"]["served_models_error"] == "not read: answer larger than 1,048,576 bytes"
    assert res["peak_mb"] - res["before_mb"] < 300, res


@pytest.mark.slow
def test_a_valid_60_mb_reply_is_counted_exactly_in_bounded_memory(flood: Any) -> None:
    """One valid 60 MB reply (1M one-token events) within the default limits: OK, every
    token counted (the server's count, and the tokenizer's = one per " word"), and the
    process's peak stays near the capture, not 23 x it (+1.36 GB before)."""
    res = _run_child(
        _spec(flood.url + "/valid60", num_prompts=1, max_concurrency=1, token_counting="tokenizer")
    )
    (r,) = res["records"]
    n = valid_events(60)
    assert r["status"] == "ok", r["error"]
    assert r["output_tokens"] == n and r["events"] == n + 2  # + usage and [DONE]
    assert res["peak_mb"] - res["before_mb"] < 450, res
