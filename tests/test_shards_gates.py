"""A run dealt over workers, more (issue 26): a shard's share dealt again over its worker's
``--processes``, and warm-ups gated across shards. The dashboard on loopback, the
simulator as target, in-process workers as ``test_shards_workers`` runs them.

* 2 shards x 2 load processes: the target saw each request once, each stored once with
  its shard and its process, the indices dealt as ``plan.deal`` deals them twice over.
* With warm-ups, one shard's longer than the other's: no measured request of either shard
  left before the last warm-up of any shard ended (the stored records on the run's axis).
* The server's side of the second rendezvous: a shard lost during its warm-ups is not
  waited for; the others get the measured phase's start.
"""

from __future__ import annotations

import asyncio
import datetime as dt
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from app.services.jobs import expire_lost_leases
from app.storage.models import Job, utcnow
from app.targets.sim_config import SimConfig
from app.targets.simulator import start_simulator_thread
from tests.api_support import Api, api_client
from tests.live_server import LiveServer, LiveServerFactory, live_server  # noqa: F401
from tests.shard_support import one_job_each, shard_workers
from tests.worker_helpers import api, sim_spec, submit, wait_for

pytestmark = pytest.mark.timeout(90)


def _run(server: LiveServer, tmp_path: Path, body: dict[str, Any], processes: int) -> Any:
    with api(server) as c:
        run_id, _ = submit(c, body)
        outcomes = asyncio.run(one_job_each(shard_workers(server, tmp_path, 2, processes)))
        assert all(o is not None and o.status == "succeeded" for o in outcomes), outcomes
        wait_for(
            lambda: c.get(f"/runs/{run_id}").json()["run"]["status"] != "running", 20,
            "the run to end",
        )  # fmt: skip
        rows = c.get(f"/runs/{run_id}/requests", params={"limit": 200}).json()["items"]
        detail = c.get(f"/runs/{run_id}").json()
        page = c.get(f"{server.url}/runs/{run_id}").text
    return rows, detail, page


def test_two_shards_over_two_processes_each(
    live_server: LiveServerFactory,  # noqa: F811
    db_url: str,
    tmp_path: Path,
) -> None:
    server = live_server(db_url)
    sim = start_simulator_thread(SimConfig(ttft_ms=3, itl_ms=2, output_len=6, seed=3))
    try:
        body = sim_spec(sim.base_url, num_prompts=24, max_concurrency=4, shards=2,
                        warmup_requests=3, output_len=6, scrape_metrics=False)  # fmt: skip
        rows, detail, page = _run(server, tmp_path, body, processes=2)
        seen = len(sim.ground_truth()["requests"])
    finally:
        sim.stop()
    run = detail["run"]
    assert run["status"] == "succeeded", (run["status"], detail["report"]["validity"])
    measured = [r for r in rows if not r["warmup"]]
    assert seen == 27 == len(rows)  # 24 measured + 3 warm-ups, each once at the target
    assert sorted(r["index"] for r in rows) == list(range(27))  # each stored once
    assert Counter(r["status"] for r in measured) == {"ok": 24}
    # 4 slots over 2 shards (measured i: slot i mod 4, shard slot mod 2); a shard's 2 slots
    # over its 2 processes (its j-th request: slot j mod 2): counted by hand, shard 0 holds
    # i = 0, 2, 4, 6 ... (its j-th is i = 2j: process j mod 2 = (i mod 4) // 2), shard 1
    # i = 1, 3, 5 ... (i = 2j + 1: process (i mod 4) // 2 as well)
    got = {r["index"] - 3: (r["shard"], r["process"]) for r in measured}
    assert got == {i: ((i % 4) % 2, (i % 4) // 2) for i in range(24)}
    assert set(got.values()) == {(0, 0), (0, 1), (1, 0), (1, 1)}
    warm = [r for r in rows if r["warmup"]]
    assert sorted((r["index"], r["shard"]) for r in warm) == [(0, 0), (1, 1), (2, 0)]
    assert min(r["sent_ms"] for r in measured) >= max(r["end_ms"] for r in warm)
    shards = detail["report"]["load"]["shards"]
    assert [(s["shard"], s["processes"], s["ok"]) for s in shards] == [(0, 2, 12), (1, 2, 12)]
    assert all(s["wake_us"]["run"] >= 0 and s["wake_us"]["measure"] >= 0 for s in shards)
    procs = detail["report"]["load"]["processes"]
    assert sorted((p["shard"], p["process"]) for p in procs) == [(0, 0), (0, 1), (1, 0), (1, 1)]
    for s in shards:  # a shard's CPU is its processes', summed
        mine = [p["cpu_s"] for p in procs if p["shard"] == s["shard"]]
        assert s["cpu_s"] == pytest.approx(sum(mine)) and all(c > 0 for c in mine), (s, mine)
    notes = detail["report"]["validity"]["notes"]
    for k in (0, 1):  # each shard's worker says it dealt the share over its processes
        assert any(n.startswith(f"shard {k}: ") and "worker's --processes 2" in n for n in notes)
    assert 'id="shard-table"' in page and 'id="process-table"' in page


def test_measured_phases_start_after_every_shards_warmups(
    live_server: LiveServerFactory,  # noqa: F811
    db_url: str,
    tmp_path: Path,
) -> None:
    """5 warm-ups dealt i mod 2 over shards of one slot each: shard 0 sends 3 in turn,
    shard 1 two, ~60 ms each; shard 1's warm-ups end ~60 ms before shard 0's. Without the
    second rendezvous shard 1 would start measuring then; with it no measured request of
    either leaves before shard 0's last warm-up ended."""
    server = live_server(db_url)
    sim = start_simulator_thread(SimConfig(ttft_ms=20, itl_ms=5, output_len=8, seed=4))
    try:
        body = sim_spec(sim.base_url, num_prompts=8, max_concurrency=2, shards=2,
                        warmup_requests=5, output_len=8, scrape_metrics=False)  # fmt: skip
        rows, detail, page = _run(server, tmp_path, body, processes=1)
        seen = len(sim.ground_truth()["requests"])
    finally:
        sim.stop()
    assert detail["run"]["status"] == "succeeded", detail["report"]["validity"]
    assert seen == 13 == len(rows) and sorted(r["index"] for r in rows) == list(range(13))
    warm = [r for r in rows if r["warmup"]]
    measured = [r for r in rows if not r["warmup"]]
    ends = {k: max(r["end_ms"] for r in warm if r["shard"] == k) for k in (0, 1)}
    assert ends[0] > ends[1] + 30, ends  # shard 0's warm-ups really are the longer
    # every shard's records count from one start instant (both workers on this host)
    first_sent = min(r["sent_ms"] for r in measured)
    assert first_sent >= max(ends.values()), (first_sent, ends)
    shards = detail["report"]["load"]["shards"]
    starts = [s["measure_start_ms"] for s in shards]
    assert all(st >= max(ends.values()) for st in starts), (starts, ends)
    bounds = sum(s["clock_bound_ms"] for s in shards)
    assert abs(starts[0] - starts[1]) <= max(1.0, bounds) + 1.0, shards
    assert [round(s["warmup_end_ms"], 3) for s in shards] == [round(ends[0], 3), round(ends[1], 3)]
    assert "measure start" in page


@pytest.fixture
def api_db(db_url: str) -> Iterator[Api]:
    with api_client(db_url) as a:
        yield a


def test_a_shard_lost_during_warmups_is_not_waited_for(api_db: Api) -> None:
    """Both shards started; shard 0 ended its warm-ups and waits for the measured start
    (none yet: shard 1's have not ended). Shard 1's worker is lost (its lease expires):
    its job ends failed, and shard 0's next call gets the start, one live shard, ready.
    The run ends partial once shard 0 ends, naming shard 1."""
    a = api_db
    out = a.create_run(shards=2, num_prompts=6, warmup_requests=2)
    j0, j1 = (a.lease(a.register()) for _ in range(2))
    assert j0 is not None and j1 is not None
    for j in (j0, j1, j0):
        a.post_job(j["job_id"], "shard-ready", {"lease_id": j["lease_id"]})
    warm = {"lease_id": j0["lease_id"], "phase": "measure"}
    first = a.post_job(j0["job_id"], "shard-ready", warm).json()
    assert first["start_ns"] is None and (first["leased"], first["ready"]) == (2, 1)
    with a.sessions() as s:  # shard 1's lease ran out; shard 0's is renewed as usual
        s.get(Job, j1["job_id"]).lease_expires_at = utcnow() - dt.timedelta(seconds=1)  # type: ignore[union-attr]
        s.commit()
    assert [e.job_id for e in expire_lost_leases(a.sessions)] == [j1["job_id"]]
    again = a.post_job(j0["job_id"], "shard-ready", warm).json()
    assert again["start_ns"] is not None and (again["leased"], again["ready"]) == (1, 1)
    done = {"lease_id": j0["lease_id"], "status": "succeeded", "total_batches": 0,
            "records": 0}  # fmt: skip
    assert a.post_job(j0["job_id"], "complete", done).status_code == 200
    detail = a.client.get(f"/api/v1/runs/{out['run_id']}", headers=a.h(a.run)).json()
    assert detail["run"]["status"] in ("partial", "failed")
    assert any(n.startswith("shard 1 lost") for n in detail["report"]["validity"]["notes"])
