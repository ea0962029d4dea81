"""Issue 27 part 3: server controls. The prefix-cache reset (vLLM's path, SGLang's, none), the
profiler around the measured window, the engine's identity (bounded reads of a hostile
answer), and speculative-decoding acceptance against the simulator's ground truth; through
the CLI (bench and sweep), the launch and sweep forms, and REST with a worker."""

from __future__ import annotations

import asyncio
import contextlib
import json
import re
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any, ClassVar

import httpx
import pytest

from app.analysis.server_controls import control_rows
from app.analysis.spec_decode import spec_decode
from app.cli.args import Parser, add_bench_arguments, definitions_profile, spec_from_args
from app.cli.main import main
from app.client import served_models, server_identity
from app.client.server_controls import trace_path
from app.client.spec import RunSpec
from app.services.runs import execute_bench
from app.targets.sim_config import SimConfig
from app.targets.simulator import SimulatorThread, start_simulator_thread
from tests.live_server import LiveServerFactory, live_server  # noqa: F401

pytestmark = pytest.mark.timeout(60)

W, N = 2, 6  # warm-ups, measured requests
SIM = {"ttft_ms": 2.0, "itl_ms": 0.5, "seed": 5}


def _sim(**kw: Any) -> SimulatorThread:
    return start_simulator_thread(SimConfig(**(SIM | kw)))


def _json_out(capsys: pytest.CaptureFixture[str]) -> dict[str, Any]:
    out: dict[str, Any] = json.loads(capsys.readouterr().out)
    return out


def _bench(url: str, db: str, *extra: str) -> list[str]:
    return ["bench", "--base-url", url, "--model", "tokentrace-sim", "--num-prompts", str(N),
            "--num-warmups", str(W), "--input-len", "24", "--output-len", "30",
            "--max-concurrency", "2", "--seed", "9", "--database-url", db, "--json",
            *extra]  # fmt: skip


def _index(request_id: str) -> int:
    return int(request_id.rsplit("-", 1)[1])


# ------------------------------------------------------------------ pure: hand computed


def test_spec_decode_figures_by_hand() -> None:
    start = {
        "vllm:spec_decode_num_accepted_tokens_total": 100.0,
        "vllm:spec_decode_num_draft_tokens_total": 400.0,
        "vllm:spec_decode_num_drafts_total": 100.0,
        "pos:0": 60.0,
        "pos:1": 40.0,
    }
    end = {
        "vllm:spec_decode_num_accepted_tokens_total": 400.0,  # +300
        "vllm:spec_decode_num_draft_tokens_total": 1000.0,  # +600
        "vllm:spec_decode_num_drafts_total": 250.0,  # +150
        "pos:0": 180.0,  # +120
        "pos:1": 100.0,  # +60
    }
    sd = spec_decode(start, end)
    assert sd is not None
    assert sd["acceptance_rate"] == pytest.approx(0.5)  # 300 / 600
    assert sd["mean_acceptance_length"] == pytest.approx(3.0)  # 1 + 300 / 150
    assert sd["draft_length"] == pytest.approx(4.0)  # 600 / 150
    assert sd["per_position_acceptance"] == pytest.approx([0.8, 0.4])  # 120/150, 60/150
    # no drafts counter: no mean length; a counter that fell was reset (counted from 0)
    no_drafts = {k: v for k, v in end.items() if "drafts_total" not in k}
    sd2 = spec_decode(start, no_drafts)
    assert sd2 is not None and sd2["mean_acceptance_length"] is None
    reset = dict(end, **{"vllm:spec_decode_num_accepted_tokens_total": 50.0})
    sd3 = spec_decode(start, reset)
    assert sd3 is not None and sd3["accepted_tokens"] == 50.0
    assert spec_decode({}, {"pos:0": 1.0}) is None  # no counters: nothing to show
    rows = dict(control_rows({"server_controls": {"spec_decode": sd}}))
    assert rows["speculative decoding"].startswith(
        "acceptance rate 50.0% (300 of 600 draft tokens); mean acceptance length 3.00 tokens "
        "per step over 150 drafts (draft length 4.0); by position 80.0%, 40.0%"
    )


# ------------------------------------------------------------------ the simulator itself


def test_simulator_reset_really_empties_its_prefix_cache() -> None:
    sim = _sim(prefix_cache_block=4, prefix_cache_reset="sglang")
    body = {"model": "tokentrace-sim", "prompt": "one two three four five six seven eight nine",
            "max_tokens": 2, "stream": False}  # fmt: skip

    def cached() -> int:
        r = httpx.post(f"{sim.base_url}/v1/completions", json=body, timeout=10)
        return int(r.json()["usage"]["prompt_tokens_details"]["cached_tokens"])

    try:
        assert cached() == 0
        assert cached() == 8  # two blocks of 4 seen before
        assert httpx.post(f"{sim.base_url}/reset_prefix_cache").status_code == 404  # sglang's
        assert httpx.post(f"{sim.base_url}/flush_cache").status_code == 200
        assert sim.ground_truth()["prefix_cache_blocks_held"] == 0
        assert cached() == 0  # emptied
    finally:
        sim.stop()


# ------------------------------------------------------------------ CLI: bench


def test_cli_bench_resets_profiles_and_reads_acceptance_over_the_measured_window(
    sqlite_url: str, capsys: pytest.CaptureFixture[str]
) -> None:
    sim = _sim(prefix_cache_block=4, spec_decode_draft_len=3, spec_decode_acceptance=0.6,
               max_model_len=4096)  # fmt: skip
    try:
        # the same prompts twice (same seed): without a reset the measured requests hit
        assert main(_bench(sim.base_url, sqlite_url)) == 0
        warm = _json_out(capsys)
        assert main(_bench(sim.base_url, sqlite_url, "--reset-prefix-cache", "--profile")) == 0
        rep = _json_out(capsys)
        assert main(_bench(sim.base_url, sqlite_url)) == 0
        again = _json_out(capsys)
        gt = sim.ground_truth()
    finally:
        sim.stop()
    assert rep["status"] == "succeeded" and rep["spec"]["server_profile"] is True
    assert rep["spec"]["reset_prefix_cache"] is True
    # the reset came after the run's warm-ups (which are cached from the first run), before
    # its first measured request: those miss, the third run's hit again
    before = W + N  # the first run's requests; then the second run's warm-ups
    calls = [(c["control"], c["after_requests"]) for c in gt["controls"]]
    assert calls == [("reset_prefix_cache", before + W), ("start_profile", before + W),
                     ("stop_profile", before + W + N)]  # fmt: skip
    assert warm["load"]["prefix_cache_responses"]["hit_tokens"] == 0  # a cold simulator
    assert rep["load"]["prefix_cache_responses"]["hit_tokens"] == 0  # reset
    assert again["load"]["prefix_cache_responses"]["hit_tokens"] > 0  # not reset
    ctl = rep["load"]["server_controls"]
    assert ctl["prefix_cache_reset"] == {"reset": True, "via": "POST /reset_prefix_cache"}
    trace = "/tmp/tokentrace-sim-traces/sim-trace-1.json"
    assert ctl["profile"] == {"started": True, "stopped": True, "trace_path": trace}
    # acceptance over the measured window: the ground truth's measured requests, by hand
    mine = [(rid, r) for rid, r in gt["requests"].items() if rid.startswith(rep["run_id"] + "-")]
    assert len(mine) == W + N
    kept = [r for rid, r in mine if _index(rid) >= W]
    measured = [r["spec_decode"] for r in kept]
    accepted = sum(m["accepted_tokens"] for m in measured)
    drafted = sum(m["draft_tokens"] for m in measured)
    drafts = sum(m["drafts"] for m in measured)
    assert drafted == 3 * drafts and drafts > 0
    sd = ctl["spec_decode"]
    assert (sd["accepted_tokens"], sd["draft_tokens"], sd["drafts"]) == (accepted, drafted, drafts)
    assert sd["acceptance_rate"] == pytest.approx(accepted / drafted)
    assert sd["mean_acceptance_length"] == pytest.approx(1 + accepted / drafts)
    pos0 = sum(m["accepted_per_pos"][0] for m in measured)
    assert sd["per_position_acceptance"][0] == pytest.approx(pos0 / drafts)
    # each measured request's tokens: its first, then accepted + 1 per step (at least 30)
    for r in kept:
        m = r["spec_decode"]
        assert r["output_tokens"] <= 1 + m["accepted_tokens"] + m["drafts"]
    ident = rep["load"]["server_identity"]
    assert ident["version"].startswith("tokentrace-sim ") and ident["max_model_len"] == 4096
    assert ident["server_info_path"] == "/server_info"
    assert ident["server_info"]["speculative_config.num_speculative_tokens"] == 3
    assert not any("not reset" in n or "profiled" in n for n in rep["validity"]["notes"])


def test_an_engine_without_the_controls_goes_on_and_says_which_it_lacked(
    capsys: pytest.CaptureFixture[str],
) -> None:
    sim = _sim(prefix_cache_reset="none", profiler=False, identity=False)
    try:
        assert main(_bench(sim.base_url, "sqlite://", "--no-save", "--reset-prefix-cache",
                           "--server-profile")) == 0  # fmt: skip
        rep = _json_out(capsys)
        gt = sim.ground_truth()
    finally:
        sim.stop()
    assert rep["status"] == "succeeded"
    assert rep["metrics"]["requests"]["completed_ok"] == N
    notes = rep["validity"]["notes"]
    assert (
        "prefix cache not reset: the server has no POST /reset_prefix_cache (HTTP 404) nor "
        "POST /flush_cache (HTTP 404); the run went on with whatever the cache held"
    ) in notes
    assert any(n.startswith("not profiled: the server has no POST /start_profile (HTTP 404)")
               for n in notes), notes  # fmt: skip
    ctl = rep["load"]["server_controls"]
    assert ctl["prefix_cache_reset"]["reset"] is False
    assert ctl["profile"] == {"started": False, "error": "POST /start_profile (HTTP 404)"}
    assert "spec_decode" not in ctl  # the simulator drafts nothing unless configured
    ident = rep["load"]["server_identity"]
    assert ident["version"] is None and ident["server_info"] is None
    assert ident["unavailable"] == {"/version": "HTTP 404", "/server_info": "HTTP 404",
                                    "/get_server_info": "HTTP 404"}  # fmt: skip
    assert gt["controls"] == []  # nothing was done
    rows = dict(control_rows(rep["load"]))
    assert rows["prefix cache"].startswith("NOT reset: POST /reset_prefix_cache (HTTP 404)")


def test_sglangs_flush_cache_is_tried_second() -> None:
    sim = _sim(prefix_cache_reset="sglang", profiler=False)
    try:
        spec = RunSpec(base_url=sim.base_url + "/v1", model="tokentrace-sim", num_prompts=2,
                       input_len=8, output_len=4, reset_prefix_cache=True)  # fmt: skip
        out = execute_bench(spec, sessions=None)
        gt = sim.ground_truth()
    finally:
        sim.stop()
    ctl = out.report["load"]["server_controls"]
    assert ctl["prefix_cache_reset"] == {"reset": True, "via": "POST /flush_cache"}
    assert [c["control"] for c in gt["controls"]] == ["reset_prefix_cache"]


# ------------------------------------------------------------------ CLI: sweep


def test_cli_sweep_resets_before_every_step(
    sqlite_url: str, capsys: pytest.CaptureFixture[str]
) -> None:
    sim = _sim(prefix_cache_block=4)
    try:
        args = ["sweep", "--base-url", sim.base_url, "--model", "tokentrace-sim",
                "--num-prompts", "4", "--input-len", "16", "--output-len", "4",
                "--concurrencies", "1", "2", "3", "--reset-prefix-cache",
                "--database-url", sqlite_url, "--json"]  # fmt: skip
        assert main(args) == 0
        summary = _json_out(capsys)
        gt = sim.ground_truth()
    finally:
        sim.stop()
    steps = [st for st in summary["steps"] if st.get("run_id")]
    assert len(steps) >= 2  # a step may be the last when the simulator saturates early
    resets = [c["after_requests"] for c in gt["controls"] if c["control"] == "reset_prefix_cache"]
    assert resets == [4 * i for i in range(len(steps))]  # before each step's requests


def test_profile_flag_alone_profiles_the_server_and_with_a_name_shows_definitions() -> None:
    p = Parser(prog="t")
    add_bench_arguments(p)
    base = ["--base-url", "http://127.0.0.1:1", "--model", "m"]
    alone = p.parse_args([*base, "--profile", "--reset-prefix-cache"])
    assert spec_from_args(alone).server_profile and definitions_profile(alone) is None
    assert spec_from_args(alone).reset_prefix_cache
    named = p.parse_args([*base, "--profile", "vllm"])
    assert not spec_from_args(named).server_profile and definitions_profile(named) == "vllm"
    plain = p.parse_args(base)
    assert not spec_from_args(plain).server_profile and not spec_from_args(plain).reset_prefix_cache


# ------------------------------------------------------------------ hostile answers


class _Hostile(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    answers: ClassVar[dict[str, bytes]] = {}

    def log_message(self, *args: Any) -> None:
        pass

    def _send(self, body: bytes) -> None:
        self.send_response(200)
        self.send_header("content-type", "application/json")
        self.send_header("content-length", str(len(body)))
        self.end_headers()
        with contextlib.suppress(ConnectionError):  # the client gave up on an endless one
            self.wfile.write(body)

    def do_GET(self) -> None:
        self._send(self.answers.get(self.path, b"{}"))

    def do_POST(self) -> None:
        self._send(self.answers.get(self.path, b"{}"))


@pytest.fixture
def hostile() -> Iterator[str]:
    deep = b'{"d":' * 5000 + b'"x"' + b"}" * 5000  # deeper than the parser goes
    info = {f"k{i}": "v\x00" + "z" * 1000 for i in range(200)}  # 200 KB: read, then cut
    info = {"engine\x00": "evil\x00engine", "nested": {"a": {"b": {"c": {"d": 1}}}}, **info}
    models = [{"id": "m", "max_model_len": 2**80}, {"id": "n", "max_model_len": True},
              {"id": "o", "max_model_len": 8192}]  # fmt: skip
    _Hostile.answers = {
        "/version": json.dumps({"version": "9" * (300 << 10)}).encode(),  # > MAX_BYTES
        "/server_info": deep,  # too deep to parse
        "/get_server_info": json.dumps(info).encode(),
        "/v1/models": json.dumps({"data": models}).encode(),
    }
    srv = ThreadingHTTPServer(("127.0.0.1", 0), _Hostile)
    srv.daemon_threads = True
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    try:
        yield f"http://127.0.0.1:{srv.server_address[1]}"
    finally:
        srv.shutdown()
        srv.server_close()


def test_identity_reads_are_bounded_against_a_hostile_engine(hostile: str) -> None:
    spec = RunSpec(base_url=hostile, model="m")
    served = served_models.fetch(spec)
    assert served.max_model_len == {"o": 8192}  # 2^80 and a bool are not lengths
    ident = server_identity.fetch(spec, max_model_len=(served.max_model_len or {}).get("m"))
    assert ident["version"] is None and ident["max_model_len"] is None
    assert ident["unavailable"]["/version"] == "not read: answer larger than 262,144 bytes"
    assert ident["server_info_path"] == "/get_server_info"  # /server_info: too deep
    info = ident["server_info"]
    assert len(info) == server_identity.MAX_KEYS
    assert info["engine"] == "evilengine"
    assert "nested.a.b.c.d" not in info  # past MAX_DEPTH
    for k, v in info.items():
        assert "\x00" not in k and (not isinstance(v, str) or "\x00" not in v)
        assert not isinstance(v, str) or len(v) <= server_identity.MAX_TEXT_CHARS
    json.dumps(ident)  # storable as it is
    _Hostile.answers["/version"] = b'"1.0\\u0000-evil"'  # a bare JSON string, a NUL in it
    assert server_identity.fetch(spec)["version"] == "1.0-evil"
    _Hostile.answers["/version"] = b"v2 \x00plain text"
    assert server_identity.fetch(spec)["version"] == "v2 plain text"


def test_a_profilers_trace_path_is_cleaned() -> None:
    assert trace_path(b'{"trace_path": "/t/a\\u0000b.json"}') == "/t/ab.json"
    assert trace_path(b'{"path": "' + b"p" * 1000 + b'"}') == "p" * 299 + "…"
    assert trace_path(b"Start profiling.") is None and trace_path(b"[1]") is None


# ------------------------------------------------------------------ forms


def test_launch_and_sweep_forms_carry_the_controls() -> None:
    from app.web import launch_form, sweeps_form

    on = {"reset_prefix_cache": "on", "server_profile": "on"}
    form = launch_form.defaults() | {"base_url": "http://127.0.0.1:8000", "model": "m"} | on
    created, errors = launch_form.parse(form)
    assert created is not None, errors
    assert created.reset_prefix_cache and created.server_profile
    plain, _ = launch_form.parse(launch_form.defaults() | {"model": "m"})
    assert plain is not None and not plain.reset_prefix_cache and not plain.server_profile
    again = launch_form.values_from_spec(created.model_dump(mode="json"), "r")
    assert again["reset_prefix_cache"] == "on" and again["server_profile"] == "on"
    sweep_form = sweeps_form.defaults() | {"model": "m", "sweep_mode": "concurrencies",
                                           "loads": "1, 2", "reset_prefix_cache": "on"}  # fmt: skip
    parsed, errors = sweeps_form.parse(sweep_form)
    assert parsed is not None, errors
    assert parsed[0].reset_prefix_cache and not parsed[0].server_profile
    groups = {f.name: f.group for f in sweeps_form.FIELDS}
    assert groups["reset_prefix_cache"] == groups["server_profile"] == "Server controls"


# ------------------------------------------------------------------ REST and a worker


@pytest.mark.slow
def test_rest_and_worker_run_the_controls_and_the_page_shows_them(
    live_server: LiveServerFactory,  # noqa: F811
    sqlite_url: str,
    tmp_path: Path,
) -> None:
    from app.worker.loop import Worker
    from tests.test_worker import FAST
    from tests.worker_helpers import api, submit, wait_job

    srv = live_server(sqlite_url)
    sim = _sim(prefix_cache_block=4, spec_decode_draft_len=2, spec_decode_acceptance=0.5)
    try:
        body = {"base_url": sim.base_url, "model": "tokentrace-sim", "num_prompts": N,
                "warmup_requests": W, "input_len": 16, "output_len": 12, "max_concurrency": 2,
                "reset_prefix_cache": True, "server_profile": True}  # fmt: skip
        with api(srv) as c:
            run_id, job_id = submit(c, body)
            worker = Worker(srv.url, srv.worker_token, state_dir=tmp_path / "w", options=FAST)
            outcome = asyncio.run(worker.run_once())
            assert outcome is not None and outcome.status == "succeeded", outcome
            wait_job(c, job_id, ("succeeded",), 10)
            detail = c.get(f"/runs/{run_id}").json()
            exported = c.get(f"/runs/{run_id}/export/summary.json").text
            bearer = {"Authorization": f"Bearer {srv.admin_token}"}
            page = httpx.get(f"{srv.url}/runs/{run_id}", headers=bearer).text
        gt = sim.ground_truth()
    finally:
        sim.stop()
    spec = detail["report"]["spec"]
    assert spec["reset_prefix_cache"] is True and spec["server_profile"] is True
    ctl = detail["report"]["load"]["server_controls"]
    assert ctl["prefix_cache_reset"]["reset"] is True and ctl["profile"]["stopped"] is True
    calls = [(c["control"], c["after_requests"]) for c in gt["controls"]]
    assert calls == [("reset_prefix_cache", W), ("start_profile", W), ("stop_profile", W + N)]
    measured = [r["spec_decode"] for rid, r in gt["requests"].items() if _index(rid) >= W]
    accepted = sum(m["accepted_tokens"] for m in measured)
    drafted = sum(m["draft_tokens"] for m in measured)
    assert ctl["spec_decode"]["acceptance_rate"] == pytest.approx(accepted / drafted)
    assert detail["report"]["load"]["server_identity"]["max_model_len"] == 32_768
    assert '"server_controls"' in exported and '"server_identity"' in exported
    assert 'id="server-controls"' in page
    assert "reset before the measured requests (POST /reset_prefix_cache)" in page
    assert "acceptance rate " in page and "sim-trace-1.json" in page


# ------------------------------------------------------------------ the key; the sim's options


def test_the_controls_get_the_key_only_where_its_binding_covers(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from app.client.execute import execute
    from app.client.runner import run_load
    from tests.target_listener import Listener

    var, key = "TOKENTRACE_TARGET_KEY_CTL", "sk-ctl-0123456789abcdef"
    with Listener() as target:
        monkeypatch.setenv(var, key)
        monkeypatch.setenv(var + "_TARGETS", f"{target.url}/v1")  # the API's path only
        spec = RunSpec(base_url=target.url + "/v1", model="m", num_prompts=2, input_len=4,
                       output_len=2, api_key_env=var, reset_prefix_cache=True,
                       server_profile=True)  # fmt: skip
        done = asyncio.run(execute(spec, lambda: run_load(spec, run_tag="k")))
        assert done.result is not None and done.result.counts["ok"] == 2, done.error
        by_path = {s.path: s.authorization for s in target.requests()}
    assert by_path["/v1/chat/completions"] == f"Bearer {key}"
    for path in ("/reset_prefix_cache", "/start_profile", "/stop_profile", "/version"):
        assert by_path[path] is None, path  # outside the binding: sent without the key


def test_simulator_options_and_their_bounds() -> None:
    from app.targets.simulator.cli import build_arg_parser, config_from_args

    argv = ["--prefix-cache-reset", "sglang", "--no-profiler", "--no-identity",
            "--max-model-len", "2048", "--spec-decode-draft-len", "5",
            "--spec-decode-acceptance", "0.25"]  # fmt: skip
    ns = build_arg_parser().parse_args(argv)
    cfg = config_from_args(ns)
    assert (cfg.prefix_cache_reset, cfg.profiler, cfg.identity, cfg.max_model_len) == (
        "sglang",
        False,
        False,
        2048,
    )
    assert (cfg.spec_decode_draft_len, cfg.spec_decode_acceptance) == (5, 0.25)
    for bad, msg in (
        ({"prefix_cache_reset": "trt"}, "prefix_cache_reset must be vllm, sglang or none"),
        ({"spec_decode_draft_len": 65}, "spec_decode_draft_len must be in 0..64"),
        ({"spec_decode_acceptance": 1.5}, "spec_decode_acceptance must be in [0, 1]"),
        ({"max_model_len": 0}, "max_model_len must be in 1..1e8"),
    ):
        with pytest.raises(ValueError, match=re.escape(msg)):
            SimConfig(**bad)  # type: ignore[arg-type]
