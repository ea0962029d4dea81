"""The Responses API and Anthropic Messages surfaces (issue 25 part 3): their bodies, their
headers (Anthropic's ``x-api-key`` and ``anthropic-version``), their events (output text,
reasoning, usage, errors) classified from hand-written streams, what does not apply refused
naming the field, an answer of another surface's shape failing naming both, and runs against
the simulator (CLI included) whose TTFT, TTFOT and ITL are checked against the simulator's
own view of each request."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from pydantic import ValidationError

from app.analysis.metrics import compute_metrics
from app.cli.main import main
from app.client.endpoints import endpoint_type
from app.client.runner import run_load
from app.client.spec import RunSpec
from app.domain import EventKind, RequestStatus, trace_from_records
from app.services.runs import open_database
from app.storage import repository as repo
from app.storage.db import session_scope
from app.targets.sim_config import SimConfig
from app.targets.simulator import start_simulator_thread
from tests.endpoint_support import body_of
from tests.test_cli import _count_runs
from tests.test_client import SSE_HEAD, Req, Server, Writer, chunk, run

SURFACES = ("responses", "anthropic-messages")


def spec(endpoint: str, **kw: Any) -> RunSpec:
    base: dict[str, Any] = {
        "base_url": "http://127.0.0.1:9",
        "model": "m",
        "endpoint": endpoint,
        "scrape_metrics": False,
        "request_timeout_s": 10.0,
    }
    return RunSpec(**(base | kw))


# ----------------------------------------------------------------------- the spec


@pytest.mark.parametrize(
    ("endpoint", "kw", "names"),
    [
        ("responses", {"endpoint_options": {"batch_size": 4}}, ("endpoint_options.batch_size",)),
        (
            "responses",
            {"endpoint_options": {"reasoning_effort": "huge"}},
            ("endpoint_options.reasoning_effort",),
        ),
        (
            "anthropic-messages",
            {"endpoint_options": {"rerank_api": "tei"}},
            ("endpoint_options.rerank_api", "'anthropic-messages'"),
        ),
        (
            "anthropic-messages",
            {"endpoint_options": {"thinking_budget": 100}},
            ("endpoint_options.thinking_budget",),
        ),
        (
            "anthropic-messages",
            {"endpoint_options": {"thinking_budget": 2048}, "output_len": 2048},
            ("endpoint_options.thinking_budget", "output_len 2,048"),
        ),
    ],
)
def test_what_does_not_apply_is_refused_naming_the_field(
    endpoint: str, kw: dict[str, Any], names: tuple[str, ...]
) -> None:
    with pytest.raises(ValidationError) as e:
        spec(endpoint, **kw)
    for name in names:
        assert name in str(e.value), name


def test_the_cli_refuses_another_surfaces_option_with_exit_2(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    db = f"sqlite:///{tmp_path / 'c.db'}"
    base = ["bench", "--base-url", "http://127.0.0.1:9", "--model", "m", "--database-url", db]
    assert main([*base, "--endpoint", "responses", "--batch-size", "4"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1
    assert err[0].endswith("--batch-size: an option of --endpoint embeddings, not of responses")
    assert main([*base, "--endpoint", "anthropic-messages", "--reasoning-effort", "low"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1
    assert err[0].endswith("--reasoning-effort: an option of --endpoint responses, not of "
                           "anthropic-messages")  # fmt: skip
    assert main([*base, "--endpoint", "responses", "--reasoning-effort", "huge"]) == 2
    assert "--reasoning-effort" in capsys.readouterr().err
    assert _count_runs(db) == 0


def test_the_spec_as_stored() -> None:
    s = spec("responses", endpoint_options={"reasoning_effort": "low"})
    assert s.stream is True and s.endpoint_options == {"reasoning_effort": "low"}
    a = spec("anthropic-messages", endpoint_options={"anthropic_version": "2023-06-01"})
    assert a.endpoint_options == {}  # less the defaults


# ----------------------------------------------------------------------- requests


def test_the_responses_bodies() -> None:
    assert body_of("responses") == (
        b'{"model":"m","input":"hello","max_output_tokens":5,"stream":true}'
    )
    msgs = [{"role": "system", "content": "be brief"}, {"role": "user", "content": "hi"}]
    body = json.loads(
        body_of(
            "responses", messages=msgs, prompt=None, stream=False, extra_body={"temperature": 0.5},
            options={"reasoning_effort": "low", "reasoning_summary": "auto"},
        )
    )  # fmt: skip
    assert body == {
        "model": "m",
        "input": msgs,  # a conversation: a message list
        "max_output_tokens": 5,
        "stream": False,
        "reasoning": {"effort": "low", "summary": "auto"},
        "temperature": 0.5,
    }  # no ignore_eos / min_tokens: the API has no such field


def test_the_anthropic_bodies() -> None:
    assert body_of("anthropic-messages") == (
        b'{"model":"m","messages":[{"role":"user","content":"hello"}],"max_tokens":5,"stream":true}'
    )
    msgs = [
        {"role": "system", "content": "be brief"},
        {"role": "user", "content": "hi"},
        {"role": "assistant", "content": "yes?"},
        {"role": "user", "content": "more"},
    ]
    body = json.loads(
        body_of("anthropic-messages", messages=msgs, prompt=None, output_len=2048,
                options={"thinking_budget": 1024})
    )  # fmt: skip
    assert (
        body
        == {
            "model": "m",
            "system": "be brief",  # out of the messages, as the API wants
            "messages": msgs[1:],
            "max_tokens": 2048,
            "stream": True,
            "thinking": {"type": "enabled", "budget_tokens": 1024},
        }
    )


def _events(*objs: dict[str, Any]) -> bytes:
    return b"".join(
        chunk(b"event: %s\ndata: %s\n\n" % (str(o["type"]).encode(), json.dumps(o).encode()))
        for o in objs
    )


ANTHROPIC_STREAM = (
    {"type": "message_start", "message": {"type": "message", "usage": {
        "input_tokens": 5, "cache_read_input_tokens": 2, "output_tokens": 1}}},
    {"type": "content_block_start", "index": 0, "content_block": {"type": "thinking"}},
    {"type": "content_block_delta", "index": 0,
     "delta": {"type": "thinking_delta", "thinking": "hmm"}},
    {"type": "content_block_delta", "index": 0,
     "delta": {"type": "signature_delta", "signature": "x"}},
    {"type": "content_block_stop", "index": 0},
    {"type": "content_block_delta", "index": 1, "delta": {"type": "text_delta", "text": "the"}},
    {"type": "ping"},
    {"type": "content_block_delta", "index": 2,
     "delta": {"type": "input_json_delta", "partial_json": "{\"a\": 1}"}},
    {"type": "message_delta", "delta": {"stop_reason": "end_turn"}, "usage": {"output_tokens": 9}},
    {"type": "message_stop"},
)  # fmt: skip


def streaming(events: tuple[dict[str, Any], ...]) -> Any:
    async def b(req: Req, w: Writer) -> None:
        w.write(SSE_HEAD + _events(*events) + b"0\r\n\r\n")
        await w.drain()

    return b


def test_anthropic_headers_events_and_usage() -> None:
    async def go() -> tuple[Any, Server]:
        async with Server(streaming(ANTHROPIC_STREAM)) as srv:
            s = spec("anthropic-messages", base_url=srv.url, num_prompts=2, api_key="sk-ant",
                     max_concurrency=1)  # fmt: skip
            return await run_load(s, run_tag="a"), srv

    res, srv = run(go())
    assert [r.path for r in srv.requests] == ["/v1/messages"] * 2
    for req in srv.requests:
        assert req.headers["x-api-key"] == "sk-ant"
        assert req.headers["anthropic-version"] == "2023-06-01"
        assert "authorization" not in req.headers  # the key goes once, as x-api-key
        assert req.body["max_tokens"] == 128  # the output length: required by the API
    for r in res.records:
        assert r.status is RequestStatus.OK, r.error
        kinds = [EventKind(k) for k in r.event_kind.tolist()]
        assert kinds == [
            EventKind.ROLE, EventKind.ROLE, EventKind.REASONING, EventKind.ROLE, EventKind.ROLE,
            EventKind.CONTENT, EventKind.ROLE, EventKind.TOOL_CALL, EventKind.USAGE, EventKind.ROLE,
        ]  # fmt: skip  # input_json_delta: a tool call's arguments (TTFTC)
        # the prompt: input_tokens + the cache's reads; the output: message_delta's
        assert (r.usage_prompt_tokens, r.input_tokens, r.cached_prompt_tokens) == (7, 7, 2)
        assert r.output_tokens == r.usage_completion_tokens == 9 and r.token_source == "usage"


def test_a_header_of_the_run_replaces_the_version() -> None:
    async def go() -> Server:
        async with Server(streaming(ANTHROPIC_STREAM)) as srv:
            s = spec("anthropic-messages", base_url=srv.url, num_prompts=1,
                     headers={"anthropic-version": "2099-01-01"})  # fmt: skip
            await run_load(s, run_tag="h")
            return srv

    (req,) = run(go()).requests
    assert req.headers["anthropic-version"] == "2099-01-01" and "x-api-key" not in req.headers


RESPONSES_STREAM = (
    {"type": "response.created", "response": {"object": "response", "status": "in_progress"}},
    {"type": "response.reasoning_summary_text.delta", "delta": "plan"},
    {"type": "response.reasoning_text.delta", "delta": "think"},
    {"type": "response.output_text.delta", "delta": "the"},
    {"type": "response.output_text.delta", "delta": ""},
    {"type": "response.output_text.delta", "delta": " end"},
    {"type": "response.completed", "response": {"usage": {
        "input_tokens": 4, "input_tokens_details": {"cached_tokens": 3}, "output_tokens": 6,
        "output_tokens_details": {"reasoning_tokens": 2}, "total_tokens": 10}}},
)  # fmt: skip


def test_responses_events_and_usage() -> None:
    async def go() -> Any:
        async with Server(streaming(RESPONSES_STREAM)) as srv:
            res = await run_load(spec("responses", base_url=srv.url, num_prompts=2), run_tag="r")
            assert {r.headers.get("authorization") for r in srv.requests} == {None}
            return res

    for r in run(go()).records:
        assert r.status is RequestStatus.OK, r.error
        kinds = [EventKind(k) for k in r.event_kind.tolist()]
        assert kinds == [
            EventKind.ROLE, EventKind.REASONING, EventKind.REASONING, EventKind.CONTENT,
            EventKind.ROLE, EventKind.CONTENT, EventKind.USAGE,
        ]  # fmt: skip
        assert (r.input_tokens, r.cached_prompt_tokens, r.output_tokens) == (4, 3, 6)


def test_a_responses_function_call_is_tool_call_output() -> None:
    """``response.function_call_arguments.delta`` is a tool call's arguments: output
    (TOOL_CALL, as chat's ``delta.tool_calls``), so the request has a TTFTC."""
    stream = (
        RESPONSES_STREAM[0],
        {"type": "response.function_call_arguments.delta", "delta": '{"city"'},
        {"type": "response.function_call_arguments.delta", "delta": ': "Oslo"}'},
        RESPONSES_STREAM[-1],
    )

    async def go() -> Any:
        async with Server(streaming(stream)) as srv:
            return await run_load(spec("responses", base_url=srv.url, num_prompts=1), run_tag="f")

    (r,) = run(go()).records
    assert r.status is RequestStatus.OK, r.error
    kinds = [EventKind(k) for k in r.event_kind.tolist()]
    assert kinds == [EventKind.ROLE, EventKind.TOOL_CALL, EventKind.TOOL_CALL, EventKind.USAGE]


@pytest.mark.parametrize(
    ("endpoint", "events", "error"),
    [
        (
            "responses",
            ({"type": "response.output_text.delta", "delta": "a"},
             {"type": "response.failed", "response": {"status": "failed", "error": {
                 "code": "server_error", "message": "boom"}}}),
            "server error in stream: boom (server_error)",
        ),
        (
            "responses",
            ({"type": "error", "code": "rate_limit", "message": "slow down"},),
            "server error in stream: slow down (rate_limit)",
        ),
        (
            "anthropic-messages",
            ({"type": "message_start", "message": {"usage": {"input_tokens": 1}}},
             {"type": "error", "error": {"type": "overloaded_error", "message": "Overloaded"}}),
            "server error in stream: Overloaded (overloaded_error)",
        ),
        (
            "responses",  # a chat server's stream
            ({"object": "chat.completion.chunk", "type": "x",
              "choices": [{"delta": {"content": "a"}}]},),
            "expected Responses API events (response.output_text.delta, ...), got a JSON object "
            "of 'object': 'chat.completion.chunk'",
        ),
        (
            "anthropic-messages",  # a Responses API server's stream
            RESPONSES_STREAM,
            "expected Anthropic Messages events (content_block_delta, ...), got a JSON object "
            "with 'type', 'response'",
        ),
        (
            "chat",  # an Anthropic server's stream
            ANTHROPIC_STREAM,
            "expected chat completion chunks (choices[].delta), got a JSON object with 'type', "
            "'message'",
        ),
    ],
)  # fmt: skip
def test_errors_and_another_surfaces_shape_fail_naming_them(
    endpoint: str, events: tuple[dict[str, Any], ...], error: str
) -> None:
    async def go() -> Any:
        async with Server(streaming(events)) as srv:
            return await run_load(spec(endpoint, base_url=srv.url, num_prompts=2), run_tag="e")

    res = run(go())
    assert [(r.status, r.error) for r in res.records] == [(RequestStatus.ERROR, error)] * 2


def test_whole_answers_are_classified() -> None:
    responses = endpoint_type("responses").classifier(endpoint_type("responses").options())
    whole = {
        "object": "response", "status": "incomplete",
        "output": [
            {"type": "reasoning", "content": [{"type": "reasoning_text", "text": "hm"}],
             "summary": [{"type": "summary_text", "text": "s"}]},
            {"type": "message", "content": [{"type": "output_text", "text": "the end"}]},
        ],
        "usage": {"input_tokens": 3, "output_tokens": 4},
    }  # fmt: skip
    c = responses(json.dumps(whole).encode())
    assert (c.kind, c.text, c.usage) == (
        EventKind.CONTENT, "hmsthe end", {"prompt_tokens": 3, "completion_tokens": 4}
    )  # fmt: skip
    failed = responses(json.dumps(whole | {"status": "failed"}).encode())
    assert failed.error == "server error in stream: response.failed"
    kind = endpoint_type("anthropic-messages")
    anthropic = kind.classifier(kind.options())
    msg = {
        "type": "message",
        "content": [{"type": "thinking", "thinking": "a"}, {"type": "text", "text": "b"}],
        "usage": {"input_tokens": 2, "output_tokens": 5},
    }
    c = anthropic(json.dumps(msg).encode())
    assert (c.kind, c.text, c.usage) == (
        EventKind.CONTENT, "ab", {"prompt_tokens": 2, "completion_tokens": 5}
    )  # fmt: skip


# ----------------------------------------------------------------------- the simulator


def _first(ev: dict[str, Any], kinds: tuple[str, ...]) -> int:
    return next(int(t) for t, k in zip(ev["t_ns"], ev["kind"], strict=True) if k in kinds)


@pytest.mark.parametrize("endpoint", SURFACES)
@pytest.mark.parametrize("stream", [True, False])
def test_against_the_simulator_its_own_view(endpoint: str, stream: bool) -> None:
    cfg = SimConfig(ttft_ms=4, itl_ms=2, seed=3, reasoning_tokens=3, prefix_cache_block=4)
    sim = start_simulator_thread(cfg)
    try:
        s = spec(
            endpoint, base_url=sim.base_url, model="sim", num_prompts=6, input_len=12,
            output_len=8, max_concurrency=2, stream=stream,
        )  # fmt: skip
        res = asyncio.run(run_load(s, run_tag="s"))
        truth = sim.ground_truth()["requests"]
    finally:
        sim.stop()
    assert [r.status for r in res.records] == [RequestStatus.OK] * 6, res.records[0].error
    ttft, ttfot = [], []
    for r in res.records:
        g = truth[f"s-{r.index}"]
        assert g["endpoint"] == endpoint
        assert r.input_tokens == g["input_tokens"] and r.output_tokens == g["output_tokens"] == 8
        assert r.token_source == "usage" and r.cached_prompt_tokens is not None
        ev = g["events"]
        assert r.sent_ns is not None
        kinds = r.event_kind
        tok = (kinds == EventKind.CONTENT) | (kinds == EventKind.REASONING)
        t = r.event_t_ns[tok]
        ttft.append(int(t[0]) - r.sent_ns)
        ttfot.append(int(r.event_t_ns[kinds == EventKind.CONTENT][0]) - r.sent_ns)
        if not stream:
            assert ev["kind"] == ["response"] and int(np.sum(tok)) == 1
            continue
        # one token event a token, in the server's order: 3 reasoning, then 5 content
        server = [k for k in ev["kind"] if k in ("reasoning", "content")]
        client = ["reasoning" if k == EventKind.REASONING else "content" for k in kinds[tok]]
        assert client == server == ["reasoning"] * 3 + ["content"] * 5
        # the client's view of each gap against the server's writes: generous bounds (CI)
        srv_first = _first(ev, ("reasoning",))
        srv_out = _first(ev, ("content",))
        srv_t = np.asarray(
            [x for x, k in zip(ev["t_ns"], ev["kind"], strict=True) if k in server], np.int64
        )
        assert abs((ttfot[-1] - ttft[-1]) - (srv_out - srv_first)) < 50e6
        assert np.all(np.abs(np.diff(t) - np.diff(srv_t)) < 50e6)
        assert ttft[-1] >= 4e6  # never before the server's latency
    m = compute_metrics(trace_from_records(res.records)).to_dict()
    assert m["ttft_ms"]["p50"] == pytest.approx(float(np.percentile(ttft, 50)) / 1e6, rel=1e-9)
    assert m["ttfot_ms"]["p50"] == pytest.approx(float(np.percentile(ttfot, 50)) / 1e6, rel=1e-9)


def test_cli_bench_against_the_simulator(tmp_path: Path) -> None:
    """``tokentrace bench --endpoint responses|anthropic-messages``: each stored request's
    tokens are the server's, its TTFT the client's first token event, within a generous
    bound of the simulator's own TTFT (its first token write after the request arrived)."""
    db = f"sqlite:///{tmp_path / 'cli.db'}"
    sim = start_simulator_thread(SimConfig(ttft_ms=3, itl_ms=0.2, seed=5, reasoning_tokens=2))
    try:
        for endpoint, extra in (
            ("responses", ["--reasoning-effort", "low", "--output-len", "6"]),
            ("anthropic-messages", ["--thinking-budget", "1024", "--output-len", "1030"]),
        ):
            argv = [
                "bench", "--base-url", sim.base_url, "--model", "sim", "--endpoint", endpoint,
                *extra, "--num-prompts", "4", "--input-len", "8", "--max-concurrency", "2",
                "--database-url", db, "--no-scrape-metrics",
            ]  # fmt: skip
            assert main(argv) == 0, endpoint
        truth = sim.ground_truth()["requests"]
    finally:
        sim.stop()
    sessions = open_database(db)
    with session_scope(sessions) as s:
        runs = {r.spec["endpoint"]: r.id for r in repo.list_runs(s, limit=10)}
        assert set(runs) == set(SURFACES)
        for endpoint, run_id in runs.items():
            run_ = repo.get_run(s, run_id)
            want = {"reasoning_effort": "low"} if endpoint == "responses" else {
                "thinking_budget": 1024}  # fmt: skip
            assert run_.spec["endpoint_options"] == want
            records = repo.load_records(s, run_id)
            assert len(records) == 4
            for r in records:
                g = truth[f"{run_id}-{r.index}"]
                assert r.status is RequestStatus.OK, r.error
                assert (r.input_tokens, r.output_tokens) == (g["input_tokens"], g["output_tokens"])
                ev = g["events"]
                server_ttft = _first(ev, ("reasoning", "content")) - int(g["received_ns"])
                tok = r.event_tokens > 0
                assert r.sent_ns is not None
                client_ttft = int(r.event_t_ns[tok][0]) - r.sent_ns
                assert client_ttft >= server_ttft - 5e6  # the request's send is before
                assert abs(client_ttft - server_ttft) < 100e6  # generous: a shared CI machine


def test_multi_turn_sessions_send_the_history_as_input() -> None:
    sim = start_simulator_thread(SimConfig(ttft_ms=1, itl_ms=0.2, seed=8))
    try:
        s = spec(
            "responses", base_url=sim.base_url, model="sim", multi_turn=True,
            dataset="sharegpt", num_prompts=2, max_turns=3, output_len=4, max_concurrency=2,
        )  # fmt: skip
        res = asyncio.run(run_load(s, run_tag="mt"))
        truth = sim.ground_truth()["requests"]
    finally:
        sim.stop()
    ok = [r for r in res.records if r.status is RequestStatus.OK]
    assert len(ok) == len(res.records) >= 3, [r.error for r in res.records]
    by_session: dict[int, list[int]] = {}
    for r in res.records:
        g = truth[f"mt-s{r.session}-t{r.turn}"]
        assert g["endpoint"] == "responses" and r.input_tokens == g["input_tokens"]
        by_session.setdefault(int(r.session or 0), []).append(g["input_tokens"])
    # each turn's input holds the turns before it: it only grows
    assert all(t == sorted(t) and len(set(t)) == len(t) for t in by_session.values())
    assert max(len(t) for t in by_session.values()) >= 2


def test_anthropic_multi_turn_sends_the_system_prompt_apart(tmp_path: Path) -> None:
    path = tmp_path / "conv.jsonl"
    conv = {"messages": [
        {"role": "system", "content": "be brief"},
        {"role": "user", "content": "one"},
        {"role": "user", "content": "two"},
        {"role": "user", "content": "three"},
    ], "output_len": 3}  # fmt: skip
    path.write_text(json.dumps(conv) + "\n")

    async def go() -> tuple[Any, Server]:
        async with Server(streaming(ANTHROPIC_STREAM)) as srv:
            s = spec(
                "anthropic-messages", base_url=srv.url, multi_turn=True, dataset="jsonl",
                dataset_path=str(path), num_prompts=1, max_concurrency=1,
            )  # fmt: skip
            return await run_load(s, run_tag="amt"), srv

    res, srv = run(go())
    assert [r.status for r in res.records] == [RequestStatus.OK] * 3, res.records[0].error
    bodies = [r.body for r in srv.requests]
    assert [b["system"] for b in bodies] == ["be brief"] * 3
    # the history: each user turn, then the reply before it as the assistant's message
    assert [[m["role"] for m in b["messages"]] for b in bodies] == [
        ["user"], ["user", "assistant", "user"], ["user", "assistant", "user", "assistant", "user"]
    ]  # fmt: skip
    assert [m["content"] for m in bodies[2]["messages"] if m["role"] == "user"] == [
        "one", "two", "three"
    ]  # fmt: skip
    assert all(b["max_tokens"] == 3 for b in bodies)
