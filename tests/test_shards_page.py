"""A dealt run stored and shown (issue 26 part 3): ``tokentrace bench --processes 2`` stores
one run whose requests each name their process (``requests.process_idx``: the export and
the request rows); the run page's per-process table and the CLI's process lines agree
with counts recomputed from the exported rows. Bad ``processes``: exit 2 / 422 naming it,
nothing stored."""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from fastapi.testclient import TestClient
from sqlalchemy import func, select

from app.cli.main import main
from app.services.runs import open_database
from app.storage.models import Run
from app.targets.sim_config import SimConfig
from app.targets.simulator import start_simulator_thread
from tests.api_support import SPEC, Api, api_client, wire
from tests.web_support import web_app

pytestmark = pytest.mark.timeout(120)


def _runs(url: str) -> int:
    with open_database(url)() as s:
        return int(s.scalar(select(func.count()).select_from(Run)) or 0)


def test_bench_processes_stores_one_run_and_shows_each_process(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    url = f"sqlite:///{tmp_path / 'p.db'}"
    sim = start_simulator_thread(SimConfig(ttft_ms=3, itl_ms=2, output_len=8, seed=1))
    try:
        rc = main([
            "bench", "--base-url", sim.base_url, "--model", "tokentrace-sim",
            "--num-prompts", "20", "--max-concurrency", "4", "--processes", "2",
            "--output-len", "8", "--database-url", url,
        ])  # fmt: skip
    finally:
        sim.stop()
    assert rc == 0
    out = capsys.readouterr().out
    with TestClient(web_app(url)) as client:
        run_id = client.get("/api/v1/runs").json()["items"][0]["id"]
        rows: list[dict[str, Any]] = client.get(f"/runs/{run_id}/requests.json").json()
        page = client.get(f"/runs/{run_id}").text
    assert sorted(r["idx"] for r in rows) == list(range(20))
    # dealt by hand: 4 slots over 2 processes, request i with slot i mod 4
    assert {r["idx"]: r["process"] for r in rows} == {i: (i % 4) % 2 for i in range(20)}
    per = Counter(r["process"] for r in rows if r["status"] == "ok")
    assert per == {0: 10, 1: 10}
    table = re.search(r'<table class="data" id="process-table">(.*?)</table>', page, re.S)
    assert table is not None
    cells = re.findall(
        r'<tr data-process="(\d)"[^>]*>\s*<td>\d</td>\s*<td class="num">(\d+) / (\d+)</td>',
        table.group(1),
    )
    assert [(int(p), int(ok), int(n)) for p, ok, n in cells] == [(0, per[0], 10), (1, per[1], 10)]
    for p in (0, 1):
        assert re.search(rf"process {p}: {per[p]}/10 ok, [\d,.]+ tok/s", out), out[-2000:]


@pytest.fixture
def api(sqlite_url: str) -> Iterator[Api]:
    with api_client(sqlite_url) as a:
        yield a


@pytest.mark.parametrize("value", [0, -2, 1.5, "many"])
def test_api_refuses_bad_processes_with_422(api: Api, value: Any) -> None:
    for path in ("/api/v1/runs", "/api/v1/sweeps"):
        body = SPEC | {"processes": value} | ({"rates": [1.0]} if "sweeps" in path else {})
        r = api.client.post(path, json=body, headers=api.h(api.run))
        assert r.status_code == 422, (path, r.status_code, r.text[:300])
        assert r.json()["detail"][0]["loc"][-1] == "processes", r.text[:300]
    with api.sessions() as s:
        assert int(s.scalar(select(func.count()).select_from(Run)) or 0) == 0


@pytest.mark.parametrize("value", ["0", "-1", "1.5", "x"])
def test_cli_refuses_bad_processes_with_exit_2(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], value: str
) -> None:
    url = f"sqlite:///{tmp_path / 'cli.db'}"
    args = ["bench", "--model", "m", "--base-url", "http://127.0.0.1:9", "--database-url", url]
    assert main([*args, f"--processes={value}"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "--processes" in err[0], err
    assert _runs(url) == 0


def test_a_worker_run_with_a_dead_load_process_is_partial_counting_its_lost(api: Api) -> None:
    """A worker's dealt run whose process 1 died: every record it did make is stored, but
    the load said 2 requests were lost (``load_stats.counts.lost``): partial, 2 lost."""
    out = api.create_run(num_prompts=6, processes=2)
    jid, rid = out["job_id"], out["run_id"]
    job = api.lease(api.register())
    assert job is not None and job["spec"]["processes"] == 2
    lid = job["lease_id"]
    body = {"lease_id": lid, "batch_no": 0, "requests": wire([0, 1, 2, 3])}
    assert api.post_job(jid, "results", body).status_code == 200
    note = "process 1 ended before its load did (it died): 2 of its 3 requests are lost"
    meta = {
        "clock_source": "kernel",
        "validity": [note],
        "load_stats": {"counts": {"planned": 6, "sent": 4, "lost": 2}},
    }
    done = {"lease_id": lid, "status": "succeeded", "total_batches": 1, "records": 4,
            "run_meta": meta}  # fmt: skip
    assert api.post_job(jid, "complete", done).status_code == 200
    r = api.client.get(f"/api/v1/runs/{rid}", headers=api.h(api.run)).json()
    assert r["run"]["status"] == "partial" and r["run"]["lost_requests"] == 2
    assert note in r["report"]["validity"]["notes"]


def test_launch_forms_take_processes_and_show_it_again(tmp_path: Path) -> None:
    """The run and sweep forms: ``processes`` stored with the spec, shown by "launch again";
    0 is refused beside the field, nothing stored."""
    from app.services import auth
    from app.storage import repository as repo
    from app.storage.db import session_scope
    from app.web import launch_form, sweeps_form
    from tests.web_support import post_form, sign_in

    url = f"sqlite:///{tmp_path / 'forms.db'}"
    sessions = open_database(url)
    with session_scope(sessions) as s:
        _, token = auth.create_token(s, scopes=["run"], name="runner")
    base = {"base_url": "http://127.0.0.1:9", "model": "m", "num_prompts": "4"}
    with TestClient(web_app(url)) as client:
        assert sign_in(client, token).status_code == 303
        for path, defaults in (("/launch", launch_form.defaults()),
                               ("/launch/sweep", sweeps_form.defaults())):  # fmt: skip
            form = defaults | base | {"processes": "3"}
            if "sweep" in path:
                form |= {"sweep_mode": "rates", "loads": "1, 2"}
            r = post_form(client, path, form, follow_redirects=False)
            errors = re.findall(r'id="err-([a-z_-]+)">([^<]*)<', r.text)
            assert r.status_code == 303, (path, errors)
            bad = post_form(client, path, form | {"processes": "0"}, follow_redirects=False)
            assert bad.status_code == 422
            assert ("processes", "processes: from 1 to 1024 (or auto), not 0") in re.findall(
                r'id="err-([a-z_-]+)">([^<]*)<', bad.text
            )
        first = post_form(client, "/launch", launch_form.defaults() | base | {"processes": "auto"},
                          follow_redirects=False)  # fmt: skip
        run_id = first.headers["location"].removeprefix("/runs/")
        again = client.get(f"/launch?again={run_id}").text
    field = re.search(r'<input[^>]*name="processes"[^>]*>', again, re.S)
    assert field is not None and 'value="auto"' in field.group(0), field
    with session_scope(sessions) as s:
        run = repo.find_run(s, run_id)
        assert run is not None and run.spec["processes"] == "auto"
