"""Workers against the real server (``tokentrace serve`` over loopback HTTP) and the
simulator: a bench job end to end, label requirements, cancel, ``bench --server``, and the
worker command line."""

from __future__ import annotations

import asyncio
import dataclasses
import json
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from app.cli.main import main as cli_main
from app.targets.sim_config import SimConfig
from app.targets.simulator import SimulatorThread, start_simulator_thread
from app.worker.job import JobOutcome
from app.worker.loop import Worker, WorkerOptions
from tests.live_server import LiveServer, LiveServerFactory, live_server  # noqa: F401
from tests.worker_helpers import api, request_indices, sim_spec, submit, wait_job

pytestmark = pytest.mark.timeout(60)

FAST = WorkerOptions(
    backoff_initial_s=0.05,
    backoff_max_s=0.5,
    batch_interval_s=0.2,
    batch_max_requests=8,
    shutdown_grace_s=3.0,
    heartbeat_interval_s=0.2,
    poll_interval_s=0.1,
)


@pytest.fixture(scope="module")
def sim() -> Iterator[SimulatorThread]:
    s = start_simulator_thread(SimConfig(ttft_ms=5, itl_ms=1, output_len=8, seed=3))
    yield s
    s.stop()


@pytest.fixture
def server(live_server: LiveServerFactory, sqlite_url: str) -> LiveServer:  # noqa: F811
    return live_server(sqlite_url)


def make_worker(srv: LiveServer, tmp_path: Path, name: str = "w", **kw: Any) -> Worker:
    return Worker(
        srv.url,
        srv.worker_token,
        state_dir=tmp_path / f"state-{name}",
        name=name,
        options=FAST,
        **kw,
    )


def test_bench_job_end_to_end(server: LiveServer, sim: SimulatorThread, tmp_path: Path) -> None:
    with api(server) as c:
        run_id, job_id = submit(c, sim_spec(sim.base_url, num_prompts=24, warmup_requests=2))
        outcome = asyncio.run(make_worker(server, tmp_path).run_once())
        assert outcome is not None and outcome.status == "succeeded", outcome
        j = wait_job(c, job_id, ("succeeded",), 10)
        assert j["attempt"] == 1
        detail = c.get(f"/runs/{run_id}").json()
        indices = request_indices(c, run_id)
    report = detail["report"]
    assert report["status"] == "succeeded"
    assert sorted(indices) == list(range(26))  # warm-ups stored too, each request once
    req = report["metrics"]["requests"]
    assert req["completed_ok"] == 24 and req["failed"] == 0
    assert report["metrics"]["output_tokens_total"] == 24 * 8
    # the report was computed from the uploaded events: TTFT at least the simulator's
    assert report["metrics"]["ttft_ms"]["p50"] >= 5.0
    assert report["load"]["counts"]["ok"] == 24  # the worker's RunMeta arrived
    gt = sim.ground_truth()
    assert gt  # the simulator saw the requests


def test_requirements_match_labels(
    server: LiveServer, sim: SimulatorThread, tmp_path: Path
) -> None:
    with api(server) as c:
        _, job_id = submit(c, sim_spec(sim.base_url), requirements={"labels": {"rack": "b"}})
        other = make_worker(server, tmp_path, "a", labels={"rack": "a"})
        assert asyncio.run(other.run_once()) is None  # not for this worker
        right = make_worker(server, tmp_path, "b", labels={"rack": "b", "x": "y"})
        outcome = asyncio.run(right.run_once())
        assert outcome is not None and outcome.job_id == job_id
        assert outcome.status == "succeeded"


def test_cancel_via_api_reaches_the_worker(
    server: LiveServer, sim: SimulatorThread, tmp_path: Path
) -> None:
    spec = sim_spec(sim.base_url, num_prompts=300, request_rate=30, arrival="constant")
    box: dict[str, JobOutcome | None] = {}
    with api(server) as c:
        run_id, job_id = submit(c, spec)
        w = make_worker(server, tmp_path)
        t = threading.Thread(target=lambda: box.update(o=asyncio.run(w.run_once())))
        t.start()
        wait_job(c, job_id, ("running",), 10)
        r = c.post(f"/runs/{run_id}/cancel")
        assert r.status_code == 200, r.text
        t.join(20)
        assert not t.is_alive()
        outcome = box["o"]
        assert outcome is not None and outcome.status == "cancelled"
        j = wait_job(c, job_id, ("cancelled",), 10)
        assert j["state"] == "cancelled"
        indices = request_indices(c, run_id)
    assert 0 < len(indices) < 300
    assert len(set(indices)) == len(indices)


def test_bench_server_submits_and_follows(
    server: LiveServer, sim: SimulatorThread, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    stop = threading.Event()
    w = make_worker(server, tmp_path)

    async def serve() -> None:
        ev = asyncio.Event()
        task = asyncio.create_task(w.run_forever(ev))
        while not stop.is_set():
            await asyncio.sleep(0.05)
        ev.set()
        await task

    t = threading.Thread(target=lambda: asyncio.run(serve()))
    t.start()
    try:
        args = ["bench", "--server", server.url, "--token", server.admin_token, "--json"]
        args += ["--base-url", sim.base_url, "--model", "tokentrace-sim", "--num-prompts", "10"]
        args += ["--input-len", "16", "--output-len", "8", "--name", "remote"]
        rc = cli_main(args)
    finally:
        stop.set()
        t.join(10)
    out = capsys.readouterr()
    assert rc == 0, out.err
    report = json.loads(out.out)
    assert report["name"] == "remote" and report["status"] == "succeeded"
    assert report["metrics"]["requests"]["completed_ok"] == 10
    assert "submitted run" in out.err


def test_bench_server_bad_token_and_unreachable(
    server: LiveServer, capsys: pytest.CaptureFixture[str]
) -> None:
    base = ["bench", "--base-url", "http://127.0.0.1:9", "--model", "m", "--num-prompts", "1"]
    assert cli_main([*base, "--server", server.url, "--token", "nope"]) == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "refused the token" in err[0]
    assert cli_main([*base, "--server", "http://127.0.0.1:9", "--token", "t"]) == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "cannot reach" in err[0]


def test_worker_cli_usage_errors(capsys: pytest.CaptureFixture[str]) -> None:
    assert cli_main(["worker", "--server", "http://x", "--token", "t", "--label", "bad"]) == 2
    assert "--label" in capsys.readouterr().err
    assert cli_main(["worker", "--server", "http://x"]) == 2
    assert "--token" in capsys.readouterr().err
    assert cli_main(["worker", "--server", "x", "--token", "t"]) == 2


def test_worker_cli_refused_token_exits_1(
    server: LiveServer, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    args = ["worker", "--server", server.url, "--token", "nope", "--once"]
    assert cli_main([*args, "--state-dir", str(tmp_path / "s")]) == 1
    assert "refused the token" in capsys.readouterr().err


def test_dataset_path_outside_the_workers_dirs_fails_the_run_not_the_worker(
    server: LiveServer, sim: SimulatorThread, tmp_path: Path
) -> None:
    """A run token names a file elsewhere on the worker (an attack: read /etc/..., or send
    a file's content to a target of the attacker's): the run fails naming dataset_path,
    says nothing about the file system, and the worker takes the next job."""
    allowed = tmp_path / "datasets"
    allowed.mkdir()
    (allowed / "p.jsonl").write_text('{"prompt": "hello"}\n')
    secret = tmp_path / "secret.jsonl"
    secret.write_text('{"prompt": "the secret"}\n')
    opts = dataclasses.replace(FAST, dataset_dirs=(str(allowed),))
    worker = Worker(
        server.url, server.worker_token, state_dir=tmp_path / "st", name="d", options=opts
    )
    with api(server) as c:
        spec = sim_spec(sim.base_url, num_prompts=2, dataset="jsonl")
        bad_run, bad_job = submit(c, spec | {"dataset_path": str(secret)})
        outcome = asyncio.run(worker.run_once())
        assert outcome is not None and outcome.status == "failed"
        j = wait_job(c, bad_job, ("failed",), 10)
        assert "dataset_path" in (j["error"] or "") and str(tmp_path) not in (j["error"] or "")
        good_run, _ = submit(c, spec | {"dataset_path": str(allowed / "p.jsonl")})
        outcome = asyncio.run(worker.run_once())
        assert outcome is not None and outcome.status == "succeeded", outcome
    prompts = [r for r in sim.ground_truth()["requests"] if r.startswith((bad_run, good_run))]
    assert prompts and all(p.startswith(good_run) for p in prompts)  # nothing of the secret


def test_a_spool_failure_does_not_kill_the_worker_loop(
    live_server: LiveServerFactory,  # noqa: F811
    sqlite_url: str,
    sim: SimulatorThread,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The spool cannot be written once (EMFILE, a full disk): the loop logs it and goes
    on; the job's lease expires, it is leased again and runs."""
    import errno

    from app.worker.spool import Spool

    srv = live_server(
        sqlite_url, env={"TOKENTRACE_LEASE_TTL_S": "10", "TOKENTRACE_MAX_ATTEMPTS": "5"}
    )  # a 10 s lease: a busy machine's stall must not cost the second attempt its lease
    real = Spool.open_job
    calls: list[int] = []

    def flaky(self: Spool, job: Any) -> Any:
        calls.append(1)
        if len(calls) == 1:
            raise OSError(errno.EMFILE, "Too many open files")
        return real(self, job)

    monkeypatch.setattr(Spool, "open_job", flaky)
    worker = make_worker(srv, tmp_path, "flaky")
    with api(srv) as c:
        _, job_id = submit(c, sim_spec(sim.base_url, num_prompts=3))

        async def main() -> None:
            stop = asyncio.Event()
            task = asyncio.create_task(worker.run_forever(stop))
            deadline = time.monotonic() + 60
            while time.monotonic() < deadline and not any(
                o.job_id == job_id and o.status == "succeeded" for o in worker.outcomes
            ):
                assert not task.done(), task  # the loop is still alive
                await asyncio.sleep(0.1)
            stop.set()
            await task

        asyncio.run(main())
        j = wait_job(c, job_id, ("succeeded",), 30)
    assert len(calls) >= 2 and j["attempt"] >= 2
