"""One run dealt over workers (issue 26, ``shards``): the dashboard on loopback (a live
server, SQLite), the simulator as target, in-process workers as the worker tests run them.
Two shards make one run: every request the target saw is stored once, with its shard, the
indices dealt as ``plan.deal`` deals them; each shard's clock offset, bound and start skew
are stored. Shards not all leased within ``shard_wait_s``: the run fails, "k of K shards
leased"."""

from __future__ import annotations

import asyncio
import json
import re
import threading
from collections import Counter
from pathlib import Path
from typing import Any

import pytest

from app.cli.main import main
from app.targets.sim_config import SimConfig
from app.targets.simulator import start_simulator_thread
from tests.live_server import LiveServer, LiveServerFactory, live_server  # noqa: F401
from tests.shard_support import one_job_each, shard_workers
from tests.worker_helpers import api, sim_spec, start_worker_process, submit, wait_for

pytestmark = pytest.mark.timeout(60)


def test_two_shards_make_one_run(
    live_server: LiveServerFactory,  # noqa: F811
    db_url: str,
    tmp_path: Path,
) -> None:
    server = live_server(db_url)
    sim = start_simulator_thread(SimConfig(ttft_ms=3, itl_ms=2, output_len=8, seed=1))
    try:
        body = sim_spec(sim.base_url, num_prompts=20, max_concurrency=4, shards=2,
                        scrape_metrics=False)  # fmt: skip
        with api(server) as c:
            run_id, _ = submit(c, body)
            outcomes = asyncio.run(one_job_each(shard_workers(server, tmp_path, 2)))
            assert all(o is not None and o.status == "succeeded" for o in outcomes), outcomes
            wait_for(
                lambda: c.get(f"/runs/{run_id}").json()["run"]["status"] != "running", 20,
                "the run to end",
            )  # fmt: skip
            rows = c.get(f"/runs/{run_id}/requests", params={"limit": 100}).json()["items"]
            detail = c.get(f"/runs/{run_id}").json()
            page = c.get(f"{server.url}/runs/{run_id}").text
        seen = len(sim.ground_truth()["requests"])
    finally:
        sim.stop()
    run = detail["run"]
    assert run["status"] == "succeeded", (run["status"], detail["report"]["validity"])
    assert seen == 20 == len(rows)
    assert sorted(r["index"] for r in rows) == list(range(20))  # each once: the unsplit plan
    # dealt as plan.deal deals processes: 4 slots over 2 shards, request i with slot i mod 4
    assert {r["index"]: r["shard"] for r in rows} == {i: (i % 4) % 2 for i in range(20)}
    assert Counter(r["status"] for r in rows) == {"ok": 20}
    load = detail["report"]["load"]
    shards = load["shards"]
    assert [s["shard"] for s in shards] == [0, 1]
    for s in shards:
        assert s["ok"] == s["planned"] == 10, s
        assert s["clock"]["samples"] >= 1 and 0 <= s["clock_bound_ms"] < 5, s
        assert not s["clock_flagged"]
        assert s["wake_us"]["run"] >= 0 and s["start_skew_ms"] is not None, s
    assert load["counts"]["planned"] == 20
    table = re.search(r'<table class="data" id="shard-table">(.*?)</table>', page, re.S)
    assert table is not None, page[:500]
    cells = re.findall(
        r'<tr data-shard="(\d)"[^>]*>\s*<td>\d</td>\s*<td class="num">(\d+) / (\d+)</td>',
        table.group(1),
    )
    assert [tuple(map(int, c)) for c in cells] == [(0, 10, 10), (1, 10, 10)]


def test_shards_not_all_leased_in_time_fail_the_run(
    live_server: LiveServerFactory,  # noqa: F811
    sqlite_url: str,
    tmp_path: Path,
) -> None:
    server = live_server(sqlite_url, env={"TOKENTRACE_SHARD_WAIT_S": "1"})
    body = sim_spec("http://127.0.0.1:9", num_prompts=4, shards=2, scrape_metrics=False)
    with api(server) as c:
        run_id, _ = submit(c, body)
        outcome = asyncio.run(one_job_each(shard_workers(server, tmp_path, 1)))[0]
        assert outcome is not None, outcome
        assert outcome.status in (None, "failed") and "lease lost" in str(outcome.detail)
        detail = c.get(f"/runs/{run_id}").json()
        jobs = c.get("/jobs", params={"limit": 10}).json()["items"]
    assert detail["run"]["status"] == "failed"
    assert "1 of 2 shards leased within 1 s" in detail["report"]["validity"]["notes"]
    assert {j["state"] for j in jobs} == {"failed"} and len(jobs) == 2
    assert {j["error"] for j in jobs} == {"1 of 2 shards leased within 1 s"}


@pytest.mark.serial
def test_bench_server_shards_starts_two_worker_processes_together(
    live_server: LiveServerFactory,  # noqa: F811
    sqlite_url: str,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    """``tokentrace bench --server URL --token T --shards 2`` over two ``tokentrace worker``
    processes, each with its own offset estimate: one run, the two woke within their offset
    bounds of each other (both on this host, so their monotonic stamps compare)."""
    server = live_server(sqlite_url)
    sim = start_simulator_thread(SimConfig(ttft_ms=3, itl_ms=2, output_len=8, seed=1))
    rc: list[int] = []
    args = ["bench", "--server", server.url, "--token", server.admin_token, "--json",
            "--base-url", sim.base_url, "--model", "tokentrace-sim", "--num-prompts", "8",
            "--output-len", "8", "--shards", "2", "--no-scrape-metrics"]  # fmt: skip
    cli = threading.Thread(target=lambda: rc.append(main(args)))
    procs = [
        start_worker_process(server.url, server.worker_token, tmp_path / f"w{k}", "--once")
        for k in range(2)
    ]
    try:
        cli.start()
        cli.join(60)
        codes = [p.wait(30) for p in procs]
    finally:
        sim.stop()
        for p in procs:
            if p.poll() is None:
                p.kill()
    assert rc == [0] and codes == [0, 0], (rc, codes)
    report = json.loads(capsys.readouterr().out)
    rows = report["load"]["shards"]
    assert all(r["ok"] == 4 and r["clock"]["samples"] >= 5 for r in rows), rows
    woke = [r["start_mono_ns"] + r["wake_us"]["run"] * 1e3 for r in rows]
    # the start skew between the two workers: each mapped the start through its offset,
    # whose error its bound bounds; on an idle machine the bounds are ~0.5 ms and the skew
    # ~0.1 ms (docs/scale.md); the two bounds together, at least 1 ms, are the guarantee
    bounds = sum(r["clock"]["bound_ns"] for r in rows)
    assert abs(woke[0] - woke[1]) <= max(1e6, bounds), rows


def test_a_killed_worker_leaves_the_run_partial_naming_its_shard(
    live_server: LiveServerFactory,  # noqa: F811
    sqlite_url: str,
    tmp_path: Path,
) -> None:
    """Two ``tokentrace worker`` processes; one is killed mid-run. Its lease expires, the
    other shard ends, and the run is partial: every stored request once, with its shard,
    and a note naming the lost shard and its lost requests."""
    server = live_server(sqlite_url, env={"TOKENTRACE_LEASE_TTL_S": "2"})
    sim = start_simulator_thread(SimConfig(ttft_ms=3, itl_ms=2, output_len=4, seed=2))
    body = sim_spec(sim.base_url, num_prompts=40, request_rate=20, arrival="constant",
                    output_len=4, shards=2, scrape_metrics=False)  # fmt: skip
    procs = [
        start_worker_process(
            server.url, server.worker_token, tmp_path / f"w{k}", "--once", "--name", f"w{k}"
        )
        for k in range(2)
    ]
    try:
        with api(server) as c:
            run_id, _ = submit(c, body)

            def stored() -> list[dict[str, Any]]:
                items: list[dict[str, Any]] = c.get(
                    f"/runs/{run_id}/requests", params={"limit": 100}
                ).json()["items"]
                return items

            wait_for(lambda: len({r["shard"] for r in stored()}) == 2, 20, "both shards' uploads")
            procs[0].kill()
            procs[0].wait(10)
            wait_for(
                lambda: c.get(f"/runs/{run_id}").json()["run"]["status"] not in
                ("queued", "running"), 30, "the run to end",
            )  # fmt: skip
            detail = c.get(f"/runs/{run_id}").json()
            rows = stored()
            jobs = c.get("/jobs", params={"limit": 10}).json()["items"]
        seen = len(sim.ground_truth()["requests"])
    finally:
        sim.stop()
        for p in procs:
            if p.poll() is None:
                p.kill()
    assert detail["run"]["status"] == "partial"
    indices = [r["index"] for r in rows]
    assert len(indices) == len(set(indices)) and 0 < len(indices) < 40
    assert all(r["shard"] == r["index"] % 2 for r in rows)  # without a cap: i mod 2
    assert seen >= len(indices)
    states = sorted(j["state"] for j in jobs)
    assert states == ["failed", "succeeded"], states
    shards = {s["shard"]: s for s in detail["report"]["load"]["shards"]}
    lost = next(k for k, s in shards.items() if s["state"] == "failed")
    mine = sum(1 for r in rows if r["shard"] == lost)
    notes = detail["report"]["validity"]["notes"]
    want = f"shard {lost} lost (worker lost (lease expired on attempt 1)): {mine} of its requests"
    assert any(n.startswith(want) and f"{20 - mine} requests lost" in n for n in notes), notes
    assert detail["run"]["lost_requests"] >= 20 - mine
