"""Find-max sweeps end to end: a search on the simulator (every probed step a stored run,
each verdict against the step's TPOT recomputed from its stored requests), the REST body
(422 naming the field, nothing created) and the CLI (exit 2 naming the flag)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
from fastapi.testclient import TestClient

from app.analysis.slo_search import FindMax, Slo
from app.cli.main import main
from app.client.spec import RunSpec
from app.client.sweep_plan import SweepPlan
from app.domain import EventKind
from app.services.runs import open_database
from app.services.sweeps import execute_sweep
from app.storage import compare_repo
from app.storage import repository as repo
from app.storage.db import session_scope
from app.targets.sim_config import SimConfig
from app.targets.simulator import SimulatorThread, start_simulator_thread
from tests.api_support import SPEC, api_client
from tests.live_server import LiveServerFactory, live_server  # noqa: F401
from tests.web_support import web_app
from tests.worker_helpers import api as worker_api
from tests.worker_helpers import sim_spec, wait_job

# TPOT under concurrency C: 40 + 10 C ms (1: 50, 2: 60, 3: 70): the limit 65 ms holds at 2;
# throughput keeps rising with C (no over-saturation stop before the SLO fails)
ITL_MS, PER_ACTIVE_MS, LIMIT_MS = 40.0, 10.0, 65.0


@pytest.fixture(scope="module")
def sim() -> Iterator[SimulatorThread]:
    s = start_simulator_thread(
        SimConfig(ttft_ms=2, itl_ms=ITL_MS, itl_per_active_ms=PER_ACTIVE_MS, seed=3)
    )
    yield s
    s.stop()


def _tpot_p99_ms(sessions: object, run_id: str) -> float:
    """TPOT p99 recomputed from the stored requests' token events (not the report)."""
    with session_scope(sessions) as s:  # type: ignore[arg-type]
        records = repo.load_records(s, run_id)
    tpots = []
    for r in records:
        t = r.event_t_ns[(r.event_tokens > 0) & (r.event_kind == int(EventKind.CONTENT))]
        n = int(r.event_tokens.sum())
        if r.sent_ns is not None and n > 1 and t.size:
            tpots.append((int(t.max()) - int(t.min())) / (n - 1) / 1e6)
    return float(np.percentile(tpots, 99))


def test_find_max_on_the_simulator(sim: SimulatorThread, tmp_path: Path) -> None:
    sessions = open_database(f"sqlite:///{tmp_path / 'fm.db'}")
    base = RunSpec(
        base_url=sim.base_url, model="tokentrace-sim", num_prompts=6, input_len=8,
        output_len=6, seed=1, scrape_metrics=False,
    )  # fmt: skip
    fm = FindMax("concurrency", (Slo("tpot", 99, LIMIT_MS),), 0.95, max_steps=6)
    out = execute_sweep(base, SweepPlan("find-max", (), find_max=fm), sessions=sessions)
    ans = out.summary["find_max"]
    probes = ans["probes"]
    # doubling to the first failure, then bisection: 1, 2, 4 (fails), 3 (fails)
    assert [p["load"] for p in probes] == [1, 2, 4, 3]
    assert ans["interval"] == [2, 3]
    assert out.summary["mode"] == "find-max"
    steps = out.summary["steps"]
    assert [s["load"] for s in steps] == [1, 2, 4, 3]  # every probe a stored step run
    for p, step in zip(probes, steps, strict=True):
        assert p["run_id"] == step["run_id"]
        (check,) = p["checks"]
        assert check["value_ms"] == pytest.approx(_tpot_p99_ms(sessions, step["run_id"]))
        assert check["upper_ms"] >= check["value_ms"]
        assert p["passes"] == (check["upper_ms"] <= LIMIT_MS)
    with session_scope(sessions) as s:
        sweep = compare_repo.find_sweep(s, out.sweep_id)
        assert sweep is not None and sweep.find_max == fm.to_dict()
    # the sweep page shows the probed steps and the answer; a step's run page its steady
    # window (closed loop at the step's concurrency)
    with TestClient(web_app(f"sqlite:///{tmp_path / 'fm.db'}")) as c:
        html = c.get(f"/sweeps/{out.sweep_id}").text
        assert 'id="find-max"' in html
        assert '<span id="find-max-lo">2</span>' in html
        assert '<span id="find-max-hi">3</span>' in html
        assert html.count('data-passes="yes"') == 2 and html.count('data-passes="no"') == 2
        run_html = c.get(f"/runs/{steps[2]['run_id']}").text
        assert 'id="steady"' in run_html and 'id="steady-table"' in run_html


def _sweep_count(api: object) -> int:
    from app.storage.models_compare import Sweep

    with session_scope(api.sessions) as s:  # type: ignore[attr-defined]
        return s.query(Sweep).count()


BAD_FIND_MAX: list[tuple[dict[str, object], str]] = [
    ({"kind": "concurrency", "slos": ["foo:p99:5"]}, "slos"),
    ({"kind": "concurrency", "slos": ["tpot:p200:5"]}, "slos"),
    ({"kind": "concurrency", "slos": ["tpot:p99:-1"]}, "slos"),
    ({"kind": "tokens", "slos": ["tpot:p99:5"]}, "kind"),
    ({"kind": "rate", "slos": ["tpot:p99:5"], "confidence": 1.5}, "confidence"),
    ({"kind": "rate", "slos": ["tpot:p99:5"], "confidence": 0}, "confidence"),
]


def test_api_refuses_a_bad_find_max_naming_the_field(sqlite_url: str) -> None:
    with api_client(sqlite_url) as api:
        for find_max, field in BAD_FIND_MAX:
            r = api.client.post(
                "/api/v1/sweeps", json=SPEC | {"find_max": find_max}, headers=api.h(api.run)
            )
            assert r.status_code == 422, r.text
            assert f"find_max.{field}" in r.text, (find_max, r.text)
        assert _sweep_count(api) == 0


def test_api_queues_a_find_max_sweep(sqlite_url: str) -> None:
    body = SPEC | {"find_max": {"kind": "concurrency", "slos": ["tpot:p99:50"], "max_steps": 5}}
    with api_client(sqlite_url) as api:
        r = api.client.post("/api/v1/sweeps", json=body, headers=api.h(api.run))
        assert r.status_code == 201, r.text
        sweep_id = r.json()["sweep_id"]
        got = api.client.get(f"/api/v1/sweeps/{sweep_id}", headers=api.h(api.read)).json()
        assert got["mode"] == "find-max"
        fm = got["find_max"]
        assert fm["config"]["slos"] == [{"metric": "tpot", "pct": 99.0, "limit_ms": 50.0}]
        assert fm["interval"] == [None, None] and fm["probes"] == []
        with session_scope(api.sessions) as s:
            sweep = compare_repo.find_sweep(s, sweep_id)
            assert sweep is not None and sweep.job_id is not None
            from app.storage import jobs as job_repo

            job = job_repo.get_job(s, sweep.job_id)
            plan = job.spec["plan"]
            assert plan["mode"] == "find-max" and plan["find_max"]["max_steps"] == 5


@pytest.mark.parametrize(
    ("args", "flag"),
    [
        (["--find-max", "concurrency", "--slo", "foo:p99:5"], "--slo"),
        (["--find-max", "concurrency", "--slo", "tpot:p0:5"], "--slo"),
        (["--find-max", "concurrency", "--slo", "tpot:p99:-2"], "--slo"),
        (["--find-max", "concurrency"], "--slo"),
        (["--find-max", "tokens", "--slo", "tpot:p99:5"], "--find-max"),
        (["--find-max", "rate", "--slo", "tpot:p99:5", "--confidence", "1"], "--confidence"),
        (["--find-max", "rate", "--slo", "tpot:p99:5", "--max-steps", "0"], "--max-steps"),
        (["--rates", "1", "--slo", "tpot:p99:5"], "--slo"),
    ],
)
def test_cli_refuses_a_bad_find_max_naming_the_flag(
    tmp_path: Path, args: list[str], flag: str, capsys: pytest.CaptureFixture[str]
) -> None:
    db = f"sqlite:///{tmp_path / 'cli.db'}"
    base = ["sweep", "--base-url", "http://127.0.0.1:9", "--model", "m", "--database-url", db]
    assert main(base + args) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and flag in err[0], err


FORM = {"base_url": "http://127.0.0.1:9", "model": "m", "num_prompts": "2", "endpoint": "chat"}


def test_sweep_form_find_max_fields(sqlite_url: str) -> None:
    from app.web import sweeps_form

    with TestClient(web_app(sqlite_url)) as c:
        page = c.get("/launch/sweep").text
    for name in ("find_max_kind", "slos", "confidence", "max_steps"):
        assert f'name="{name}"' in page, name
    assert '<option value="find-max"' in page

    good = FORM | {
        "sweep_mode": "find-max",
        "find_max_kind": "rate",
        "slos": "ttft:p99:500, tpot:p99.9:50",
        "confidence": "0.9",
        "max_steps": "7",
    }
    parsed, errors = sweeps_form.parse(good)
    assert errors == {} and parsed is not None
    _, plan = parsed
    assert plan.mode == "find-max" and plan.find_max is not None
    assert plan.find_max.kind == "rate" and plan.find_max.max_steps == 7
    assert [s.text for s in plan.find_max.slos] == ["ttft:p99:500", "tpot:p99.9:50"]
    # launch again fills the same fields
    again = sweeps_form.values_from_sweep(
        {"base_url": "http://127.0.0.1:9", "model": "m"}, "find-max", [],
        {"find_max": plan.find_max.to_dict()}, None,
    )  # fmt: skip
    assert again["sweep_mode"] == "find-max" and again["slos"] == "ttft:p99:500, tpot:p99.9:50"
    assert again["confidence"] == "0.9" and again["max_steps"] == "7"
    for bad, field in (
        ({"slos": "foo:p99:5"}, "slos"),
        ({"slos": ""}, "slos"),
        ({"confidence": "1.5"}, "confidence"),
        ({"find_max_kind": "tokens"}, "find_max_kind"),
        ({"loads": "2, 4"}, "loads"),
    ):
        parsed, errors = sweeps_form.parse(good | bad)
        assert parsed is None and field in errors, (bad, errors)


@pytest.mark.slow  # a live server and a worker: about 20 s
def test_find_max_through_a_worker(
    live_server: LiveServerFactory,  # noqa: F811
    sqlite_url: str,
    sim: SimulatorThread,
    tmp_path: Path,
) -> None:
    """Queued over the REST API, run by a worker: the worker decides each next load from
    the server's step summaries (their SLO checks); the sweep reads the same answer."""
    import asyncio

    from app.worker.loop import Worker, WorkerOptions

    srv = live_server(sqlite_url)
    opts = WorkerOptions(
        backoff_initial_s=0.05, backoff_max_s=0.5, batch_interval_s=0.2, batch_max_requests=8,
        shutdown_grace_s=3.0, heartbeat_interval_s=0.2, poll_interval_s=0.1,
    )  # fmt: skip
    body = sim_spec(sim.base_url, num_prompts=6, output_len=6, input_len=8)
    body.pop("max_concurrency")
    body |= {"find_max": {"kind": "concurrency", "slos": [f"tpot:p99:{LIMIT_MS:g}"],
                          "max_steps": 6}}  # fmt: skip
    with worker_api(srv) as c:
        r = c.post("/sweeps", json=body)
        assert r.status_code == 201, r.text
        sweep_id, job_id = r.json()["sweep_id"], r.json()["job_id"]
        worker = Worker(
            srv.url, srv.worker_token, state_dir=tmp_path / "state", name="w", options=opts
        )
        outcome = asyncio.run(worker.run_once())
        assert outcome is not None and outcome.status == "succeeded", outcome
        wait_job(c, job_id, ("succeeded",), 10)
        summary = c.get(f"/sweeps/{sweep_id}").json()
    fm = summary["find_max"]
    assert [s["load"] for s in summary["steps"]] == [p["load"] for p in fm["probes"]]
    assert [p["load"] for p in fm["probes"]] == [1, 2, 4, 3]
    assert fm["interval"] == [2, 3]
    assert "largest concurrency meeting" in summary["stop_reason"]
