"""Issue 27 parts 2 and 3 together: a run of several targets reads each target's served
models and identity, and runs the server controls on each one (the prefix-cache reset
before the run and before each sweep step, the profiler around the measured window, the
speculative-decoding counters), against real simulators on loopback. Each simulator's own
log of the controls it was sent is the ground truth; a target without a control (404) is
named in the run's notes while the run goes on. Paths: the CLI (bench, report, sweep) and
REST with a worker (the run page)."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from app.analysis.server_controls import control_rows
from app.analysis.spec_decode import spec_decode
from app.cli.main import main
from app.targets.sim_config import SimConfig
from app.targets.simulator import SimulatorThread, start_simulator_thread
from tests.live_server import LiveServerFactory, live_server  # noqa: F401

pytestmark = pytest.mark.timeout(90)

W, N = 2, 8  # warm-ups, measured requests (round-robin: half on each target)
MIX = "llama-8b:0.7,llama-8b-lora-sql:0.3"
SIM = {"ttft_ms": 2.0, "itl_ms": 0.5, "prefix_cache_block": 4}


def _sim(**kw: Any) -> SimulatorThread:
    return start_simulator_thread(SimConfig(**(SIM | kw)))


@pytest.fixture
def full_pair() -> Iterator[tuple[SimulatorThread, SimulatorThread]]:
    """Two engines with every control: vLLM's reset on one, SGLang's on the other; each
    drafting its own way, each listing its own model."""
    a = _sim(model="llama-8b", seed=1, max_model_len=4096, spec_decode_draft_len=2,
             spec_decode_acceptance=0.5)  # fmt: skip
    b = _sim(model="other-model", seed=2, prefix_cache_reset="sglang", spec_decode_draft_len=3,
             spec_decode_acceptance=0.8)  # fmt: skip
    yield a, b
    a.stop()
    b.stop()


def _bench(urls: list[str], db: str, *extra: str) -> list[str]:
    targets = [x for u in urls for x in ("--base-url", u)]
    return ["bench", *targets, "--model", MIX, "--num-prompts", str(N),
            "--num-warmups", str(W), "--input-len", "24", "--output-len", "12",
            "--max-concurrency", "2", "--seed", "9", "--database-url", db, "--json",
            *extra]  # fmt: skip


def _calls(sim: SimulatorThread) -> list[tuple[str, int]]:
    return [(c["control"], c["after_requests"]) for c in sim.ground_truth()["controls"]]


def _measured_spec_decode(sim: SimulatorThread, run_id: str) -> list[dict[str, Any]]:
    reqs = sim.ground_truth()["requests"]
    return [
        r["spec_decode"]
        for rid, r in reqs.items()
        if rid.startswith(run_id + "-") and int(rid.rsplit("-", 1)[1]) >= W
    ]


def test_cli_bench_runs_each_control_on_each_target_and_reads_each_identity(
    full_pair: tuple[SimulatorThread, SimulatorThread],
    sqlite_url: str,
    capsys: pytest.CaptureFixture[str],
) -> None:
    a, b = full_pair
    urls = [a.base_url, b.base_url]
    assert main(_bench(urls, sqlite_url, "--reset-prefix-cache", "--profile")) == 0
    rep = json.loads(capsys.readouterr().out)
    assert rep["status"] == "succeeded" and rep["spec"]["base_urls"] == urls
    # each engine: reset after its warm-up (one of two), profiled over its measured half
    half_w, half_n = W // 2, N // 2
    assert _calls(a) == [("reset_prefix_cache", half_w), ("start_profile", half_w),
                         ("stop_profile", half_w + half_n)]  # fmt: skip
    assert _calls(b) == _calls(a)  # SGLang's /flush_cache is logged as the same control
    ctl = rep["load"]["server_controls"]
    assert ctl["prefix_cache_reset"] == {
        "reset": True,
        "targets": {
            urls[0]: {"reset": True, "via": "POST /reset_prefix_cache"},
            urls[1]: {"reset": True, "via": "POST /flush_cache"},
        },
    }
    trace = "/tmp/tokentrace-sim-traces/sim-trace-1.json"  # each simulator's first trace
    assert ctl["profile"] == {
        "started": True,
        "stopped": True,
        "targets": {u: {"started": True, "stopped": True, "trace_path": trace} for u in urls},
    }
    # speculative decoding: each target's own counters, and all of them summed
    sd = ctl["spec_decode"]
    truth = {
        u: _measured_spec_decode(s, rep["run_id"]) for u, s in zip(urls, full_pair, strict=True)
    }
    for u, draft_len in zip(urls, (2, 3), strict=True):
        mine = truth[u]
        assert len(mine) == half_n
        acc = sum(m["accepted_tokens"] for m in mine)
        drafted = sum(m["draft_tokens"] for m in mine)
        drafts = sum(m["drafts"] for m in mine)
        assert drafted == draft_len * drafts > 0
        one = sd["targets"][u]
        assert (one["accepted_tokens"], one["draft_tokens"], one["drafts"]) == (
            acc,
            drafted,
            drafts,
        )
        assert one["draft_length"] == pytest.approx(draft_len)
    every = [m for u in urls for m in truth[u]]
    assert sd["accepted_tokens"] == sum(m["accepted_tokens"] for m in every)
    assert sd["draft_tokens"] == sum(m["draft_tokens"] for m in every)
    assert sd["acceptance_rate"] == pytest.approx(sd["accepted_tokens"] / sd["draft_tokens"])
    # identity and served models per target; a model missing from a list names its target
    ident = rep["load"]["server_identity"]["targets"]
    assert list(ident) == urls
    assert ident[urls[0]]["served_models"] == ["llama-8b"]
    assert ident[urls[1]]["served_models"] == ["other-model"]
    assert ident[urls[0]]["max_model_len"] == 4096 and ident[urls[1]]["max_model_len"] is None
    for u in urls:
        assert ident[u]["version"].startswith("tokentrace-sim ")
        assert ident[u]["server_info_path"] == "/server_info"
    assert ident[urls[1]]["server_info"]["speculative_config.num_speculative_tokens"] == 3
    assert rep["load"]["served_models"] == ["llama-8b"]  # the first target's, as before
    missing = [n for n in rep["validity"]["notes"] if "is not among the models" in n]
    assert sorted(missing) == sorted(
        [f"the requested model 'llama-8b' is not among the models {urls[1]} lists "
         "('other-model'): the figures may be of another model"]
        + [f"the requested model 'llama-8b-lora-sql' is not among the models {u} lists "
           f"({listed!r}): the figures may be of another model"
           for u, listed in zip(urls, ("llama-8b", "other-model"), strict=True)]
    )  # fmt: skip
    # the CLI's report of the stored run shows each target's rows
    assert main(["report", rep["run_id"], "--database-url", sqlite_url]) == 0
    out = capsys.readouterr().out
    for u in urls:
        assert f"engine version ({u}): tokentrace-sim " in out
        assert f"served models ({u}): " in out
        assert f"prefix cache ({u}): reset before the measured requests" in out
        assert f"server profiler ({u}): profiled over the measured window; trace:" in out
        assert f"speculative decoding ({u}): acceptance rate " in out
    assert "speculative decoding: all targets: acceptance rate " in out


def test_a_target_without_the_controls_is_named_and_the_run_goes_on(
    capsys: pytest.CaptureFixture[str],
) -> None:
    a = _sim(seed=3)
    b = _sim(seed=4, prefix_cache_reset="none", profiler=False, identity=False)
    urls = [a.base_url, b.base_url]
    try:
        assert main(_bench(urls, "sqlite://", "--no-save", "--reset-prefix-cache",
                           "--profile", "--model", "tokentrace-sim")) == 0  # fmt: skip
        rep = json.loads(capsys.readouterr().out)
        calls_a, calls_b = _calls(a), _calls(b)
    finally:
        a.stop()
        b.stop()
    assert rep["status"] == "succeeded"
    assert rep["metrics"]["requests"]["completed_ok"] == N  # both targets served their half
    assert [c for c, _ in calls_a] == ["reset_prefix_cache", "start_profile", "stop_profile"]
    assert calls_b == []
    notes = rep["validity"]["notes"]
    assert (
        f"{urls[1]}: prefix cache not reset: the server has no POST /reset_prefix_cache "
        "(HTTP 404) nor POST /flush_cache (HTTP 404); the run went on with whatever the "
        "cache held"
    ) in notes
    assert any(n.startswith(f"{urls[1]}: not profiled: the server has no POST /start_profile")
               for n in notes), notes  # fmt: skip
    assert not any(n.startswith(urls[0]) for n in notes), notes
    ctl = rep["load"]["server_controls"]
    assert ctl["prefix_cache_reset"]["reset"] is False  # not every target was reset
    assert ctl["prefix_cache_reset"]["targets"][urls[0]]["reset"] is True
    assert ctl["profile"]["started"] is True and ctl["profile"]["stopped"] is True
    assert ctl["profile"]["targets"][urls[1]] == {
        "started": False,
        "error": "POST /start_profile (HTTP 404)",
    }
    ident = rep["load"]["server_identity"]["targets"]
    assert ident[urls[1]]["unavailable"]["/version"] == "HTTP 404"
    assert ident[urls[0]]["version"].startswith("tokentrace-sim ")
    rows = dict(control_rows(rep["load"]))
    assert "prefix cache" not in rows  # each target's row, none for the whole
    assert rows[f"prefix cache ({urls[0]})"].startswith("reset before the measured requests")
    assert rows[f"prefix cache ({urls[1]})"].startswith(
        "NOT reset: POST /reset_prefix_cache (HTTP 404)"
    )
    assert rows[f"server profiler ({urls[1]})"] == "not profiled: POST /start_profile (HTTP 404)"
    assert rows[f"identity not read ({urls[1]})"].startswith("GET /version: HTTP 404")
    # the pure sum of several engines' counters (a counter that fell was reset)
    start = {"vllm:spec_decode_num_accepted_tokens_total": 5.0,
             "vllm:spec_decode_num_draft_tokens_total": 10.0}  # fmt: skip
    end = {"vllm:spec_decode_num_accepted_tokens_total": 2.0,
           "vllm:spec_decode_num_draft_tokens_total": 20.0}  # fmt: skip
    from app.analysis.spec_decode import rises

    summed = spec_decode({}, rises([(start, end), ({}, end)]))
    assert summed is not None and (summed["accepted_tokens"], summed["draft_tokens"]) == (4, 30)


def test_cli_sweep_resets_every_target_before_every_step(
    sqlite_url: str, capsys: pytest.CaptureFixture[str]
) -> None:
    a, b = _sim(seed=5), _sim(seed=6, prefix_cache_reset="sglang")
    try:
        args = ["sweep", "--base-url", a.base_url, "--base-url", b.base_url,
                "--model", "tokentrace-sim", "--num-prompts", "4", "--num-warmups", "0",
                "--input-len", "16", "--output-len", "4", "--concurrencies", "1", "2",
                "--reset-prefix-cache", "--database-url", sqlite_url, "--json"]  # fmt: skip
        assert main(args) == 0
        summary = json.loads(capsys.readouterr().out)
        calls = [_calls(a), _calls(b)]
    finally:
        a.stop()
        b.stop()
    steps = [st for st in summary["steps"] if st.get("run_id")]
    assert len(steps) == 2
    for mine in calls:  # each step: 4 requests, 2 on each target; its reset before them
        assert mine == [("reset_prefix_cache", 0), ("reset_prefix_cache", 2)]


def test_metrics_url_with_several_targets_is_refused_naming_it(
    capsys: pytest.CaptureFixture[str],
) -> None:
    args = ["bench", "--base-url", "http://127.0.0.1:1", "--base-url", "http://127.0.0.1:2",
            "--model", "m", "--metrics-url", "http://127.0.0.1:1/metrics", "--no-save"]  # fmt: skip
    assert main(args) == 2
    err = capsys.readouterr().err
    assert "metrics-url: names one target's /metrics; base_urls names 2" in err


@pytest.mark.slow
def test_rest_and_worker_show_each_target_on_the_run_page(
    full_pair: tuple[SimulatorThread, SimulatorThread],
    live_server: LiveServerFactory,  # noqa: F811
    sqlite_url: str,
    tmp_path: Path,
) -> None:
    from app.worker.loop import Worker
    from tests.test_worker import FAST
    from tests.worker_helpers import api, submit, wait_job

    a, b = full_pair
    urls = [a.base_url, b.base_url]
    srv = live_server(sqlite_url)
    body = {"base_urls": urls, "model": "llama-8b", "num_prompts": N, "warmup_requests": W,
            "input_len": 16, "output_len": 8, "max_concurrency": 2,
            "reset_prefix_cache": True, "server_profile": True}  # fmt: skip
    with api(srv) as c:
        run_id, job_id = submit(c, body)
        worker = Worker(srv.url, srv.worker_token, state_dir=tmp_path / "w", options=FAST)
        outcome = asyncio.run(worker.run_once())
        assert outcome is not None and outcome.status == "succeeded", outcome
        wait_job(c, job_id, ("succeeded",), 10)
        detail = c.get(f"/runs/{run_id}").json()
        bearer = {"Authorization": f"Bearer {srv.admin_token}"}
        page = httpx.get(f"{srv.url}/runs/{run_id}", headers=bearer).text
    for sim in full_pair:
        assert [c for c, _ in _calls(sim)] == ["reset_prefix_cache", "start_profile",
                                               "stop_profile"]  # fmt: skip
    load = detail["report"]["load"]
    assert list(load["server_identity"]["targets"]) == urls
    assert set(load["server_controls"]["spec_decode"]["targets"]) == set(urls)
    for u in urls:
        assert f"prefix cache ({u})" in page and f"engine version ({u})" in page
    assert f"the requested model &#39;llama-8b&#39; is not among the models {urls[1]}" in page


def test_the_live_values_follow_every_target_together() -> None:
    """A worker's live panel of a run of several targets (``TargetsLive``): counters and
    queues summed over the targets' last scrapes, KV-cache usage averaged."""
    import time

    from app.client.spec import RunSpec
    from app.client.target_scrapes import TargetsLive, start_scrapers, stop_scrapers

    a, b = _sim(seed=7, output_len=4), _sim(seed=8, output_len=4)
    body = {"model": "tokentrace-sim", "prompt": "one two three", "max_tokens": 4}
    try:
        for sim, n in ((a, 3), (b, 5)):  # 12 and 20 generated tokens
            for _ in range(n):
                r = httpx.post(f"{sim.base_url}/v1/completions", json=body, timeout=10)
                assert r.status_code == 200
        spec = RunSpec(base_urls=[a.base_url, b.base_url], model="tokentrace-sim")
        scrapers = start_scrapers(spec)
        live = TargetsLive(scrapers)
        deadline = time.monotonic() + 10
        while (got := live.latest()) is None and time.monotonic() < deadline:
            time.sleep(0.02)
        each = [s.latest() for _, s in scrapers]
        stop_scrapers(scrapers, False)
    finally:
        a.stop()
        b.stop()
    assert got is not None and all(e is not None for e in each)  # every target scraped
    assert got[1]["generation_tokens"] == 12 + 20
    assert got[1]["running"] == 0 and got[0] == max(e[0] for e in each if e is not None)
    kv = [e[1]["kv_cache_usage"] for e in each if e is not None]
    assert got[1]["kv_cache_usage"] == pytest.approx(sum(kv) / 2)


def test_the_controls_leave_out_a_target_the_worker_refuses() -> None:
    """A target whose address is refused (a link-local one, on a worker that refuses them)
    gets no control; the others get theirs."""
    from app.client.runner import run_load
    from app.client.spec import RunSpec

    sim = _sim(seed=9)
    refused = "http://169.254.0.9:9"
    spec = RunSpec(base_urls=[sim.base_url, refused], model="tokentrace-sim", num_prompts=4,
                   input_len=8, output_len=4, reset_prefix_cache=True, server_profile=True,
                   scrape_metrics=False)  # fmt: skip
    try:
        result = asyncio.run(run_load(spec, run_tag="ll", allow_link_local=False))
        calls = _calls(sim)
    finally:
        sim.stop()
    assert result.counts["ok"] == 2  # the refused target's half failed, nothing sent to it
    assert [c for c, _ in calls] == ["reset_prefix_cache", "start_profile", "stop_profile"]
    ctl = result.server_controls
    assert list(ctl["prefix_cache_reset"]["targets"]) == [sim.base_url]
    assert list(ctl["profile"]["targets"]) == [sim.base_url]
    assert not any(refused in n for n in result.notes)
