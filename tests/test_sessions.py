"""Multi-turn sessions (app.client.sessions) over real loopback sockets: a test server that
answers each request with a reply unique to it and records every request body, so the
history a later turn sends is checked from the server's side."""

from __future__ import annotations

import asyncio
import itertools
import json
import time
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from app.analysis.turns import turn_table
from app.client.runner import run_load
from app.client.spec import RunSpec
from app.client.tokenizer import BuiltinTokenizer
from app.domain import RequestRecord, RequestStatus
from tests.test_client import SSE_HEAD, Req, Server, Writer, chunk, content_ev, ev, run


def replier(gap_s: float = 0.002, fail: set[str] | None = None) -> Any:
    """Streams, for the request with X-Request-Id ``rid``, the words ``<rid>-0 <rid>-1 ...``
    (max_tokens of them, split over several events); ``fail``: ids answered with HTTP 500."""

    async def b(req: Req, w: Writer) -> None:
        rid = req.headers["x-request-id"]
        if fail and rid in fail:
            body = b'{"error": {"message": "boom"}}'
            w.write(
                b"HTTP/1.1 500 Internal Server Error\r\nContent-Type: application/json\r\n"
                b"Content-Length: %d\r\n\r\n%s" % (len(body), body)
            )
            await w.drain()
            return
        n = int(req.body["max_tokens"])
        w.write(SSE_HEAD)
        w.write(chunk(ev({"choices": [{"index": 0, "delta": {"role": "assistant"}}]})))
        for i in range(n):
            await asyncio.sleep(gap_s)
            w.write(chunk(content_ev((" " if i else "") + f"{rid}-{i}", True)))
        usage = {"prompt_tokens": 7, "completion_tokens": n}
        w.write(chunk(ev({"choices": [], "usage": usage})))
        w.write(chunk(b"data: [DONE]\n\n"))
        w.write(b"0\r\n\r\n")
        await w.drain()

    return b


def conversations(tmp_path: Path, convs: list[list[str]]) -> str:
    p = tmp_path / "conv.jsonl"
    p.write_text("".join(json.dumps({"turns": c}) + "\n" for c in convs))
    return str(p)


def spec(url: str, path: str, **kw: Any) -> RunSpec:
    base: dict[str, Any] = {
        "base_url": url,
        "model": "m",
        "dataset": "jsonl",
        "dataset_path": path,
        "multi_turn": True,
        "output_len": 3,
        "num_prompts": 2,
        "request_timeout_s": 5.0,
        "scrape_metrics": False,
    }
    base.update(kw)
    return RunSpec(**base)


def by_id(server: Server) -> dict[str, Req]:
    return {r.headers["x-request-id"]: r for r in server.requests}


def test_history_carries_the_streamed_replies(tmp_path: Path) -> None:
    path = conversations(tmp_path, [["hi there", "and then", "last one"], ["only turn"]])

    async def go() -> tuple[Any, Server]:
        async with Server(replier()) as srv:
            res = await run_load(spec(srv.url, path), run_tag="t")
        return res, srv

    res, srv = run(go())
    reqs = by_id(srv)
    assert sorted(reqs) == ["t-s0-t1", "t-s0-t2", "t-s0-t3", "t-s1-t1"]
    assert reqs["t-s0-t1"].body["messages"] == [{"role": "user", "content": "hi there"}]
    # turn 2: exactly what the server streamed for turn 1, then the next human turn
    assert reqs["t-s0-t2"].body["messages"] == [
        {"role": "user", "content": "hi there"},
        {"role": "assistant", "content": "t-s0-t1-0 t-s0-t1-1 t-s0-t1-2"},
        {"role": "user", "content": "and then"},
    ]
    assert reqs["t-s0-t3"].body["messages"][3:] == [
        {"role": "assistant", "content": "t-s0-t2-0 t-s0-t2-1 t-s0-t2-2"},
        {"role": "user", "content": "last one"},
    ]
    recs = [r for r in res.records if not r.warmup]
    assert [(r.session, r.turn) for r in sorted(recs, key=lambda r: (r.session, r.turn))] == [
        (0, 1),
        (0, 2),
        (0, 3),
        (1, 1),
    ]
    assert all(r.status is RequestStatus.OK for r in recs)
    assert res.counts["planned"] == 4 and res.counts["sent"] == 4 and res.counts["unsent"] == 0
    # the client's prompt count of turn 2: its three messages' contents, each counted
    t2 = next(r for r in recs if (r.session, r.turn) == (0, 2))
    tok = BuiltinTokenizer()
    sent = reqs["t-s0-t2"].body["messages"]
    assert t2.tokenizer_input_tokens == sum(tok.count(m["content"]) for m in sent)


def test_next_turn_after_reply_end_plus_think_time(tmp_path: Path) -> None:
    path = conversations(tmp_path, [["a", "b", "c", "d"]] * 3)
    think_ms = 30.0

    async def go() -> Any:
        async with Server(replier()) as srv:
            return await run_load(
                spec(srv.url, path, num_prompts=3, turn_delay_ms=think_ms), run_tag="t"
            )

    res = run(go())
    recs = sorted(res.records, key=lambda r: (r.session, r.turn))
    gaps = []
    for a, b in itertools.pairwise(recs):
        if a.session != b.session:
            continue
        assert a.end_ns is not None and b.sent_ns is not None
        gaps.append((b.sent_ns - a.end_ns) / 1e6)
    assert len(gaps) == 9
    # never before the reply ended + think time; late by little (loose: a shared CPU)
    assert min(gaps) >= think_ms
    assert max(gaps) < think_ms + 25


def test_concurrency_counts_active_sessions(tmp_path: Path) -> None:
    path = conversations(tmp_path, [["a", "b", "c"]] * 6)

    async def go() -> tuple[Any, Server]:
        async with Server(replier(gap_s=0.003)) as srv:
            res = await run_load(
                spec(srv.url, path, num_prompts=6, max_concurrency=2, turn_delay_ms=5),
                run_tag="t",
            )
        return res, srv

    res, _srv = run(go())
    recs = [r for r in res.records if not r.warmup]
    assert len(recs) == 18
    # sessions' lifetimes (first send .. last end) overlap at most 2 at a time, and do
    # reach 2 (think time leaves no request in flight but the session is still active)
    spans = {}
    for r in recs:
        lo, hi = spans.get(r.session, (r.sent_ns, r.end_ns))
        spans[r.session] = (min(lo, r.sent_ns), max(hi, r.end_ns))
    points = sorted([(lo, 1) for lo, _ in spans.values()] + [(hi, -1) for _, hi in spans.values()])
    live, most = 0, 0
    for _, d in sorted(points, key=lambda p: (p[0], p[1])):
        live += d
        most = max(most, live)
    assert most == 2
    assert res.max_in_flight <= 2


def test_a_failing_turn_ends_only_its_session(tmp_path: Path) -> None:
    path = conversations(tmp_path, [["a", "b", "c"], ["x", "y", "z"]])

    async def go() -> tuple[Any, Server]:
        async with Server(replier(fail={"t-s0-t2"})) as srv:
            res = await run_load(spec(srv.url, path), run_tag="t")
        return res, srv

    res, srv = run(go())
    assert sorted(by_id(srv)) == ["t-s0-t1", "t-s0-t2", "t-s1-t1", "t-s1-t2", "t-s1-t3"]
    recs = {(r.session, r.turn): r for r in res.records}
    assert recs[(0, 2)].status is RequestStatus.ERROR and "boom" in (recs[(0, 2)].error or "")
    assert all(recs[(1, k)].status is RequestStatus.OK for k in (1, 2, 3))
    assert res.counts["planned"] == 6 and res.counts["unsent"] == 1


def test_sharegpt_conversations_and_max_turns(tmp_path: Path) -> None:
    data = [
        {
            "conversations": [
                {"from": "human", "value": "one two"},
                {"from": "gpt", "value": "r r r r"},
                {"from": "human", "value": "three"},
                {"from": "gpt", "value": "r r"},
                {"from": "human", "value": "four"},
                {"from": "gpt", "value": "r"},
            ]
        }
    ]
    p = tmp_path / "sg.json"
    p.write_text(json.dumps(data))

    async def go() -> Server:
        async with Server(replier()) as srv:
            await run_load(
                spec(
                    srv.url,
                    str(p),
                    dataset="sharegpt",
                    num_prompts=1,
                    max_turns=2,
                    dataset_options={"min_len": 1},  # the turns are shorter than vLLM's 4
                ),
                run_tag="t",
            )
        return srv

    reqs = by_id(run(go()))
    assert sorted(reqs) == ["t-s0-t1", "t-s0-t2"]
    # each turn asks for its dataset reply's length; the dataset reply itself is not sent
    assert reqs["t-s0-t1"].body["max_tokens"] == 4
    assert reqs["t-s0-t2"].body["max_tokens"] == 2
    reply = "t-s0-t1-0 t-s0-t1-1 t-s0-t1-2 t-s0-t1-3"
    assert reqs["t-s0-t2"].body["messages"][1]["content"] == reply


def test_chat_messages_jsonl(tmp_path: Path) -> None:
    p = tmp_path / "m.jsonl"
    msgs = [
        {"role": "system", "content": "be brief"},
        {"role": "user", "content": "q1"},
        {"role": "assistant", "content": "a a"},
        {"role": "user", "content": "q2"},
    ]
    p.write_text(json.dumps({"messages": msgs}) + "\n")

    async def go() -> Server:
        async with Server(replier()) as srv:
            await run_load(spec(srv.url, str(p), num_prompts=1), run_tag="t")
        return srv

    reqs = by_id(run(go()))
    assert reqs["t-s0-t1"].body["messages"] == msgs[:2]
    assert reqs["t-s0-t1"].body["max_tokens"] == 2
    assert reqs["t-s0-t2"].body["messages"][2] == {
        "role": "assistant",
        "content": "t-s0-t1-0 t-s0-t1-1",
    }


def test_wire_carries_session_and_turn() -> None:
    from app.protocol.wire import WireRequest

    rec = _rec(3, 2, 0, 5, 9, 2, 4)
    back = WireRequest.model_validate_json(WireRequest.from_record(rec).model_dump_json())
    again = back.to_record()
    assert (again.session, again.turn) == (3, 2)
    single = WireRequest.model_validate(
        {"index": 0, "scheduled_ns": 0, "sent_ns": None, "end_ns": None, "status": "ok"}
    )
    assert (single.session, single.turn) == (None, None)


def test_spec_refusals(tmp_path: Path) -> None:
    path = conversations(tmp_path, [["a"]])
    with pytest.raises(ValueError, match="endpoint"):
        spec("http://127.0.0.1:1", path, endpoint="completions")
    with pytest.raises(ValueError, match="dataset"):
        RunSpec(base_url="http://127.0.0.1:1", model="m", multi_turn=True)
    with pytest.raises(ValueError, match="multi_turn"):
        RunSpec(base_url="http://127.0.0.1:1", model="m", max_turns=2)


def _rec(session: int, turn: int, sent: int, first: int, last: int, n: int, inp: int) -> Any:
    return RequestRecord(
        index=session * 10 + turn,
        scheduled_ns=0,
        sent_ns=sent,
        end_ns=last,
        status=RequestStatus.OK,
        input_tokens=inp,
        output_tokens=n,
        session=session,
        turn=turn,
        event_t_ns=np.array([first, last], np.int64),
        event_bytes=np.array([10, 10], np.int32),
        event_kind=np.array([0, 0], np.int8),
        event_tokens=np.array([1, n - 1], np.int32),
    )


def test_turn_table_against_hand_computation() -> None:
    ms = 1_000_000
    recs = [
        # turn 1: TTFT 100 ms / 50 tokens and 60 ms / 20 tokens; TPOT (last-first)/(n-1)
        _rec(0, 1, 0, 100 * ms, 190 * ms, 10, 50),
        _rec(1, 1, 0, 60 * ms, 100 * ms, 5, 20),
        # turn 2: TTFT 20 ms / 100 tokens
        _rec(0, 2, 300 * ms, 320 * ms, 340 * ms, 3, 100),
    ]
    t = {row["turn"]: row for row in turn_table(recs)}
    assert sorted(t) == [1, 2]
    assert t[1]["requests"] == 2 and t[1]["ok"] == 2
    assert t[1]["ttft_ms"]["mean"] == pytest.approx(80.0)
    assert t[1]["ttft_ms"]["p50"] == pytest.approx(80.0)
    assert t[1]["ttft_per_prompt_token_ms"]["mean"] == pytest.approx((2.0 + 3.0) / 2)
    assert t[1]["tpot_ms"]["mean"] == pytest.approx((10.0 + 10.0) / 2)
    assert t[1]["prompt_tokens"]["mean"] == pytest.approx(35.0)
    assert t[2]["ttft_ms"]["mean"] == pytest.approx(20.0)
    assert t[2]["ttft_per_prompt_token_ms"]["mean"] == pytest.approx(0.2)
    assert t[2]["tpot_ms"]["mean"] == pytest.approx(10.0)
    assert t[2]["prompt_tokens"]["mean"] == pytest.approx(100.0)
    assert turn_table([_rec(0, 1, 0, 1, 2, 2, 1)][:0]) == []


def test_cli_multi_turn_against_the_simulator(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from app.cli.main import main
    from app.targets.sim_config import SimConfig
    from app.targets.simulator import start_simulator_thread

    path = conversations(tmp_path, [["a b c", "d e", "f"], ["g h", "i"]])
    db = f"sqlite:///{tmp_path / 's.db'}"
    sim = start_simulator_thread(SimConfig(ttft_ms=5, itl_ms=1, seed=3))
    try:
        args = ["bench", "--base-url", sim.base_url, "--model", "sim", "--dataset-name"]
        args += ["jsonl", "--dataset-path", path, "--multi-turn", "--num-prompts", "4"]
        args += ["--output-len", "4", "--max-turns", "2", "--database-url", db]
        assert main([*args, "--json"]) == 0
        rep = json.loads(capsys.readouterr().out)
        # sessions 0, 2 replay conversation 0 (2 turns kept), 1, 3 conversation 1 (2 turns)
        rows = {r["turn"]: r for r in rep["turns"]}
        assert rows[1]["requests"] == 4 and rows[1]["ok"] == 4
        assert rows[2]["requests"] == 4 and rows[2]["ok"] == 4
        assert rep["metrics"]["requests"]["completed_ok"] == 8
        # turn 2 carries turn 1 and its reply: more prompt tokens than turn 1 by the server
        assert rows[2]["prompt_tokens"]["mean"] > rows[1]["prompt_tokens"]["mean"]
        # the stored requests keep their session and turn (migration 0012)
        from app.services.runs import open_database
        from app.storage import repository as repo
        from app.storage.db import session_scope

        with session_scope(open_database(db)) as s:
            stored = repo.load_records(s, rep["run_id"])
        pairs = sorted((r.session, r.turn) for r in stored)
        assert pairs == [(s_, t_) for s_ in range(4) for t_ in (1, 2)]
        # the stored run's report has the same table
        assert main(["report", rep["run_id"], "--json", "--database-url", db]) == 0
        assert json.loads(capsys.readouterr().out)["turns"] == rep["turns"]
        assert main(["report", rep["run_id"], "--database-url", db]) == 0
        assert "By turn" in capsys.readouterr().out
        bad = [*args, "--endpoint", "completions"]
        assert main(bad) == 2
        captured = capsys.readouterr()
        assert "endpoint must be 'chat'" in captured.out + captured.err
    finally:
        sim.stop()


def test_stop_during_think_time_ends_the_run(tmp_path: Path) -> None:
    path = conversations(tmp_path, [["a", "b", "c"]] * 2)

    async def go() -> Any:
        async with Server(replier()) as srv:
            return await run_load(
                spec(srv.url, path, turn_delay_ms=60_000, max_duration_s=0.5), run_tag="t"
            )

    t0 = time.monotonic()
    res = run(go())
    assert time.monotonic() - t0 < 10  # not the 60 s think time
    assert res.stopped == "max_duration"
    assert [r.turn for r in res.records] == [1, 1]
    assert res.counts["planned"] == 6 and res.counts["unsent"] == 4


def test_comparability_key_tells_sessions_apart() -> None:
    from app.analysis.comparability import check, comparability_key

    base = {"model": "m", "dataset": "sharegpt", "endpoint": "chat"}
    single = comparability_key(base)
    old = comparability_key({**base, "multi_turn": False})
    multi = comparability_key({**base, "multi_turn": True, "max_turns": 4, "turn_delay_ms": 50})
    assert single == old  # runs from before the field are single requests
    assert multi["dataset"] == "sharegpt, multi-turn sessions (at most 4 turns, think 50 ms)"
    assert [d.field for d in check([single, multi]).differing] == ["dataset"]


def test_api_refuses_multi_turn_on_completions_naming_the_field(db_url: str) -> None:
    from tests.api_support import SPEC, api_client

    with api_client(db_url) as api:
        body = SPEC | {"multi_turn": True, "dataset": "jsonl", "dataset_path": "/c.jsonl"}
        bad = api.client.post(
            "/api/v1/runs", json=body | {"endpoint": "completions"}, headers=api.h(api.run)
        )
        assert bad.status_code == 422, bad.text
        assert "endpoint must be 'chat'" in bad.text
        ok = api.client.post("/api/v1/runs", json=body | {"max_turns": 3}, headers=api.h(api.run))
        assert ok.status_code in (200, 201, 202), ok.text
        job = api.client.get("/api/v1/jobs", headers=api.h(api.admin)).json()
        assert "multi_turn" in json.dumps(job)


def test_warmups_are_single_first_turns(tmp_path: Path) -> None:
    path = conversations(tmp_path, [["a", "b"], ["c", "d"], ["w1", "w2"]])

    async def go() -> tuple[Any, Server]:
        async with Server(replier()) as srv:
            res = await run_load(spec(srv.url, path, warmup_requests=1), run_tag="t")
        return res, srv

    res, srv = run(go())
    warm = [r for r in res.records if r.warmup]
    assert len(warm) == 1 and warm[0].turn is None and warm[0].index == 0
    # the warm-up is the last conversation's first turn, sent alone (its own id)
    assert by_id(srv)["t-0"].body["messages"] == [{"role": "user", "content": "w1"}]
    measured = sorted((r.session, r.turn, r.index) for r in res.records if not r.warmup)
    assert [(s_, t_) for s_, t_, _ in measured] == [(0, 1), (0, 2), (1, 1), (1, 2)]
    assert sorted(i for *_, i in measured) == [1, 2, 3, 4]
    assert res.counts["planned"] == 4 and res.counts["warmup"] == 1


def test_launch_form_multi_turn_fields() -> None:
    import app.api.app  # noqa: F401  (the web package's modules load in the app's order)
    from app.web import launch_form

    form = launch_form.defaults() | {
        "dataset": "jsonl",
        "dataset_path": "/c.jsonl",
        "multi_turn": "on",
        "max_turns": "3",
        "turn_delay_ms": "20",
    }
    created, errors = launch_form.parse(form)
    assert errors == {} and created is not None
    dumped = created.model_dump()
    assert (dumped["multi_turn"], dumped["max_turns"], dumped["turn_delay_ms"]) == (True, 3, 20.0)
    _, errors = launch_form.parse(form | {"endpoint": "completions"})
    assert "endpoint must be 'chat'" in errors["endpoint"]
    # a fresh form is single requests and valid as such
    created, errors = launch_form.parse(launch_form.defaults())
    assert errors == {} and created is not None and created.model_dump()["multi_turn"] is False


def test_every_turn_carries_headers_and_sampling(tmp_path: Path) -> None:
    """The run's headers and sampling parameters go with every turn, not only the first
    (a later turn's body is built from a template: it carries them too)."""
    path = conversations(tmp_path, [["one", "two", "three"]])

    async def go() -> Server:
        async with Server(replier()) as srv:
            s = spec(
                srv.url, path, num_prompts=1, headers={"X-Tenant": "lab-2"},
                temperature=0.25, top_p=0.5, extra_body={"seed": 3},
            )  # fmt: skip
            await run_load(s, run_tag="h")
        return srv

    reqs = by_id(run(go()))
    assert sorted(reqs) == ["h-s0-t1", "h-s0-t2", "h-s0-t3"]
    for r in reqs.values():
        assert r.headers["x-tenant"] == "lab-2"
        assert (r.body["temperature"], r.body["top_p"], r.body["seed"]) == (0.25, 0.5, 3)
        assert r.body["stream"] is True and r.headers["accept"] == "text/event-stream"
    assert reqs["h-s0-t3"].body["messages"][1]["content"] == "h-s0-t1-0 h-s0-t1-1 h-s0-t1-2"


def test_sessions_without_streaming_carry_the_answers(tmp_path: Path) -> None:
    """``stream: false``: each turn asks for one JSON answer (Accept application/json, no
    stream_options) and the next turn's history carries that answer's content."""
    path = conversations(tmp_path, [["one", "two"]])

    async def answer(req: Req, w: Writer) -> None:
        rid = req.headers["x-request-id"]
        body = json.dumps(
            {
                "id": rid,
                "object": "chat.completion",
                "choices": [
                    {"index": 0, "message": {"role": "assistant", "content": f"answer {rid}"},
                     "finish_reason": "length"}
                ],
                "usage": {"prompt_tokens": 5, "completion_tokens": 2},
            }
        ).encode()  # fmt: skip
        w.write(
            b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\n"
            b"Content-Length: %d\r\n\r\n%s" % (len(body), body)
        )
        await w.drain()

    async def go() -> tuple[Any, Server]:
        async with Server(answer) as srv:
            res = await run_load(spec(srv.url, path, num_prompts=1, stream=False), run_tag="n")
        return res, srv

    res, srv = run(go())
    reqs = by_id(srv)
    assert sorted(reqs) == ["n-s0-t1", "n-s0-t2"]
    for r in reqs.values():
        assert r.body["stream"] is False and "stream_options" not in r.body
        assert r.headers["accept"] == "application/json"
    assert reqs["n-s0-t2"].body["messages"] == [
        {"role": "user", "content": "one"},
        {"role": "assistant", "content": "answer n-s0-t1"},
        {"role": "user", "content": "two"},
    ]
    assert all(r.status is RequestStatus.OK for r in res.records)


def _crlf_replier() -> Any:
    """As ``replier``, its events ended by CRLF CRLF: the one decoder reads those too, so the
    next turn still leaves from where the reply ended."""

    async def b(req: Req, w: Writer) -> None:
        rid = req.headers["x-request-id"]
        n = int(req.body["max_tokens"])
        w.write(SSE_HEAD)
        for i in range(n):
            await asyncio.sleep(0.002)
            delta = {"content": (" " if i else "") + f"{rid}-{i}"}
            w.write(chunk(b"data: " + json.dumps({"choices": [{"delta": delta}]}).encode()))
            w.write(chunk(b"\r\n\r\n"))
        usage = {"prompt_tokens": 7, "completion_tokens": n}
        w.write(chunk(b"data: " + json.dumps({"choices": [], "usage": usage}).encode()))
        w.write(chunk(b"\r\n\r\ndata: [DONE]\r\n\r\n") + b"0\r\n\r\n")
        await w.drain()

    return b


@pytest.mark.parametrize(
    ("think_ms", "crlf", "from_callback"),
    [(0.0, False, True), (20.0, False, False), (0.0, True, True)],
)
def test_where_the_next_turn_leaves_from(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, think_ms: float, crlf: bool,
    from_callback: bool,
) -> None:  # fmt: skip
    """Without think time, a turn leaves from the read callback where the reply before it
    ended (no task is running there), its history exact, whatever the reply's line ends;
    with think time, from the session's task. Either way the records are whole."""
    from app.client import load_run

    path = conversations(tmp_path, [["a", "b", "c"], ["x", "y"]])
    seen: dict[str, bool] = {}
    send_turn = load_run.LoadRun.send_turn

    def spy(self: Any, rid: str, req: bytes, on_end: Any = None, lane: int = 0) -> Any:
        seen[rid] = asyncio.current_task() is None
        return send_turn(self, rid, req, on_end, lane)

    monkeypatch.setattr(load_run.LoadRun, "send_turn", spy)

    async def go() -> tuple[Any, Server]:
        async with Server(_crlf_replier() if crlf else replier()) as srv:
            res = await run_load(spec(srv.url, path, turn_delay_ms=think_ms), run_tag="t")
        return res, srv

    res, srv = run(go())
    assert seen == {
        "t-s0-t1": False,  # first turns leave from the task
        "t-s1-t1": False,
        "t-s0-t2": from_callback,
        "t-s0-t3": from_callback,
        "t-s1-t2": from_callback,
    }
    reqs = by_id(srv)
    assert reqs["t-s0-t3"].body["messages"] == [
        {"role": "user", "content": "a"},
        {"role": "assistant", "content": "t-s0-t1-0 t-s0-t1-1 t-s0-t1-2"},
        {"role": "user", "content": "b"},
        {"role": "assistant", "content": "t-s0-t2-0 t-s0-t2-1 t-s0-t2-2"},
        {"role": "user", "content": "c"},
    ]
    recs = sorted((r for r in res.records if not r.warmup), key=lambda r: (r.session, r.turn))
    assert [(r.session, r.turn) for r in recs] == [(0, 1), (0, 2), (0, 3), (1, 1), (1, 2)]
    assert all(r.status is RequestStatus.OK for r in recs), [(r.status, r.error) for r in recs]
    assert [r.output_tokens for r in recs] == [3] * 5
    assert [r.index for r in sorted(recs, key=lambda r: r.sent_ns or 0)] == list(range(5))
    assert res.max_in_flight <= 2
    for a, b in itertools.pairwise(recs):
        if a.session == b.session:  # never before the reply ended + think time
            assert a.end_ns is not None and b.sent_ns is not None
            assert b.sent_ns - a.end_ns >= think_ms * 1e6


def test_a_session_keeps_its_connection_from_turn_to_turn(tmp_path: Path) -> None:
    """The reply's connection goes back to the pool where the reply ended, so the next turn
    sent from there takes it again: one connection per session, reused from turn 2."""
    from app.targets.sim_config import SimConfig
    from app.targets.simulator import start_simulator_thread

    path = conversations(tmp_path, [["a", "b", "c"], ["x", "y", "z"], ["p", "q"]])
    sim = start_simulator_thread(SimConfig(ttft_ms=2, itl_ms=1, seed=3))
    try:
        res = run(run_load(spec(sim.base_url, path, num_prompts=3, model="sim"), run_tag="t"))
    finally:
        sim.stop()
    recs = [r for r in res.records if not r.warmup]
    assert len(recs) == 8 and all(r.status is RequestStatus.OK for r in recs)
    conns: dict[int | None, set[int | None]] = {}
    for r in recs:
        conns.setdefault(r.session, set()).add(r.conn_id)
        assert r.conn_reused is (r.turn != 1), (r.session, r.turn)
    assert len(conns) == 3 and all(len(c) == 1 for c in conns.values()), conns
