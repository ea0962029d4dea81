"""Issue 13: a run's status from its requests by one rule, the note saying why it failed,
and the trust issues that travel with a run (compare refuses, sweeps skip)."""

from __future__ import annotations

import json
import re
import threading
import time
from pathlib import Path

import numpy as np
import pytest

from app.analysis.trust import (
    RequestTally,
    failure_note,
    run_status,
    tally,
)
from app.analysis.verdict import run_trust_issues
from app.cli.main import main
from app.domain import RequestRecord, RequestStatus, RunStatus
from app.services.runs import open_database
from app.storage import repository as repo
from app.storage.db import session_scope
from app.targets.sim_config import SimConfig
from app.targets.simulator import start_simulator_thread


def _rec(i: int, status: RequestStatus, *, sent_s: float, end_s: float, error: str | None = None,
         warmup: bool = False) -> RequestRecord:  # fmt: skip
    return RequestRecord(
        index=i,
        scheduled_ns=int(sent_s * 1e9),
        sent_ns=int(sent_s * 1e9),
        end_ns=int(end_s * 1e9),
        status=status,
        error=error,
        warmup=warmup,
    )


def _died_at_15s() -> list[RequestRecord]:
    """40 requests; the target dies at 15 s: 8 succeeded before, 32 failed (2 cut mid-stream
    at 15.2 s, then 30 refused at connect), plus a failed warm-up that must not count."""
    recs = [_rec(0, RequestStatus.ERROR, sent_s=0.0, end_s=0.1, error="x", warmup=True)]
    for i in range(8):
        recs.append(_rec(1 + i, RequestStatus.OK, sent_s=i * 1.8, end_s=i * 1.8 + 0.4))
    for i in range(2):
        recs.append(_rec(9 + i, RequestStatus.ERROR, sent_s=14.9, end_s=15.2 + i * 0.1,
                         error="connection closed mid-stream (3 events received)"))  # fmt: skip
    for i in range(30):
        recs.append(_rec(11 + i, RequestStatus.ERROR, sent_s=15.3 + i * 0.1,
                         end_s=15.301 + i * 0.1, error="connection refused (connect)"))  # fmt: skip
    return recs


def test_status_rule_and_failure_note_hand_computed() -> None:
    recs = _died_at_15s()
    t = tally(recs)
    assert (t.sent, t.ok, t.failed) == (40, 8, 32)  # the warm-up is not counted
    assert run_status(t, stopped=False, max_error_rate=0.05) is RunStatus.PARTIAL
    assert run_status(t, stopped=False, max_error_rate=0.8) is RunStatus.SUCCEEDED  # 80% = bound
    # stopped by the user: cancelled, whatever it measured (issue 24)
    assert run_status(t, stopped=True, max_error_rate=1.0) is RunStatus.CANCELLED
    assert run_status(RequestTally(5, 0), stopped=False, max_error_rate=1.0) is RunStatus.FAILED
    assert run_status(RequestTally(0, 0), stopped=False, max_error_rate=0.0) is RunStatus.SUCCEEDED
    # 2 of 40 = 5%: not over a 5% bound
    assert run_status(RequestTally(40, 38), stopped=False, max_error_rate=0.05).value == "succeeded"
    note = failure_note(recs, 0.05)
    assert note == (
        "32 of 40 requests failed (80%), mostly connection refused, from 15.2 s (error bound 5%)"
    )
    assert failure_note(recs, 0.8) is None
    # a failure without a message is counted by its status
    odd = [_rec(0, RequestStatus.TIMEOUT, sent_s=1.0, end_s=3.25), *recs[1:9]]
    assert failure_note(odd, 0.05) == (
        "1 of 9 requests failed (11%), mostly timeout, from 3.2 s (error bound 5%)"
    )


def test_run_trust_issues() -> None:
    ok_run = {"id": "r1", "status": "succeeded", "client_limited": False, "spec": {},
              "summary": {"error_rate": 0.05}}  # fmt: skip
    assert run_trust_issues(ok_run) == []  # 5% is within the default 5% bound
    limited = ok_run | {"client_limited": True}
    assert [i.split(":")[0] for i in run_trust_issues(limited)] == ["run r1 is client-limited"]
    errs = ok_run | {"status": "partial", "spec": {"max_error_rate": 0.1},
                     "summary": {"error_rate": 0.25}}  # fmt: skip
    (issue,) = run_trust_issues(errs)
    assert "over its error bound: 25.0% of requests failed (bound 10%)" in issue
    ok_errs = errs | {"status": "succeeded"}
    assert run_trust_issues(ok_errs, error_rate=0.1) == []  # 10% is within a 10% bound
    # partial for no reason the verdict can see (a worker's failure mid-run): still flagged
    assert run_trust_issues(errs, error_rate=0.1) == [
        "run r1 ended partial: it stopped before its plan (its notes say why)"
    ]
    failed = ok_run | {"status": "failed", "summary": {"error_rate": 1.0}}
    assert run_trust_issues(failed) == ["run r1 failed: no measured request succeeded"]


def test_target_killed_mid_run_ends_partial_exit_1(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """The simulator dies after 10 requests of a 60-request run at 20 req/s: the CLI exits 1, the
    run is stored partial, and its first validity note gives the counts and the first
    failure's time, both recomputed here from the stored requests."""
    db = f"sqlite:///{tmp_path / 'died.db'}"
    sim = start_simulator_thread(SimConfig(ttft_ms=5, itl_ms=1, seed=1))

    def kill_after_ten() -> None:  # the target dies once it has answered 10 requests
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline and len(sim.ground_truth()["requests"]) < 10:
            time.sleep(0.01)
        sim.stop()

    killer = threading.Thread(target=kill_after_ten, daemon=True)
    killer.start()
    try:
        rc = main(
            [
                "bench", "--base-url", sim.base_url, "--model", "tokentrace-sim",
                "--num-prompts", "60", "--request-rate", "20", "--arrival", "constant",
                "--input-len", "8", "--output-len", "4", "--request-timeout", "5",
                "--no-scrape-metrics", "--database-url", db, "--json",
            ]
        )  # fmt: skip
    finally:
        killer.join()
        sim.stop()
    rep = json.loads(capsys.readouterr().out)
    assert rc == 1
    assert rep["status"] == "partial"
    assert rep["validity"]["over_error_bound"] is True and rep["validity"]["valid"] is False
    sessions = open_database(db)
    with session_scope(sessions) as s:
        recs = repo.load_records(s, rep["run_id"], include_warmup=False)
        assert repo.get_run(s, rep["run_id"]).status is RunStatus.PARTIAL
    failed = [r for r in recs if r.status is not RequestStatus.OK]
    assert len(recs) == 60 and 5 <= len(failed) <= 55, len(failed)
    refused = sum(1 for r in failed if (r.error or "").startswith("connection refused"))
    assert refused > len(failed) / 2
    first_s = min(r.end_ns for r in failed if r.end_ns is not None) / 1e9
    # the target died after 10 requests at 20 req/s: about 0.5 s into the run
    assert 0.0 < first_s < 3.0
    assert max(r.sent_ns or 0 for r in recs if r.status is RequestStatus.OK) / 1e9 < first_s
    pct = round(100 * len(failed) / 60)
    expect = (
        f"{len(failed)} of 60 requests failed ({pct}%), mostly connection refused, "
        f"from {first_s:.1f} s"
    )
    assert rep["validity"]["notes"][0].startswith(expect), rep["validity"]["notes"]
    # the report's latencies come only from the survivors, and the error rate says so
    assert rep["metrics"]["ttft_ms"]["count"] == 60 - len(failed)
    assert rep["metrics"]["error_rate"] == pytest.approx(len(failed) / 60)


def test_error_bound_flag_and_all_refused_run(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    db = f"sqlite:///{tmp_path / 'refused.db'}"
    sim = start_simulator_thread(SimConfig(ttft_ms=2, itl_ms=1, error_rate=0.3, seed=4))
    try:
        args = [
            "bench", "--base-url", sim.base_url, "--model", "tokentrace-sim",
            "--num-prompts", "30", "--input-len", "8", "--output-len", "4",
            "--no-scrape-metrics", "--database-url", db, "--json",
        ]  # fmt: skip
        rc_loose = main([*args, "--max-error-rate", "0.9"])
        loose = json.loads(capsys.readouterr().out)
        rc_strict = main(args)
        strict = json.loads(capsys.readouterr().out)
    finally:
        sim.stop()
    for rep in (loose, strict):
        assert 0 < rep["metrics"]["error_rate"] < 0.9  # some of 30 failed at 30%
    assert (rc_loose, loose["status"], loose["spec"]["max_error_rate"]) == (0, "succeeded", 0.9)
    assert (rc_strict, strict["status"]) == (1, "partial")
    assert main([*args[:-1], "--max-error-rate", "1.5"]) == 2
    assert "--max-error-rate" in capsys.readouterr().err
    # nothing listens on port 9: every request refused -> failed, errors first, no latencies
    rc = main(
        ["bench", "--base-url", "http://127.0.0.1:9", "--model", "m", "--num-prompts", "4",
         "--no-scrape-metrics", "--database-url", db]
    )  # fmt: skip
    out = capsys.readouterr().out
    assert rc == 1 and "status=failed" in out
    assert re.search(r"4 of 4 requests failed \(100%\), mostly connection refused", out)
    assert out.index("Errors by reason") < out.index("Requests and throughput")
    assert "no request succeeded: no latencies to show" in out and "Latency (ms)" not in out


def test_worker_path_applies_the_same_rule(tmp_path: Path) -> None:
    """The server's decision for a worker's run uses the stored requests and the run's bound."""
    from app.client.spec import RunSpec
    from app.services.job_rules import decide
    from app.services.runs import store_requests
    from app.storage.models import Job

    sessions = open_database(f"sqlite:///{tmp_path / 'w.db'}")
    ids = {}
    for bound in (0.5, 0.8):
        spec = RunSpec(base_url="http://x:1", model="m", max_error_rate=bound)
        with session_scope(sessions) as s:
            ids[bound] = repo.create_run(s, spec, source="worker", status=RunStatus.RUNNING)
            store_requests(s, ids[bound], _died_at_15s())
    with session_scope(sessions) as s:
        for bound, want in ((0.5, RunStatus.PARTIAL), (0.8, RunStatus.SUCCEEDED)):  # 80% failed
            job = Job(id=f"j{bound}", kind="bench", spec={}, run_id=ids[bound])
            out = decide(s, job, ids[bound], "succeeded", None, None, bench_spec={})
            assert out.run_status is want
        # the load itself broke on the worker (no run meta): what was stored is a part
        job = Job(id="j3", kind="bench", spec={}, run_id=ids[0.8])
        out = decide(s, job, ids[0.8], "failed", "the load failed: boom", None, bench_spec={})
        assert out.run_status is RunStatus.PARTIAL and out.job_state == "failed"


def _csv_log(path: Path, seed: int) -> Path:
    rng = np.random.default_rng(seed)
    lines = ["request_id,start_ts,first_token_ts,end_ts,input_tokens,output_tokens"]
    for i in range(120):
        start = i * 0.1
        ttft = float(rng.lognormal(np.log(0.2), 0.3))
        lines.append(f"r{i},{start:.4f},{start + ttft:.4f},{start + ttft + 1.0:.4f},512,64")
    path.write_text("\n".join(lines) + "\n")
    return path


def test_compare_refuses_untrusted_runs_unless_allowed(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from app.services.file_imports import import_path
    from tests.web_support import bench

    url = f"sqlite:///{tmp_path / 'cmp.db'}"
    sessions = open_database(url)
    a = import_path(sessions, "csv", _csv_log(tmp_path / "a.csv", 1), name="a")[0]
    b = import_path(sessions, "csv", _csv_log(tmp_path / "b.csv", 2), name="b")[0]
    limited = import_path(sessions, "csv", _csv_log(tmp_path / "c.csv", 3), name="limited")[0]
    with session_scope(sessions) as s:
        repo.update_run(s, limited, client_limited=True)
    errs = bench(sessions, SimConfig(ttft_ms=2, itl_ms=1, error_rate=0.4, seed=3), "errs")
    db = ["--database-url", url]
    assert main(["compare", a, b, *db]) == 0  # both trusted: a verdict
    capsys.readouterr()
    assert main(["compare", a, limited, *db]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and f"run {limited} is client-limited" in err[0], err
    assert "--allow-invalid" in err[0]
    assert main(["compare", errs, a, *db]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    with session_scope(sessions) as s:
        recs = repo.load_records(s, errs, include_warmup=False)
    rate = sum(r.status is not RequestStatus.OK for r in recs) / len(recs)  # from the requests
    assert len(err) == 1 and f"run {errs} is over its error bound: {rate:.1%}" in err[0], err
    code = main(["compare", a, limited, errs, "--allow-invalid", "--json", *db])
    body = json.loads(capsys.readouterr().out)
    assert code in (0, 1) and body["verdict"] in ("regressed", "improved", "no significant change")
    assert set(body["trust_issues"]) == {limited, errs}
    # a baseline that is itself untrusted is refused the same way
    assert main(["baseline", "save", limited, "--name", "lim", *db]) == 0
    capsys.readouterr()
    assert main(["compare", a, "--baseline", "lim", *db]) == 2
    assert f"run {limited}" in capsys.readouterr().err


def test_max_goodput_never_picks_an_untrusted_step() -> None:
    from app.analysis.sweep import StepSummary, max_goodput

    def step(load: float, ttft99: float) -> StepSummary:
        return StepSummary(0, load, "concurrency", load, load, 100 * load, load, 0.0,
                           {"ttft_ms": {"p99": ttft99}})  # fmt: skip

    steps = [step(1, 50), step(4, 80), step(16, 120), step(64, 400)]
    slos = {"ttft": 150.0}
    assert max_goodput(steps, slos).load == 16  # 64 breaks the SLO
    best = max_goodput(steps, slos, untrusted={2: ["run x is client-limited"]})
    assert (best.step, best.load) == (1, 4)
    assert best.to_dict()["skipped"] == [
        {"step": 2, "load": 16, "reasons": ["run x is client-limited"]}
    ]
    assert "skipped untrusted steps: concurrency 16 (run x is client-limited)" in best.reason
    none = max_goodput(steps[2:3], slos, untrusted={0: ["bad"]})
    assert none.step is None and "no step meets the SLO" in none.reason and "bad" in none.reason


def test_sweep_skips_a_client_limited_step_for_max_goodput(tmp_path: Path) -> None:
    from app.client.spec import RunSpec
    from app.client.sweep_plan import SweepPlan
    from app.services.sweeps import execute_sweep, sweep_summary

    sessions = open_database(f"sqlite:///{tmp_path / 'sw.db'}")
    sim = start_simulator_thread(SimConfig(ttft_ms=5, itl_ms=1.0, output_len=4, seed=2))
    try:
        spec = RunSpec(base_url=sim.base_url, model="tokentrace-sim", num_prompts=16,
                       input_len=8, output_len=4, goodput={"e2el": 5000.0},
                       scrape_metrics=False)  # fmt: skip
        out = execute_sweep(spec, SweepPlan("concurrencies", (1, 4)), sessions=sessions)
    finally:
        sim.stop()
    # the client's own verdict on a loaded machine is not this test's subject: both steps are
    # first trusted, then the top one is marked client-limited
    for step in out.summary["steps"]:
        with session_scope(sessions) as s:
            repo.update_run(s, step["run_id"], client_limited=False)
    first = sweep_summary(sessions, out.sweep_id)["max_goodput"]
    assert first["load"] == 4 and first["skipped"] == []
    top = out.summary["steps"][1]["run_id"]
    with session_scope(sessions) as s:
        repo.update_run(s, top, client_limited=True)
    again = sweep_summary(sessions, out.sweep_id)
    best = again["max_goodput"]
    assert best["load"] == 1 and best["step"] == 0
    assert [s["step"] for s in best["skipped"]] == [1]
    assert f"run {top} is client-limited" in best["skipped"][0]["reasons"][0]
    assert "skipped untrusted steps: concurrency 4" in best["reason"]


def test_error_bound_in_the_api_and_the_launch_form(sqlite_url: str) -> None:
    from app.web import launch_form
    from tests.api_support import api_client

    with api_client(sqlite_url) as api:
        created = api.create_run(max_error_rate=0.2)
        job = api.client.get(f"/api/v1/runs/{created['run_id']}", headers=api.h(api.read))
        assert job.status_code == 200
        assert job.json()["report"]["spec"]["max_error_rate"] == 0.2
        bad = api.client.post(
            "/api/v1/runs",
            json={"base_url": "http://127.0.0.1:1", "model": "m", "max_error_rate": 1.5},
            headers=api.h(api.run),
        )
        assert bad.status_code == 422
        assert "max_error_rate" in bad.json()["detail"][0]["loc"]
    names = [f.name for f in launch_form.FIELDS]
    assert "max_error_rate" in names and launch_form.defaults()["max_error_rate"] == "0.05"
    form = launch_form.defaults() | {"max_error_rate": "0.3"}
    created_form, errors = launch_form.parse(form)
    assert errors == {} and created_form is not None and created_form.max_error_rate == 0.3
    _, errors = launch_form.parse(launch_form.defaults() | {"max_error_rate": "2"})
    assert "max_error_rate" in errors
