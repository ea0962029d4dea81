"""Issue 24 item 4: requests cut in flight by a cancel are ``cancelled``, not server errors,
and a cancelled run reads ``cancelled`` everywhere: its status, its verdict and banner, its
error rate (no error), no failure diagnosis, the request filter and the runs filter.

Every count is recomputed here from the stored requests, one by one (the API's request
rows), never from the report under test."""

from __future__ import annotations

import asyncio
import threading
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from app.analysis.trust import DEFAULT_MAX_ERROR_RATE
from app.client.execute import outcome_status, validity_notes
from app.client.runner import LoadResult, run_load
from app.client.spec import RunSpec
from app.domain import RequestRecord, RequestStatus, RunStatus
from app.services.runs import assemble_report
from app.targets.sim_config import SimConfig
from app.targets.simulator import SimulatorThread, start_simulator_thread
from app.worker.job import JobOutcome
from app.worker.loop import Worker
from tests.live_server import LiveServer, LiveServerFactory, live_server  # noqa: F401
from tests.test_worker import FAST
from tests.worker_helpers import api, sim_spec, submit, wait_for, wait_job

pytestmark = pytest.mark.timeout(120)


@pytest.fixture(scope="module")
def sim() -> Iterator[SimulatorThread]:
    # about 1 s a request: a cancel always finds some in flight
    s = start_simulator_thread(SimConfig(ttft_ms=5, itl_ms=20, output_len=50, seed=4))
    yield s
    s.stop()


def _rows(c: httpx.Client, run_id: str) -> list[dict[str, Any]]:
    r = c.get(f"/runs/{run_id}/requests", params={"limit": 5000})
    r.raise_for_status()
    items: list[dict[str, Any]] = r.json()["items"]
    return items


def test_a_cancelled_run_is_cancelled_not_failed(
    live_server: LiveServerFactory,  # noqa: F811
    sqlite_url: str,
    sim: SimulatorThread,
    tmp_path: Path,
) -> None:
    server: LiveServer = live_server(sqlite_url)
    spec = sim_spec(sim.base_url, num_prompts=200, output_len=50, max_concurrency=6)
    box: dict[str, JobOutcome | None] = {}
    with api(server) as c:
        run_id, job_id = submit(c, spec)
        w = Worker(server.url, server.worker_token, state_dir=tmp_path / "st", name="w",
                   options=FAST)  # fmt: skip
        t = threading.Thread(target=lambda: box.update(o=asyncio.run(w.run_once())))
        t.start()
        wait_job(c, job_id, ("running",), 20)
        # some requests completed and stored, more in flight: then the user cancels
        wait_for(lambda: sum(r["status"] == "ok" for r in _rows(c, run_id)) >= 6, 30, "ok rows")
        assert c.post(f"/runs/{run_id}/cancel").status_code == 200
        t.join(30)
        assert not t.is_alive()
        wait_job(c, job_id, ("cancelled",), 10)
        detail = c.get(f"/runs/{run_id}").json()
        rows = _rows(c, run_id)
        listed = {r["id"]: r for r in c.get("/runs", params={"limit": 100}).json()["items"]}
    measured = [r for r in rows if not r["warmup"] and r["sent_ms"] is not None]
    by_status = Counter(r["status"] for r in measured)
    cut = [r for r in measured if r["status"] == "cancelled"]
    assert cut, "the cancel found requests in flight"
    assert by_status["error"] == 0 and by_status["timeout"] == 0, by_status
    assert all(r["error"] == "run stopped by the user" for r in cut)

    report = detail["report"]
    req = report["metrics"]["requests"]
    assert detail["run"]["status"] == report["status"] == "cancelled"
    assert (req["sent"], req["completed_ok"], req["cancelled"], req["failed"]) == (
        len(measured),
        by_status["ok"],
        len(cut),
        0,
    )
    assert report["metrics"]["error_rate"] == 0.0  # 0 errors of len(measured) sent
    v = report["validity"]
    assert v["verdict"] == "cancelled" and v["valid"] is False
    assert v["over_error_bound"] is False
    assert not any("requests failed" in n for n in v["notes"]), v["notes"]
    assert [i["severity"] for i in v["issues"]] == ["warn"]  # a notice, not do-not-trust
    assert f"{by_status['ok']} of 200 planned requests completed" in v["issues"][0]["text"]
    assert f"{len(cut)} in flight were cut" in v["issues"][0]["text"]
    assert listed[run_id]["verdict"] == "cancelled"

    base = server.url
    with httpx.Client(base_url=base, timeout=30, trust_env=False) as web:
        page = web.get(f"/runs/{run_id}").text
        assert 'id="trust-warnings"' not in page and 'id="run-notices"' in page
        assert 'id="diagnosis"' not in page or "requests failed" not in page
        assert f"{len(cut)} cancelled (not errors)" in page  # the error-rate card
        # the request filter finds exactly the cut requests; "failed" finds none
        found = web.get(f"/runs/{run_id}/requests", params={"status": "cancelled"}).text
        assert found.count('class="status s-cancelled"') == len(cut)
        failed = web.get(f"/runs/{run_id}/requests", params={"status": "failed"}).text
        assert 'class="status s-' not in failed
        # the runs list's "cancelled" filter finds the run
        runs = web.get("/", params={"status": "cancelled"}).text
        assert f'data-run-id="{run_id}"' in runs
        export = web.get(f"/runs/{run_id}/requests.csv").text
        assert export.count(",cancelled,") == len(cut)


def test_a_local_stop_records_cut_requests_as_cancelled(sim: SimulatorThread) -> None:
    """The client's side (a local bench, Ctrl-C): the stop cuts the streams in flight,
    their records say ``cancelled``, the run is ``cancelled`` and nothing counts as failed."""
    spec = RunSpec(base_url=sim.base_url, model="tokentrace-sim", num_prompts=60, input_len=16,
                   output_len=50, max_concurrency=5, scrape_metrics=False)  # fmt: skip

    async def main() -> LoadResult:
        stop = asyncio.Event()

        def on_record(r: RequestRecord) -> None:
            # stop as soon as one request has ended well: the others (about 1 s each, five
            # at a time) are then in flight, whatever the machine's load
            if r.status is RequestStatus.OK and not r.warmup:
                stop.set()

        return await run_load(spec, run_tag="stop", stop=stop, on_record=on_record)

    res = asyncio.run(main())
    statuses = Counter(r.status for r in res.records)
    assert statuses[RequestStatus.CANCELLED] >= 1 and statuses[RequestStatus.OK] >= 1
    assert statuses[RequestStatus.ERROR] == 0 and statuses[RequestStatus.TIMEOUT] == 0
    assert outcome_status(res) is RunStatus.CANCELLED
    notes = validity_notes(res, {"requests_disagreeing": 0}, DEFAULT_MAX_ERROR_RATE)
    assert not any("failed" in n for n in notes), notes
    report = assemble_report(run={"status": "cancelled", "spec": {}}, records=res.records)
    req = report["metrics"]["requests"]
    assert req["cancelled"] == statuses[RequestStatus.CANCELLED]
    assert req["failed"] == 0 and report["metrics"]["error_rate"] == 0.0
    assert report["validity"]["verdict"] == "cancelled"
