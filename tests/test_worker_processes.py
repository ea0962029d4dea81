"""``tokentrace worker --processes`` (issue 26 part 4): a run asking for one load process is
dealt over the worker's count, says so in its notes, and stores which process sent each
request; a run asking for another count keeps it; one that cannot be dealt keeps one
process and says why. A bad value: exit 2, one line."""

from __future__ import annotations

import asyncio
import dataclasses
from collections import Counter
from pathlib import Path

import pytest

from app.cli.main import main
from app.client.spec import RunSpec
from app.targets.sim_config import SimConfig
from app.targets.simulator import start_simulator_thread
from app.worker.loop import Worker
from app.worker.processes import parse_processes, with_worker_processes
from tests.live_server import LiveServer, LiveServerFactory, live_server  # noqa: F401
from tests.test_worker import FAST
from tests.worker_helpers import api, submit, wait_job

pytestmark = pytest.mark.timeout(120)


def _spec(**kw: object) -> RunSpec:
    return RunSpec.model_validate({"base_url": "http://127.0.0.1:9", "model": "m", **kw})


def test_parse_processes() -> None:
    assert (parse_processes("3"), parse_processes(" auto ")) == (3, "auto")
    for bad, said in (("0", "not 0"), ("2000", "not 2000"), ("x", "a whole number"),
                      ("1.5", "a whole number")):  # fmt: skip
        with pytest.raises(ValueError, match=said):
            parse_processes(bad)


def test_which_runs_the_worker_deals() -> None:
    spec, note = with_worker_processes(_spec(api_key="k"), 2)
    assert spec.processes == 2 and spec.api_key == "k"
    assert note == "dealt over the worker's --processes 2 (the run asked for one)"
    assert with_worker_processes(_spec(processes=3), 2) == (_spec(processes=3), None)
    assert with_worker_processes(_spec(), None) == (_spec(), None)
    assert with_worker_processes(_spec(), 1) == (_spec(), None)
    kept, why = with_worker_processes(_spec(reset_prefix_cache=True), 2)
    assert kept.processes == 1 and why is not None
    assert why.startswith("one load process, not the worker's --processes 2: ")
    assert "reset_prefix_cache" in why


def test_cli_refuses_a_bad_count_with_exit_2(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("TOKENTRACE_WORKER_TOKEN", "t")
    rc = main(["worker", "--server", "http://127.0.0.1:9", "--processes", "0"])
    assert rc == 2
    err = capsys.readouterr().err.strip()
    assert "--processes: processes: from 1 to 1024" in err and "\n" not in err


def test_a_worker_deals_a_one_process_run_over_its_processes(
    live_server: LiveServerFactory,  # noqa: F811
    sqlite_url: str,
    tmp_path: Path,
) -> None:
    server: LiveServer = live_server(sqlite_url)
    sim = start_simulator_thread(SimConfig(ttft_ms=3, itl_ms=2, output_len=8, seed=1))
    try:
        body = {"base_url": sim.base_url, "model": "tokentrace-sim", "num_prompts": 20,
                "max_concurrency": 4, "output_len": 8, "scrape_metrics": False}  # fmt: skip
        with api(server) as c:
            run_id, job_id = submit(c, body)
            opts = dataclasses.replace(FAST, processes=2)
            w = Worker(server.url, server.worker_token, state_dir=tmp_path / "w", name="w",
                       options=opts)  # fmt: skip
            outcome = asyncio.run(w.run_once())
            assert outcome is not None and outcome.status == "succeeded", outcome
            wait_job(c, job_id, ("succeeded",), 20)
            rows = c.get(f"/runs/{run_id}/requests", params={"limit": 100}).json()["items"]
            detail = c.get(f"/runs/{run_id}").json()
        seen = len(sim.ground_truth()["requests"])
    finally:
        sim.stop()
    assert seen == 20 and sorted(r["index"] for r in rows) == list(range(20))
    # dealt as the CLI deals it: 4 slots over 2 processes, request i with slot i mod 4
    assert {r["index"]: r["process"] for r in rows} == {i: (i % 4) % 2 for i in range(20)}
    assert Counter(r["status"] for r in rows) == {"ok": 20}
    notes = detail["report"]["validity"]["notes"]
    assert "dealt over the worker's --processes 2 (the run asked for one)" in notes
