"""Dataset ``weka`` (``app.client.datasets.weka``): the WEKA agentic-coding trace format,
replayed as an agent trace. The fixture is written by hand: three traces, one with a
completed subagent (waited for), an async-launched one (not waited for), think time and
api_time gaps; local and global hash-id scopes; a request with more tokens than its blocks."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from app.client.datasets.base import DatasetError
from app.client.runner import run_load
from app.client.spec import RunSpec
from app.client.tokenizer import BuiltinTokenizer
from app.client.workload import build_workload
from app.domain import RequestStatus
from tests.live_server import LiveServer, LiveServerFactory, live_server  # noqa: F401
from tests.test_client import run

WEKA = str(Path(__file__).parent / "fixtures" / "weka_trace.jsonl")
SPEEDUP = 2.0


def spec(url: str, path: str = WEKA, **kw: Any) -> RunSpec:
    base: dict[str, Any] = {
        "base_url": url,
        "model": "sim",
        "dataset": "weka",
        "dataset_path": path,
        "dataset_options": {"speedup": SPEEDUP},
        "output_len": 3,
        "request_timeout_s": 10.0,
        "scrape_metrics": False,
    }
    return RunSpec(**(base | kw))


def _ms(x: float) -> int:
    return round(x * 1e6 / SPEEDUP)


def test_the_trace_becomes_the_recorded_dag() -> None:
    """Parents and delays as the module doc's rules give them, computed here by hand."""
    w = build_workload(spec("http://h:1"), BuiltinTokenizer())
    t = w.agent
    assert t is not None and t.session_ids == ["s1", "s2", "s3"]
    assert t.session_start_ns == [0, 0, 0]
    got = [(n.session, n.parents, n.delay_ns, n.output_len) for n in t.nodes]
    assert got == [
        (0, (), 0, 3),  # s1 r0 (root at t 0)
        (0, (0,), _ms(20), 2),  # subagent 1's first: 0.07 - (0 + api 0.05)
        (0, (1,), _ms(5), 2),  # its second: think_time 0.005
        (0, (0,), _ms(40), 2),  # async subagent's: 0.09 - 0.05
        # after both markers: its chain's last (r0) and the completed subagent's last (r2),
        # not the async one; 0.2 - max(0.05, 0.06 + 0.100)
        (0, (0, 2), _ms(40), 3),
        (1, (), _ms(500), 1),  # s2: a root waits its own t; out 0 asks 1
        (2, (), 0, 2),
        (2, (6,), _ms(10), 2),  # 0.02 - (0 + 0.01)
    ]
    assert [n.depth for n in t.nodes] == [0, 1, 2, 1, 3, 0, 0, 1]


def _text(w: Any, k: int) -> str:
    content = w.measured[k].messages[0]["content"]
    assert isinstance(content, str)
    return content


def test_prompts_are_the_blocks_exactly_in_tokens_long() -> None:
    tok = BuiltinTokenizer()
    w = build_workload(spec("http://h:1"), tok)
    assert [p.input_tokens for p in w.measured] == [10, 6, 8, 4, 14, 5, 8, 11]
    assert [tok.count(_text(w, k)) for k in range(8)] == [10, 6, 8, 4, 14, 5, 8, 11]
    words = [_text(w, k).split() for k in range(8)]
    # s1: r4 repeats r0's blocks 1, 2, 3 (12 tokens; r0 took 10 of them) then 2 of block 4
    assert words[4][:10] == words[0] and len(words[4]) == 14
    # s1's subagent: its second request repeats blocks 7, 8 whole after the first's 6 tokens
    assert words[2][:6] == words[1]
    # global scope: blocks 1, 2 are the same text in s2 and s3; local s1's 1, 2 are not
    assert words[5][:4] == words[6][:4]
    assert words[7][:8] == words[6]
    assert words[0][:8] != words[6]
    # tokens past the recorded blocks are the request's own
    assert words[7][8:] != words[4][8:11]


def test_the_same_seed_gives_the_same_prompts_another_seed_others() -> None:
    tok = BuiltinTokenizer()
    a = build_workload(spec("http://h:1"), tok)
    b = build_workload(spec("http://h:1"), tok)
    c = build_workload(spec("http://h:1", seed=99), tok)
    assert [p.messages for p in a.measured] == [p.messages for p in b.measured]
    assert [p.messages for p in a.measured] != [p.messages for p in c.measured]


def test_num_prompts_takes_the_first_traces() -> None:
    w = build_workload(spec("http://h:1", num_prompts=1), BuiltinTokenizer())
    assert w.agent is not None and w.agent.session_ids == ["s1"] and len(w.measured) == 5
    with pytest.raises(DatasetError, match="num_prompts: 4 sessions requested, the file has 3"):
        build_workload(spec("http://h:1", num_prompts=4), BuiltinTokenizer())


def test_a_single_trace_object_and_a_list_read_as_jsonl_does(tmp_path: Path) -> None:
    traces = [json.loads(line) for line in Path(WEKA).read_text().splitlines()]
    one = tmp_path / "one.json"
    one.write_text(json.dumps(traces[0], indent=2))
    listed = tmp_path / "list.json"
    listed.write_text(json.dumps(traces))
    tok = BuiltinTokenizer()
    whole = build_workload(spec("http://h:1"), tok)
    assert len(build_workload(spec("http://h:1", str(one)), tok).measured) == 5
    assert [p.messages for p in build_workload(spec("http://h:1", str(listed)), tok).measured] == [
        p.messages for p in whole.measured
    ]


def _bad(tmp_path: Path, trace: dict[str, Any]) -> str:
    path = tmp_path / "bad.jsonl"
    path.write_text(json.dumps(trace) + "\n")
    with pytest.raises(DatasetError) as e:
        build_workload(spec("http://h:1", str(path)), BuiltinTokenizer())
    return str(e.value)


@pytest.mark.parametrize(
    ("change", "said"),
    [
        ({"requests": []}, "trace 1 ('x') requests: a non-empty list is required"),
        ({"block_size": 0}, "trace 1 ('x') block_size"),
        ({"hash_id_scope": "galaxy"}, "trace 1 ('x') hash_id_scope"),
        ({"requests": [{"t": 0, "type": "q", "in": 1, "out": 1}]},
         "requests[0]: 'type' must be 'n', 's' or 'subagent'"),
        ({"requests": [{"type": "n", "in": 1, "out": 1}]}, "requests[0]: 't' is required"),
        ({"requests": [{"t": -1, "type": "n", "in": 1, "out": 1}]},
         "requests[0]: 't' must be a number >= 0"),
        ({"requests": [{"t": 0, "type": "n", "in": -3, "out": 1}]}, "requests[0]: 'in'"),
        ({"requests": [{"t": 0, "type": "n", "in": 3}]}, "requests[0]: 'out'"),
        ({"requests": [{"t": 0, "type": "n", "in": 3, "out": 1, "hash_ids": [1, "a"]}]},
         "requests[0]: 'hash_ids' must hold integers >= 0"),
        ({"requests": [{"t": 0, "type": "n", "in": 3, "out": 1, "think_time": -0.1}]},
         "requests[0]: 'think_time' must be a number >= 0"),
        ({"requests": [{"t": 2, "type": "n", "in": 3, "out": 1},
                       {"t": 1, "type": "n", "in": 3, "out": 1}]},
         "requests[1]: 't' 1 s is earlier than the request before it (2 s)"),
        ({"requests": [{"t": 0, "type": "n", "in": 3, "out": 1},
                       {"t": 1, "type": "subagent", "status": "completed", "requests": [
                           {"t": 1, "type": "n", "in": 2, "out": 1, "api_time": "slow"}]}]},
         "requests[1].requests[0]: 'api_time' must be a number >= 0"),
    ],
)  # fmt: skip
def test_bad_traces_refused_naming_trace_request_and_field(
    tmp_path: Path, change: dict[str, Any], said: str
) -> None:
    trace = {"id": "x", "block_size": 4, "requests": [{"t": 0, "type": "n", "in": 1, "out": 1}]}
    assert said in _bad(tmp_path, trace | change)


def test_two_traces_with_one_id_and_non_json_are_refused(tmp_path: Path) -> None:
    path = tmp_path / "dup.jsonl"
    one = {"id": "x", "requests": [{"t": 0, "type": "n", "in": 1, "out": 1}]}
    path.write_text(json.dumps(one) + "\n" + json.dumps(one) + "\n")
    with pytest.raises(DatasetError, match=r"trace 2 \('x'\) id: given to an earlier trace"):
        build_workload(spec("http://h:1", str(path)), BuiltinTokenizer())
    path.write_text(json.dumps(one) + "\n{nope\n")
    with pytest.raises(DatasetError, match="dataset_path line 2: not valid JSON"):
        build_workload(spec("http://h:1", str(path)), BuiltinTokenizer())


def test_replayed_against_the_simulator_children_after_parents_plus_delay() -> None:
    """Server-side truth: every request arrived, each after its parents' last write plus its
    delay; the simulator's prompt count of each is the trace's ``in``."""
    from app.targets.sim_config import SimConfig
    from app.targets.simulator import start_simulator_thread

    sim = start_simulator_thread(SimConfig(ttft_ms=3, itl_ms=1, seed=5))
    try:
        res = run(run_load(spec(sim.base_url), run_tag="wk"))
        truth = sim.ground_truth()["requests"]
    finally:
        sim.stop()
    recs = sorted((r for r in res.records if not r.warmup), key=lambda r: r.index)
    assert len(recs) == 8 and all(r.status is RequestStatus.OK for r in recs)
    rid = {r.index: f"wk-s{r.session}-t{r.turn}" for r in recs}
    assert set(rid.values()) <= set(truth)
    assert [int(truth[rid[r.index]]["input_tokens"]) for r in recs] == [
        10, 6, 8, 4, 14, 5, 8, 11
    ]  # fmt: skip
    checked = 0
    for r in recs:
        assert r.agent is not None
        if r.agent.parents:
            last = max(truth[rid[p]]["events"]["t_ns"][-1] for p in r.agent.parents)
            assert truth[rid[r.index]]["received_ns"] >= last + r.agent.delay_ns
            checked += 1
    assert checked == 5


def test_cli_bench_replays_it(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from app.cli.main import main
    from app.targets.sim_config import SimConfig
    from app.targets.simulator import start_simulator_thread

    sim = start_simulator_thread(SimConfig(ttft_ms=2, itl_ms=1, seed=1))
    try:
        code = main(["bench", "--base-url", sim.base_url, "--model", "sim",
                     "--dataset-name", "weka", "--dataset-path", WEKA, "--trace-speedup", "4",
                     "--json", "--database-url", f"sqlite:///{tmp_path / 'w.db'}"])  # fmt: skip
        seen = len(sim.ground_truth()["requests"])
    finally:
        sim.stop()
    out = capsys.readouterr().out
    report = json.loads(out[out.index("{") :])
    assert code == 0 and seen == 8
    assert report["metrics"]["requests"]["completed_ok"] == 8


def test_rest_and_worker_store_every_request(
    live_server: LiveServerFactory,  # noqa: F811
    sqlite_url: str,
    tmp_path: Path,
) -> None:
    """Launched over REST, run by a worker whose dataset directory holds the trace: the
    simulator's count of requests is what the dashboard stored, per session."""
    import asyncio
    import dataclasses

    from app.targets.sim_config import SimConfig
    from app.targets.simulator import start_simulator_thread
    from app.worker.loop import Worker
    from tests.test_worker import FAST
    from tests.worker_helpers import api, submit, wait_job

    server: LiveServer = live_server(sqlite_url)
    sim = start_simulator_thread(SimConfig(ttft_ms=2, itl_ms=1, seed=3))
    try:
        body = {
            "base_url": sim.base_url,
            "model": "sim",
            "dataset": "weka",
            "dataset_path": WEKA,
            "dataset_options": {"speedup": 4},
            "output_len": 3,
            "scrape_metrics": False,
        }
        with api(server) as c:
            run_id, job_id = submit(c, body)
            opts = dataclasses.replace(FAST, dataset_dirs=(str(Path(WEKA).parent),))
            w = Worker(server.url, server.worker_token, state_dir=tmp_path / "wk", name="w",
                       options=opts)  # fmt: skip
            outcome = asyncio.run(w.run_once())
            assert outcome is not None and outcome.status == "succeeded", outcome
            wait_job(c, job_id, ("succeeded",), 20)
            rows = c.get(f"/runs/{run_id}/requests", params={"limit": 100}).json()["items"]
        seen = sim.ground_truth()["requests"]
    finally:
        sim.stop()
    assert len(seen) == 8 and len(rows) == 8
    assert sorted(r["status"] for r in rows) == ["ok"] * 8
    sessions = sorted(r["session"] for r in rows)
    assert sessions == [0, 0, 0, 0, 0, 1, 2, 2]
