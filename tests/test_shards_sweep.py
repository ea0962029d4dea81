"""Sharded sweeps (issue 26): a sweep with ``shards: K`` runs every step as one run dealt
over K workers, the server sequencing the steps (``app.services.sharded_sweeps``).

* Live: a 2-shard sweep of 2 rates over two in-process workers and the simulator; the
  target saw each step's requests once, each stored once with its shard, and every step's
  run has its "By shard" rows; the CLI follows it with ``--server --shards 2``.
* The plan's rules decide each next step from the stored summaries exactly as ``drive``
  does (a find-max search and a fixed plan, replayed against ``drive`` itself).
* The server's rules: a lost shard leaves its step partial and the sweep goes on; a step
  whose shards were not all leased in time ends the sweep; cancel stops the current
  step's shards; a concurrency below the shards is refused, naming ``shards``.
"""

from __future__ import annotations

import asyncio
import datetime as dt
import json
import math
import re
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from app.analysis.slo_search import find_max_of
from app.analysis.sweep import LoadKind, StepSummary
from app.cli.main import main
from app.client import sweep_plan
from app.services.jobs import expire_lost_leases
from app.storage import compare_repo
from app.storage.models import Job, utcnow
from app.targets.sim_config import SimConfig
from app.targets.simulator import start_simulator_thread
from tests.api_support import SPEC, Api, api_client, wire
from tests.live_server import LiveServer, LiveServerFactory, live_server  # noqa: F401
from tests.shard_support import serve, shard_workers
from tests.worker_helpers import api, sim_spec, start_worker_process, wait_for

pytestmark = pytest.mark.timeout(120)


# ------------------------------------------------------------------------ live, two workers


def _serve_all(server: LiveServer, tmp_path: Path, jobs: int) -> list[list[Any]]:
    async def both() -> list[list[Any]]:
        return list(
            await asyncio.gather(*(serve(w, jobs) for w in shard_workers(server, tmp_path, 2)))
        )

    return asyncio.run(both())


def test_a_two_shard_sweep_runs_each_step_over_both_workers(
    live_server: LiveServerFactory,  # noqa: F811
    db_url: str,
    tmp_path: Path,
) -> None:
    server = live_server(db_url)
    sim = start_simulator_thread(SimConfig(ttft_ms=3, itl_ms=2, output_len=6, seed=5))
    try:
        body = sim_spec(sim.base_url, num_prompts=12, max_concurrency=4, output_len=6,
                        shards=2, scrape_metrics=False)  # fmt: skip
        body |= {"rates": [40.0, 80.0], "min_ratio": 0.01}  # no early stop: both steps run
        with api(server) as c:
            r = c.post("/sweeps", json=body)
            assert r.status_code == 201, r.text
            sweep_id = r.json()["sweep_id"]
            outcomes = _serve_all(server, tmp_path, 2)  # each worker: one shard of each step
            wait_for(
                lambda: c.get(f"/sweeps/{sweep_id}").json()["status"] not in
                ("queued", "running"), 30, "the sweep to end",
            )  # fmt: skip
            sweep = c.get(f"/sweeps/{sweep_id}").json()
            steps = sweep["steps"]
            rows = {
                st["run_id"]: c.get(f"/runs/{st['run_id']}/requests", params={"limit": 100}).json()[
                    "items"
                ]
                for st in steps
            }
            details = {st["run_id"]: c.get(f"/runs/{st['run_id']}").json() for st in steps}
            page = c.get(f"{server.url}/sweeps/{sweep_id}").text
            run_page = c.get(f"{server.url}/runs/{steps[1]['run_id']}").text
        arrived = sim.ground_truth()["requests"]
    finally:
        sim.stop()
    assert all(len(o) == 2 and all(x.status == "succeeded" for x in o) for o in outcomes)
    assert sweep["status"] == "succeeded", sweep.get("stop_reason")
    assert sweep["shards"] == 2
    assert [st["load"] for st in steps] == [40.0, 80.0]
    # at the target: 12 + 12 arrivals, no more (a request sent twice would be a 25th)
    assert len(arrived) == 24 == sum(len(v) for v in rows.values())
    for st in steps:
        mine = rows[st["run_id"]]
        assert sorted(r["index"] for r in mine) == list(range(12))  # each stored once
        assert {r["index"]: r["shard"] for r in mine} == {i: (i % 4) % 2 for i in range(12)}
        d = details[st["run_id"]]
        assert d["run"]["status"] == "succeeded"
        shards = d["report"]["load"]["shards"]
        assert [(s["shard"], s["ok"], s["planned"]) for s in shards] == [(0, 6, 6), (1, 6, 6)]
        assert all(s["clock_bound_ms"] is not None for s in shards)
    # the steps ran one after the other: step 1's first arrival after step 0's last
    recv = sorted(int(a["received_ns"]) for a in arrived.values())
    assert recv[11] < recv[12]
    assert 'id="sweep-shards"' in page and 'id="shard-table"' in run_page


def test_a_killed_worker_leaves_its_step_partial_and_the_sweep_goes_on(
    live_server: LiveServerFactory,  # noqa: F811
    sqlite_url: str,
    tmp_path: Path,
) -> None:
    """Three ``tokentrace worker`` processes, a 2-shard sweep of two rates. A worker running
    a shard of step 0 is killed: its lease expires, step 0's run ends partial naming the
    shard, and step 1 runs on the two workers left: all its requests, each once."""
    server = live_server(sqlite_url, env={"TOKENTRACE_LEASE_TTL_S": "2"})
    sim = start_simulator_thread(SimConfig(ttft_ms=3, itl_ms=2, output_len=4, seed=7))
    body = sim_spec(sim.base_url, num_prompts=40, output_len=4, arrival="constant",
                    shards=2, scrape_metrics=False)  # fmt: skip
    body |= {"rates": [10.0, 40.0], "min_ratio": 0.01}  # step 0: 4 s, time to kill
    procs = {
        f"w{k}": start_worker_process(
            server.url, server.worker_token, tmp_path / f"w{k}", "--name", f"w{k}"
        )
        for k in range(3)
    }
    try:
        with api(server) as c:
            sweep_id = c.post("/sweeps", json=body).json()["sweep_id"]

            def sweep() -> dict[str, Any]:
                out: dict[str, Any] = c.get(f"/sweeps/{sweep_id}").json()
                return out

            first = sweep()["steps"][0]["run_id"]

            def stored(run_id: str) -> list[dict[str, Any]]:
                got: list[dict[str, Any]] = c.get(
                    f"/runs/{run_id}/requests", params={"limit": 100}
                ).json()["items"]
                return got

            wait_for(lambda: len({r["shard"] for r in stored(first)}) == 2, 30, "both shards")
            jobs = c.get("/jobs", params={"limit": 10}).json()["items"]
            names = {w["id"]: w["name"] for w in c.get("/workers").json()["items"]}
            victim = next(names[j["worker_id"]] for j in jobs if j["run_id"] == first)
            procs[victim].kill()
            procs[victim].wait(10)
            wait_for(lambda: sweep()["status"] not in ("queued", "running"), 60, "the sweep")
            done = sweep()
            steps = done["steps"]
            runs = [c.get(f"/runs/{st['run_id']}").json() for st in steps]
            rows = [stored(st["run_id"]) for st in steps]
        seen = len(sim.ground_truth()["requests"])
    finally:
        sim.stop()
        for p in procs.values():
            if p.poll() is None:
                p.terminate()
                p.wait(10)
    assert done["status"] == "succeeded" and len(steps) == 2, done.get("stop_reason")
    assert [r["run"]["status"] for r in runs] == ["partial", "succeeded"]
    notes = runs[0]["report"]["validity"]["notes"]
    assert any(n.startswith("shard ") and " lost (worker lost" in n for n in notes), notes
    assert sorted(r["index"] for r in rows[1]) == list(range(40))  # step 1: each once
    first_idx = [r["index"] for r in rows[0]]
    assert len(first_idx) == len(set(first_idx)) < 40  # step 0: each stored at most once
    assert seen >= 40 + len(first_idx)  # the killed worker's last ones reached the target


@pytest.mark.serial
def test_cli_sweep_server_shards_follows_the_sweep(
    live_server: LiveServerFactory,  # noqa: F811
    sqlite_url: str,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    server = live_server(sqlite_url)
    sim = start_simulator_thread(SimConfig(ttft_ms=3, itl_ms=2, output_len=4, seed=6))
    rc: list[int] = []
    args = ["sweep", "--server", server.url, "--token", server.admin_token, "--json",
            "--base-url", sim.base_url, "--model", "tokentrace-sim", "--num-prompts", "6",
            "--output-len", "4", "--rates", "30", "60", "--min-ratio", "0.01", "--shards", "2",
            "--no-scrape-metrics"]  # fmt: skip
    cli = threading.Thread(target=lambda: rc.append(main(args)))
    try:
        cli.start()
        _serve_all(server, tmp_path, 2)
        cli.join(60)
    finally:
        sim.stop()
    assert rc == [0]

    out = json.loads(capsys.readouterr().out)
    assert out["status"] == "succeeded" and out["shards"] == 2 and len(out["steps"]) == 2


# ----------------------------------------------------------------- the plan's next step


def _fake(index: int, load: float, kind: LoadKind, fm: Any) -> StepSummary:
    """A step whose p99 TTFT grows with the load: passes up to 40, fails above."""
    ok = load <= 40
    check = {"slo": "ttft:p99:40", "ok": ok, "value_ms": float(load), "limit_ms": 40.0}
    return StepSummary(index, load, kind, load, load, load * 10, load if ok else 0.0, 0.0,
                       {}, f"r{index}", (check,) if fm else ())  # fmt: skip


class _Recorder:
    def __init__(self, fm: Any) -> None:
        self.asked: list[tuple[float, str, str]] = []
        self.fm = fm

    def run(self, load: float, kind: LoadKind, role: str) -> StepSummary:
        self.asked.append((load, kind, role))
        return _fake(len(self.asked) - 1, load, kind, self.fm)

    def set_loads(self, loads: list[float]) -> None:
        pass


@pytest.mark.parametrize("which", ["find-max", "rates"])
def test_next_step_decides_as_drive_does(which: str) -> None:
    if which == "find-max":
        fm = find_max_of({"kind": "rate", "slos": ["ttft:p99:40"], "max_steps": 6,
                          "start": 5, "max_load": 1000})  # fmt: skip
        plan = sweep_plan.SweepPlan("find-max", (), 5, 0.9, 0.5, fm)
    else:
        fm = None
        plan = sweep_plan.SweepPlan("rates", (5.0, 10.0, 20.0), 5, 0.9, 0.5)
    ref = _Recorder(fm)
    reason = sweep_plan.drive(ref, plan)
    done: list[StepSummary] = []
    asked: list[tuple[float, str, str]] = []
    while (nxt := sweep_plan.next_step(plan, done)).load is not None:
        asked.append((nxt.load, nxt.kind, nxt.role))
        done.append(_fake(len(done), nxt.load, nxt.kind, fm))
        assert len(done) < 20
    assert asked == ref.asked and nxt.reason == reason
    if which == "rates":
        assert [a[0] for a in asked] == [5.0, 10.0, 20.0]  # by hand: the three rates
    else:  # by hand: 5, 10, 20, 40 pass, 80 fails; then bisected in log space
        assert [a[0] for a in asked[:5]] == [5.0, 10.0, 20.0, 40.0, 80.0]
        assert math.isclose(asked[5][0], math.sqrt(40 * 80))


# ------------------------------------------------------------------- the server's rules


@pytest.fixture
def api_db(db_url: str) -> Iterator[Api]:
    with api_client(db_url) as a:
        yield a


def _sweep(a: Api, **extra: Any) -> dict[str, Any]:
    body = SPEC | {"shards": 2, "rates": [1.0, 2.0]} | extra
    r = a.client.post("/api/v1/sweeps", json=body, headers=a.h(a.run))
    assert r.status_code == 201, r.text
    out: dict[str, Any] = r.json()
    return out


def _get(a: Api, path: str) -> Any:
    return a.client.get(f"/api/v1{path}", headers=a.h(a.read)).json()


def test_a_lost_shard_leaves_its_step_partial_and_the_sweep_goes_on(api_db: Api) -> None:
    a = api_db
    sweep_id = _sweep(a)["sweep_id"]
    j0, j1 = (a.lease(a.register()) for _ in range(2))
    assert j0 is not None and j1 is not None and (j0["shard"], j1["shard"]) == (0, 1)
    assert j0["run_id"] == j1["run_id"] and j0["spec"]["request_rate"] == 1.0
    for j in (j0, j1, j0):
        a.post_job(j["job_id"], "shard-ready", {"lease_id": j["lease_id"]})
    body = {"lease_id": j0["lease_id"], "batch_no": 0, "requests": wire([0, 2, 4])}
    assert a.post_job(j0["job_id"], "results", body).status_code == 200
    done = {"lease_id": j0["lease_id"], "status": "succeeded", "total_batches": 1,
            "records": 3, "run_meta": {"clock_source": "kernel", "load_stats": {}}}  # fmt: skip
    assert a.post_job(j0["job_id"], "complete", done).status_code == 200
    assert len(_get(a, f"/sweeps/{sweep_id}")["steps"]) == 1  # shard 1 still holds its lease
    with a.sessions() as s:
        s.get(Job, j1["job_id"]).lease_expires_at = utcnow() - dt.timedelta(seconds=1)  # type: ignore[union-attr]
        s.commit()
    expire_lost_leases(a.sessions)
    sweep = _get(a, f"/sweeps/{sweep_id}")
    first = _get(a, f"/runs/{j0['run_id']}")
    assert first["run"]["status"] == "partial"
    assert any(n.startswith("shard 1 lost") for n in first["report"]["validity"]["notes"])
    assert sweep["status"] == "running" and len(sweep["steps"]) == 2  # step 1 queued
    k0, k1 = (a.lease(a.register()) for _ in range(2))
    assert k0 is not None and k1 is not None and k0["run_id"] == k1["run_id"] != j0["run_id"]
    assert k0["spec"]["request_rate"] == 2.0 and (k0["shard"], k1["shard"]) == (0, 1)


def test_cancel_stops_the_current_steps_shards(api_db: Api) -> None:
    a = api_db
    out = _sweep(a)
    j0 = a.lease(a.register())
    assert j0 is not None
    r = a.client.post(f"/api/v1/sweeps/{out['sweep_id']}/cancel", headers=a.h(a.run))
    assert r.status_code == 200 and r.json()["cancel_requested"] is True, r.text
    assert a.lease(a.register()) is None  # shard 1 was cancelled while queued
    beat = a.post_job(j0["job_id"], "heartbeat", {"lease_id": j0["lease_id"]}).json()
    assert beat["cancel"] is True
    done = {"lease_id": j0["lease_id"], "status": "cancelled", "total_batches": 0}
    assert a.post_job(j0["job_id"], "complete", done).status_code == 200
    sweep = _get(a, f"/sweeps/{out['sweep_id']}")
    assert sweep["status"] == "cancelled" and len(sweep["steps"]) == 1
    assert sweep["stop_reason"] == "cancelled after 0 step(s)"


def test_a_step_not_all_leased_in_time_ends_the_sweep(db_url: str) -> None:
    with api_client(db_url, shard_wait_s=0.5) as a:
        out = _sweep(a)
        assert a.lease(a.register()) is not None
        time.sleep(0.7)
        assert a.lease(a.register()) is None  # the wait ran out: the step's run failed
        sweep = _get(a, f"/sweeps/{out['sweep_id']}")
    assert sweep["status"] == "failed"
    assert sweep["stop_reason"] == "step 0 failed: 1 of 2 shards leased within 0.5 s"


@pytest.mark.parametrize(
    "plan", [{"concurrencies": [1, 4]}, {"auto": True}, {"rates": None, "concurrencies": [2, 4]}]
)
def test_a_concurrency_below_the_shards_is_refused(api_db: Api, plan: dict[str, Any]) -> None:
    body = SPEC | {"shards": 3} | plan
    body = {k: v for k, v in body.items() if v is not None}
    r = api_db.client.post("/api/v1/sweeps", json=body, headers=api_db.h(api_db.run))
    assert r.status_code == 422, r.text
    assert r.json()["detail"][0]["loc"][-1] == "shards"
    assert _get(api_db, "/sweeps") == []  # nothing stored


def test_the_sweep_form_takes_shards_and_shows_them_again(tmp_path: Path) -> None:
    """The sweep form: ``shards`` 2 queues step 0 as one run of 2 leases, the sweep's plan
    kept for the server; "launch again" shows 2 and the rates. A concurrency below the
    shards is refused beside the field, nothing stored."""
    from fastapi.testclient import TestClient

    from app.services import auth
    from app.services.runs import open_database
    from app.storage import compare_repo
    from app.storage import jobs as job_repo
    from app.storage.db import session_scope
    from app.web import sweeps_form
    from tests.web_support import post_form, sign_in, web_app

    url = f"sqlite:///{tmp_path / 'forms.db'}"
    sessions = open_database(url)
    with session_scope(sessions) as s:
        _, token = auth.create_token(s, scopes=["run"], name="runner")
    form = sweeps_form.defaults() | {"base_url": "http://127.0.0.1:9", "model": "m",
                                     "num_prompts": "4", "shards": "2",
                                     "sweep_mode": "rates", "loads": "1, 2"}  # fmt: skip
    with TestClient(web_app(url)) as client:
        assert sign_in(client, token).status_code == 303
        r = post_form(client, "/launch/sweep", form, follow_redirects=False)
        assert r.status_code == 303, r.text[:500]
        sweep_id = r.headers["location"].rsplit("/", 1)[-1]
        again = client.get(f"/launch/sweep?again={sweep_id}").text
        bad = post_form(client, "/launch/sweep", form | {"sweep_mode": "concurrencies",
                        "loads": "1, 4"}, follow_redirects=False)  # fmt: skip
    field = re.search(r'<input[^>]*name="shards"[^>]*>', again, re.S)
    assert field is not None and 'value="2"' in field.group(0), field
    assert bad.status_code == 422
    errors = dict(re.findall(r'id="err-([a-z_-]+)">([^<]*)<', bad.text))
    assert "shards" in errors and "at least the shards" in errors["shards"], errors
    with session_scope(sessions) as s:
        sweeps = compare_repo.list_sweeps(s)
        assert [sw.id for sw in sweeps] == [sweep_id]  # the refused one stored nothing
        steps = compare_repo.sweep_steps(s, sweep_id)
        assert len(steps) == 1 and sweeps[0].plan is not None
        jobs = job_repo.shard_jobs(s, steps[0].run_id)
        assert [(j.shard_idx, j.spec["request_rate"]) for j in jobs] == [(0, 1.0), (1, 1.0)]


def test_a_find_max_step_is_judged_on_the_merged_run(api_db: Api) -> None:
    """A 2-shard find-max sweep (rate, from 1 req/s): step 0's SLO check counts both
    shards' requests (6 = 3 + 3: the merged run, not one shard's), it passes, and the
    search's next step (2 req/s, twice the passing load) is queued as the next dealt run."""
    a = api_db
    fm = {"kind": "rate", "slos": ["ttft:p99:1000"], "max_steps": 3, "start": 1}
    body = SPEC | {"shards": 2, "find_max": fm}
    r = a.client.post("/api/v1/sweeps", json=body, headers=a.h(a.run))
    assert r.status_code == 201, r.text
    sweep_id = r.json()["sweep_id"]
    j0, j1 = (a.lease(a.register()) for _ in range(2))
    assert j0 is not None and j1 is not None and j0["spec"]["request_rate"] == 1.0
    for j in (j0, j1, j0):
        a.post_job(j["job_id"], "shard-ready", {"lease_id": j["lease_id"]})
    for j, idx in ((j0, [0, 2, 4]), (j1, [1, 3, 5])):
        up = {"lease_id": j["lease_id"], "batch_no": 0, "requests": wire(idx)}
        assert a.post_job(j["job_id"], "results", up).status_code == 200
        done = {"lease_id": j["lease_id"], "status": "succeeded", "total_batches": 1,
                "records": 3, "run_meta": {"clock_source": "kernel", "load_stats": {}}}  # fmt: skip
        assert a.post_job(j["job_id"], "complete", done).status_code == 200
    with a.sessions() as s:
        steps = compare_repo.sweep_steps(s, sweep_id)
        summary = dict(steps[0].summary or {})
    checks = summary["slo_checks"]
    assert [(c["slo"], c["samples"], c["ok"]) for c in checks] == [("ttft:p99:1000", 6, True)]
    assert [st.load for st in steps] == [1.0, 2.0]
    k0 = a.lease(a.register())
    assert k0 is not None and k0["spec"]["request_rate"] == 2.0 and k0["run_id"] == steps[1].run_id
