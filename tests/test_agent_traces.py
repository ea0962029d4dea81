"""Agent traces (datasets ``agentic`` and ``otel``, ``app.client.agent_sessions``): the DAG
replayed over real loopback sockets. A test server answers each request with a reply
unique to it and keeps every body, so what a child carried is checked from the server's
side; the simulator's ground truth checks that no child arrived before its parents ended
plus its delay."""

from __future__ import annotations

import itertools
import json
from pathlib import Path
from typing import Any

import pytest

from app.client.datasets.base import DatasetError
from app.client.runner import run_load
from app.client.spec import RunSpec
from app.domain import RequestRecord, RequestStatus
from tests.test_client import Req, Server, run
from tests.test_sessions import replier
from tests.test_turn_wire_order import server  # noqa: F401 -- a fixture (late bodies)

FIXTURES = Path(__file__).parent / "fixtures"
AGENT = str(FIXTURES / "agent_trace.jsonl")
OTEL = str(FIXTURES / "otel_spans.jsonl")


def spec(url: str, path: str, dataset: str = "agentic", **kw: Any) -> RunSpec:
    base: dict[str, Any] = {
        "base_url": url,
        "model": "m",
        "dataset": dataset,
        "dataset_path": path,
        "output_len": 3,
        "request_timeout_s": 10.0,
        "scrape_metrics": False,
    }
    return RunSpec(**(base | kw))


def by_id(srv: Server) -> dict[str, Req]:
    return {r.headers["x-request-id"]: r for r in srv.requests}


def reply(rid: str, n: int) -> str:
    """What ``replier`` streams for request ``rid`` asked ``n`` tokens."""
    return " ".join(f"{rid}-{i}" for i in range(n))


def measured(res: Any) -> list[RequestRecord]:
    return sorted((r for r in res.records if not r.warmup), key=lambda r: r.index)


def test_children_carry_their_parents_actual_replies_and_tool_results() -> None:
    async def go() -> tuple[Any, Server]:
        async with Server(replier(gap_s=0.001)) as srv:
            res = await run_load(spec(srv.url, AGENT), run_tag="a")
        return res, srv

    res, srv = run(go())
    reqs = by_id(srv)
    assert sorted(reqs) == [f"a-s0-t{k}" for k in range(1, 6)] + ["a-s1-t1", "a-s1-t2"]
    plan = reqs["a-s0-t1"].body["messages"]
    assert plan == [
        {"role": "system", "content": "You are a coding agent."},
        {"role": "user", "content": "Fix the failing test."},
    ]
    # "read" continues plan's conversation: plan's reply as the server streamed it, with a
    # tool call matching the recorded tool result, then the result, then its own prompt
    read = reqs["a-s0-t2"].body["messages"]
    assert read[:2] == plan
    assert read[2]["role"] == "assistant" and read[2]["content"] == reply("a-s0-t1", 4)
    assert read[2]["tool_calls"][0]["id"] == "c1"
    assert read[2]["tool_calls"][0]["function"]["name"] == "read_file"
    assert read[3] == {
        "role": "tool",
        "tool_call_id": "c1",
        "content": "def add(a, b): return a - b",
    }
    assert read[4] == {"role": "user", "content": "Go on."}
    # subagent a gets read's reply through its placeholder; the join gets both subagents'
    sub_a = reqs["a-s0-t3"].body["messages"]
    assert sub_a == [
        {"role": "user", "content": "Subagent: check the docs. Context: " + reply("a-s0-t2", 3)}
    ]
    join = reqs["a-s0-t5"].body["messages"][0]["content"]
    assert join == (
        f"Docs say: {reply('a-s0-t3', 3)} Tests say: {reply('a-s0-t4', 5)} Now write the fix."
    )
    # WEKA's names: "out" for the output length, "think_time" (s) for the delay
    assert reqs["a-s1-t1"].body["max_tokens"] == 3
    s2 = reqs["a-s1-t2"].body["messages"]
    assert s2[1] == {"role": "assistant", "content": reply("a-s1-t1", 3)}
    recs = measured(res)
    assert all(r.status is RequestStatus.OK for r in recs)
    assert res.counts["planned"] == 7 and res.counts["sent"] == 7 and res.counts["unsent"] == 0
    # each record knows its session, its parents' record indices, its depth and delay
    links = {(r.session, r.turn): r.agent for r in recs}
    assert links[(0, 1)] is not None and links[(0, 1)].parents == ()
    join_link = links[(0, 5)]
    assert join_link is not None
    assert join_link.parents == (recs[2].index, recs[3].index) and join_link.depth == 3
    assert join_link.delay_ns == 15_000_000


def test_no_child_leaves_before_its_parents_end_plus_its_delay() -> None:
    async def go() -> Any:
        async with Server(replier(gap_s=0.001)) as srv:
            return await run_load(spec(srv.url, AGENT, dataset_options={"speedup": 2}), run_tag="b")

    recs = {r.index: r for r in measured(run(go()))}
    children = [r for r in recs.values() if r.agent is not None and r.agent.parents]
    assert len(children) == 5
    for r in children:
        assert r.agent is not None and r.sent_ns is not None
        ready = max(recs[p].end_ns or 0 for p in r.agent.parents) + r.agent.delay_ns
        assert r.scheduled_ns == ready  # the record's ready time is exactly that
        assert r.sent_ns >= ready
    # speedup 2 halves the recorded delays
    assert {r.agent.delay_ns for r in children if r.agent} == {10_000_000, 2_500_000, 5_000_000,
                                                                7_500_000, 12_500_000}  # fmt: skip
    # the second session starts 30 ms / 2 after the first
    roots = sorted(
        (r for r in recs.values() if r.agent and not r.agent.parents), key=lambda r: r.index
    )
    assert roots[1].scheduled_ns - roots[0].scheduled_ns == 15_000_000


def test_a_failed_parent_leaves_its_descendants_unsent_and_other_branches_go_on() -> None:
    async def go() -> Any:
        async with Server(replier(gap_s=0.001, fail={"c-s0-t3"})) as srv:
            return await run_load(spec(srv.url, AGENT), run_tag="c"), srv

    res, srv = run(go())
    sent = sorted(by_id(srv))
    assert "c-s0-t5" not in sent  # the join waits on sub_a, which failed
    assert {"c-s0-t4", "c-s1-t2"} <= set(sent)
    assert res.counts["planned"] == 7 and res.counts["sent"] == 6 and res.counts["unsent"] == 1


def test_otel_spans_replayed_by_the_interval_rule() -> None:
    async def go() -> tuple[Any, Server]:
        async with Server(replier(gap_s=0.001)) as srv:
            res = await run_load(spec(srv.url, OTEL, dataset="otel"), run_tag="o")
        return res, srv

    res, srv = run(go())
    reqs = by_id(srv)
    assert reqs["o-s0-t1"].body["messages"] == [{"role": "user", "content": "Plan the change."}]
    assert reqs["o-s0-t2"].body["messages"] == [{"role": "user", "content": "Search the docs."}]
    assert reqs["o-s0-t2"].body["max_tokens"] == 3 and reqs["o-s1-t1"].body["max_tokens"] == 3
    recs = measured(res)
    by_turn = {(r.session, r.turn): r for r in recs}
    join = by_turn[(0, 4)].agent
    assert join is not None
    # llm4 started after llm2 and llm3 ended (parallel branches after llm1): both parents,
    # its delay the gap after the later end (0.300 s - 0.250 s)
    assert join.parents == (by_turn[(0, 2)].index, by_turn[(0, 3)].index)
    assert join.delay_ns == 50_000_000 and join.depth == 2
    # the root's delay: its start after the trace's first span's (10 ms)
    assert by_turn[(0, 1)].agent is not None and by_turn[(0, 1)].agent.delay_ns == 10_000_000


def _write(tmp_path: Path, lines: list[dict[str, Any]]) -> str:
    p = tmp_path / "t.jsonl"
    p.write_text("".join(json.dumps(x) + "\n" for x in lines))
    return str(p)


def _req(sid: str, rid: str, parents: list[str], **kw: Any) -> dict[str, Any]:
    return {"session_id": sid, "request_id": rid, "parent_ids": parents, "prompt": "x"} | kw


@pytest.mark.parametrize(
    ("lines", "said"),
    [
        (
            [_req("s", "a", ["b"]), _req("s", "b", ["c"]), _req("s", "c", ["a"])],
            "dataset_path line 1: 'parent_ids': a cycle in session 's': a -> b -> c -> a",
        ),
        ([_req("s", "a", []), _req("s", "b", ["z"])], "line 2: 'parent_ids': 'z' is no request"),
        ([_req("s", "a", []), _req("t", "b", ["a"])], "line 2: 'parent_ids': 'a' is no request"),
        ([_req("s", "a", [], delay_ms=-1)], "line 1: 'delay_ms' must be >= 0 ms"),
        (
            [_req("s", "a", [], timestamp_ms=50), _req("t", "a", [], timestamp_ms=10)],
            "line 2: 'timestamp_ms' 10 is earlier than the previous session's start 50",
        ),
        ([{"session_id": "s", "prompt": "x"}], "line 1: 'request_id' is required"),
        ([{"request_id": "a", "prompt": "x"}], "line 1: 'session_id' is required"),
        ([{"session_id": "s", "request_id": "a"}], "line 1: 'messages' or 'prompt' is required"),
        ([_req("s", "a", []), _req("s", "a", [])], "line 2: 'request_id' 'a' is given twice"),
        (
            [_req("s", "a", []), _req("s", "b", ["a"], prompt="{{reply:q}}")],
            "line 2: 'messages': {{reply:q}} names no parent",
        ),
        (
            [_req("s", "a", []), _req("s", "b", ["a"], tool_results=[{"content": "r"}])],
            "line 2: 'tool_results': tool results follow the parent's reply",
        ),
    ],
)
def test_bad_traces_refused_naming_line_and_field_nothing_sent(
    tmp_path: Path, lines: list[dict[str, Any]], said: str
) -> None:
    path = _write(tmp_path, lines)

    async def go() -> Server:
        async with Server(replier()) as srv:
            with pytest.raises(DatasetError) as e:
                await run_load(spec(srv.url, path), run_tag="x")
            assert said in str(e.value)
        return srv

    assert run(go()).requests == []


def test_bad_otel_spans_refused(tmp_path: Path) -> None:
    span = {"trace_id": "t", "span_id": "a", "start_time_unix_nano": 20,
            "end_time_unix_nano": 10, "attributes": {"gen_ai.operation.name": "chat",
                                                     "gen_ai.prompt": "x"}}  # fmt: skip
    cases = [
        (span, "line 1: 'end_time_unix_nano' is before 'start_time_unix_nano'"),
        (span | {"end_time_unix_nano": None}, "line 1: 'end_time_unix_nano' is required"),
        (span | {"end_time_unix_nano": 30, "attributes": {"gen_ai.operation.name": "chat"}},
         "line 1: 'attributes.gen_ai.input.messages' (or 'gen_ai.prompt') is required"),
        (span | {"end_time_unix_nano": 30, "parent_span_id": "nope"},
         "line 1: 'parent_span_id' 'nope' is no span of trace 't'"),
    ]  # fmt: skip
    for obj, said in cases:
        path = _write(tmp_path, [obj])
        with pytest.raises(DatasetError) as e:
            run(run_load(spec("http://127.0.0.1:9", path, dataset="otel"), run_tag="x"))
        assert said in str(e.value)


def test_spec_refusals() -> None:
    with pytest.raises(ValueError, match="endpoint must be 'chat'"):
        spec("http://h:1", AGENT, endpoint="completions")
    with pytest.raises(ValueError, match="warmup_requests: an agent trace has no warm-ups"):
        spec("http://h:1", AGENT, warmup_requests=2)
    with pytest.raises(ValueError, match="processes: the dataset 'agentic' is replayed by one"):
        spec("http://h:1", AGENT, processes=2)
    with pytest.raises(ValueError, match="request_rate"):
        spec("http://h:1", AGENT, request_rate=5)


def test_simulator_ground_truth_children_arrive_after_parents_end_plus_delay() -> None:
    """Server-side: each child's request arrived after its parents' last event was written
    plus its delay; and the server's received_ns - that is never negative."""
    from app.targets.sim_config import SimConfig
    from app.targets.simulator import start_simulator_thread

    sim = start_simulator_thread(SimConfig(ttft_ms=3, itl_ms=1, seed=5))
    try:
        res = run(run_load(spec(sim.base_url, AGENT, model="sim"), run_tag="g"))
        truth = sim.ground_truth()["requests"]
    finally:
        sim.stop()
    recs = {r.index: r for r in measured(res)}
    assert all(r.status is RequestStatus.OK for r in recs.values())
    rid = {r.index: f"g-s{r.session}-t{r.turn}" for r in recs.values()}
    checked = 0
    for r in recs.values():
        assert r.agent is not None
        if not r.agent.parents:
            continue
        last_write = max(truth[rid[p]]["events"]["t_ns"][-1] for p in r.agent.parents)
        assert truth[rid[r.index]]["received_ns"] >= last_write + r.agent.delay_ns
        checked += 1
    assert checked == 5
    # the simulator counted the carried replies in the children's prompts: its own prompt
    # count of a child is its parent's (carried) plus the parent's reply as received
    # (the client's count of the streamed text) plus what the child adds
    from app.client.tokenizer import BuiltinTokenizer

    tok = BuiltinTokenizer()
    by_turn = {(r.session, r.turn): r for r in recs.values()}

    def sim_in(s: int, t: int) -> int:
        return int(truth[f"g-s{s}-t{t}"]["input_tokens"])

    def reply_tokens(s: int, t: int) -> int:
        n = by_turn[(s, t)].tokenizer_output_tokens
        assert n is not None and n > 0
        return n

    added = tok.count("def add(a, b): return a - b") + tok.count("Go on.")
    assert sim_in(0, 2) == sim_in(0, 1) + reply_tokens(0, 1) + added
    context = tok.count("Subagent: check the docs. Context: ")
    assert sim_in(0, 3) == context + reply_tokens(0, 2)
    assert sim_in(1, 2) == sim_in(1, 1) + reply_tokens(1, 1) + tok.count("Shorter, please.")


def test_the_worker_protocol_carries_the_link() -> None:
    from app.domain import AgentLink
    from app.protocol.wire import WireRequest

    rec = RequestRecord(index=7, scheduled_ns=5, sent_ns=6, end_ns=9, status=RequestStatus.OK,
                        session=1, turn=3, agent=AgentLink((4, 5), 2, 1_500_000))  # fmt: skip
    wire = WireRequest.model_validate_json(WireRequest.from_record(rec).model_dump_json())
    assert wire.to_record().agent == AgentLink((4, 5), 2, 1_500_000)
    plain = RequestRecord(index=1, scheduled_ns=0, sent_ns=1, end_ns=2, status=RequestStatus.OK)
    assert WireRequest.from_record(plain).to_record().agent is None
    # a stored link that is not well formed reads as none, never as wrong parents
    assert AgentLink.from_values({"agent_parents": ["x"], "agent_depth": 1}) is None
    assert AgentLink.from_values({"ttft_ms": 1.0}) is None


def test_api_refuses_an_agent_trace_on_completions_naming_the_field(sqlite_url: str) -> None:
    from tests.api_support import SPEC, api_client

    with api_client(sqlite_url) as api:
        body = SPEC | {"dataset": "agentic", "dataset_path": "/t.jsonl"}
        for k in ("num_prompts", "request_rate", "input_len"):
            body.pop(k, None)
        bad = api.client.post(
            "/api/v1/runs", json=body | {"endpoint": "completions"}, headers=api.h(api.run)
        )
        assert bad.status_code == 422, bad.text
        assert "endpoint must be 'chat'" in bad.text
        bad = api.client.post(
            "/api/v1/runs", json=body | {"warmup_requests": 1}, headers=api.h(api.run)
        )
        assert bad.status_code == 422 and "warmup_requests" in bad.text, bad.text
        ok = api.client.post("/api/v1/runs", json=body, headers=api.h(api.run))
        assert ok.status_code in (200, 201, 202), ok.text


def test_otel_dependency_rule_against_brute_force() -> None:
    """The rule's fast form against its definition, on random spans: a parent P of X ended
    by X's start, and no other span started at or after P's end and ended by X's start."""
    import random

    from app.client.datasets.otel import parents_by_interval

    rng = random.Random(4)
    for _ in range(30):
        spans = []
        for _ in range(rng.randint(1, 40)):
            s = rng.randint(0, 100)
            spans.append((s, s + rng.randint(0, 30)))
        got = parents_by_interval(spans)
        for k, (start, _end) in enumerate(spans):
            cands = [c for c, (_s, e) in enumerate(spans) if c != k and e <= start]
            want = tuple(
                p for p in cands if not any(q != p and spans[q][0] >= spans[p][1] for q in cands)
            )
            assert got[k] == want, (spans, k)


def test_max_concurrency_bounds_requests_in_flight() -> None:
    async def go() -> Any:
        async with Server(replier(gap_s=0.001)) as srv:
            return await run_load(spec(srv.url, AGENT, max_concurrency=1), run_tag="m")

    res = run(go())
    recs = measured(res)
    assert res.max_in_flight == 1 and all(r.status is RequestStatus.OK for r in recs)
    for r in recs:
        assert r.sent_ns is not None and r.sent_ns >= r.scheduled_ns
        assert r.queued_ns is not None and r.sent_ns >= r.scheduled_ns + r.queued_ns
    spans = sorted((r.sent_ns or 0, r.end_ns or 0) for r in recs)
    assert all(a[1] <= b[0] for a, b in itertools.pairwise(spans))  # never two at once


def test_a_stop_during_a_delay_ends_the_run_leaving_the_rest_unsent(tmp_path: Path) -> None:
    import asyncio
    import time

    path = _write(tmp_path, [_req("s", "a", []), _req("s", "b", ["a"], delay_ms=60_000)])

    async def go() -> tuple[Any, float]:
        stop = asyncio.Event()
        async with Server(replier(gap_s=0.001)) as srv:
            t0 = time.monotonic()
            res = await run_load(
                spec(srv.url, path), run_tag="h", stop=stop, on_record=lambda r: stop.set()
            )
            return res, time.monotonic() - t0

    res, took = run(go())
    assert took < 30  # not the 60 s delay
    assert res.counts["sent"] == 1 and res.counts["unsent"] == 1 and res.stopped == "stopped"


def test_a_parent_whose_body_never_ends_still_releases_its_children(
    server: Any,  # noqa: F811 -- the fixture of tests.test_turn_wire_order
    tmp_path: Path,
) -> None:
    """A body not ended ``DONE_GRACE_S`` after its "[DONE]" is closed by the client: its
    child is due from that close (as a session's next turn), and is sent."""
    from app.client.http_stream import DONE_GRACE_S

    url, _tl = server("chunked-late")
    path = _write(tmp_path, [_req("s", "a", []), _req("s", "b", ["a"], include_parent_reply=True)])
    recs = measured(run(run_load(spec(url, path), run_tag="late")))
    assert [r.status for r in recs] == [RequestStatus.OK, RequestStatus.OK], [r.error for r in recs]
    first, second = recs
    assert first.done_ns is not None
    assert second.scheduled_ns >= first.done_ns + DONE_GRACE_S * 1e9
    assert second.sent_ns is not None and second.sent_ns >= second.scheduled_ns
