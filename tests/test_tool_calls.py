"""Tool calls on the chat surface (issue 25 part 4): a stream's ``delta.tool_calls[]`` deltas
(the function's name, its argument text) are output, token-bearing (``EventKind.TOOL_CALL``);
the time to the first one is the per-request metric ``ttftc_ms`` (stored in
``requests.metric_values``); a JSONL line's ``tools`` and ``tool_choice`` go into the body
and count in the prompt; an answer that is a tool call alone succeeds. Every figure is
checked against the simulator's own view (its ground truth, its usage) or recomputed here
from the raw records."""

from __future__ import annotations

import csv
import io
import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from fastapi.testclient import TestClient
from rich.console import Console
from sqlalchemy import select

from app.analysis.metrics import compute_metrics
from app.cli.main import main
from app.cli.render import render_report
from app.client.datasets.base import DatasetError
from app.client.endpoints import CHAT
from app.client.events import Classifier, classify
from app.client.runner import run_load
from app.client.spec import RunSpec
from app.client.tokenizer import BuiltinTokenizer
from app.client.workload import build_workload
from app.domain import EventKind, RequestStatus, trace_from_records
from app.services import exports
from app.storage.db import make_engine, session_factory, session_scope
from app.storage.models import Request
from app.targets.sim_config import SimConfig
from app.targets.simulator import start_simulator_thread
from tests.test_client import run
from tests.web_support import web_app

WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "the weather in a city",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}}},
    },
}
FLIGHTS = {"type": "function", "function": {"name": "find_flights", "parameters": {}}}
LINES: list[dict[str, Any]] = [
    {"prompt": "what is the weather in Paris today", "tools": [WEATHER], "tool_choice": "auto"},
    {"messages": [{"role": "user", "content": "find me a flight to Oslo"}],
     "tools": [WEATHER, FLIGHTS], "tool_choice": {"type": "function",
                                                  "function": {"name": "find_flights"}}},
]  # fmt: skip


def jsonl(tmp_path: Path, lines: list[dict[str, Any]], name: str = "tools.jsonl") -> str:
    path = tmp_path / name
    path.write_text("".join(json.dumps(x) + "\n" for x in lines))
    return str(path)


def spec(path: str, **kw: Any) -> RunSpec:
    base: dict[str, Any] = {
        "base_url": "http://127.0.0.1:9",
        "model": "sim",
        "dataset": "jsonl",
        "dataset_path": path,
        "num_prompts": 6,
        "output_len": 5,
        "scrape_metrics": False,
    }
    return RunSpec(**(base | kw))


def _chunk(delta: dict[str, Any], **extra: Any) -> bytes:
    return json.dumps({"choices": [{"index": 0, "delta": delta}], **extra}).encode()


# ----------------------------------------------------------------------- the classifier


def test_tool_call_deltas_are_token_bearing_output() -> None:
    call = {"index": 0, "id": "call_1", "type": "function",
            "function": {"name": "get_weather", "arguments": ""}}  # fmt: skip
    first = _chunk({"tool_calls": [call]})
    args = _chunk({"tool_calls": [{"index": 0, "function": {"arguments": '{"city": '}}]})
    id_only = _chunk({"tool_calls": [{"index": 0, "id": "call_2"}]})
    both = _chunk({"content": "Sure.", "tool_calls": [{"function": {"arguments": "{}"}}]})
    assert classify(first)[:2] == (EventKind.TOOL_CALL, "get_weather")
    assert classify(args)[:2] == (EventKind.TOOL_CALL, '{"city": ')
    assert classify(id_only)[:2] == (EventKind.ROLE, "")  # no generated text
    assert classify(both)[:2] == (EventKind.CONTENT, "Sure.{}")
    whole = json.dumps({"choices": [{"index": 0, "finish_reason": "tool_calls", "message": {
        "role": "assistant", "content": None, "tool_calls": [
            {"id": "c", "type": "function",
             "function": {"name": "f", "arguments": '{"a": 1}'}}]}}]}).encode()  # fmt: skip
    assert classify(whole)[:2] == (EventKind.TOOL_CALL, 'f{"a": 1}')
    # the fast path learns an argument delta's layout and reads the same
    c = Classifier()
    for text in ("one", "two", 'three"q'):
        data = _chunk({"tool_calls": [{"index": 0, "function": {"arguments": text}}]})
        assert c.classify(data) == classify(data) == (EventKind.TOOL_CALL, text, None, None, 0)


# ----------------------------------------------------------------------- the body


def test_tools_go_into_the_body_and_count_in_the_prompt(tmp_path: Path) -> None:
    s = spec(jsonl(tmp_path, LINES), num_prompts=2)
    tok = BuiltinTokenizer()
    w = build_workload(s, tok)
    bodies = [json.loads(CHAT.body(p, s.body_params(), CHAT.options())) for p in w.measured]
    assert list(bodies[0])[:4] == ["model", "messages", "tools", "tool_choice"]
    assert bodies[0]["messages"] == [{"role": "user", "content": LINES[0]["prompt"]}]
    assert bodies[0]["tools"] == [WEATHER] and bodies[0]["tool_choice"] == "auto"
    assert bodies[1]["tools"] == [WEATHER, FLIGHTS]
    assert bodies[1]["tool_choice"] == LINES[1]["tool_choice"]
    # the prompt: its text, plus the tools' JSON (one word or punctuation mark, one token)
    words = 7  # "what is the weather in Paris today"
    assert w.measured[0].input_tokens == words + tok.count(json.dumps([WEATHER]))
    plain = build_workload(spec(jsonl(tmp_path, [{"prompt": "a b"}], "p.jsonl")), tok)
    assert plain.measured[0].body_fields is None  # a line without tools: the body as before
    assert "tools" not in json.loads(CHAT.body(plain.measured[0], s.body_params(), CHAT.options()))


@pytest.mark.parametrize(
    ("line", "says"),
    [
        ({"prompt": "x", "tool_choice": "auto"}, "'tool_choice' needs 'tools'"),
        ({"prompt": "x", "tools": []}, "'tools' must be a list of 1 to"),
        ({"prompt": "x", "tools": [{"type": "function"}]}, "each of 'tools'"),
        ({"prompt": "x", "tools": [WEATHER], "tool_choice": "sometimes"}, "'tool_choice' must"),
    ],
)
def test_a_bad_tools_line_is_refused_naming_it(
    tmp_path: Path, line: dict[str, Any], says: str
) -> None:
    path = jsonl(tmp_path, [{"prompt": "fine"}, line])
    with pytest.raises(DatasetError) as e:
        build_workload(spec(path), BuiltinTokenizer())
    assert str(e.value).startswith("dataset_path line 2: ") and says in str(e.value)


@pytest.mark.parametrize(
    "endpoint", ["completions", "embeddings", "responses", "anthropic-messages"]
)
def test_tools_on_a_surface_without_messages_are_refused(tmp_path: Path, endpoint: str) -> None:
    s = spec(jsonl(tmp_path, [LINES[0]]), endpoint=endpoint)
    with pytest.raises(DatasetError) as e:
        build_workload(s, BuiltinTokenizer())
    text = str(e.value)
    assert text.startswith("dataset_path: a line has 'tools'") and repr(endpoint) in text
    # the surfaces that take a conversation but build their own bodies refuse the line
    # rather than send the request without its tools
    assert "endpoint must be 'chat'" in text


# ----------------------------------------------------------------------- measured


def test_a_run_against_the_simulator(tmp_path: Path) -> None:
    """Every request is answered by a tool call alone (the simulator's stop at eos_len: its
    finish_reason is tool_calls, no content): each succeeds; its tool-call events are the
    simulator's content events, its output and prompt tokens the simulator's; TTFTC = TTFT
    (its first token is the call) and the report's figures are recomputed from the records."""
    sim = start_simulator_thread(SimConfig(ttft_ms=4, itl_ms=0.5, eos_len=3, seed=2))
    try:
        s = spec(jsonl(tmp_path, LINES), base_url=sim.base_url, max_concurrency=2,
                 ignore_eos=False, warmup_requests=1)  # fmt: skip
        res = run(run_load(s, run_tag="sim"))
        truth = sim.ground_truth()["requests"]
    finally:
        sim.stop()
    measured = [r for r in res.records if not r.warmup]
    assert len(measured) == 6 and all(r.status is RequestStatus.OK for r in measured)
    ttftc = []
    for r in measured:
        g = truth[f"sim-{r.index}"]
        kinds = [EventKind(k) for k in r.event_kind]
        calls = [i for i, k in enumerate(kinds) if k is EventKind.TOOL_CALL]
        assert EventKind.CONTENT not in kinds
        assert len(calls) == g["events"]["kind"].count("content") == 3
        assert r.output_tokens == g["output_tokens"] == 3 and r.token_source == "usage"
        assert r.input_tokens == g["input_tokens"] == r.tokenizer_input_tokens
        assert r.sent_ns is not None
        ttftc.append((int(r.event_t_ns[calls[0]]) - r.sent_ns) / 1e6)
        assert ttftc[-1] >= 4.0  # never before the server's own TTFT
    m = compute_metrics(trace_from_records(res.records)).to_dict()
    assert m["ttftc_ms"]["count"] == 6
    for p in (50, 99):
        want = float(np.percentile(ttftc, p))
        assert m["ttftc_ms"][f"p{p}"] == pytest.approx(want, rel=1e-9)
        assert m["ttft_ms"][f"p{p}"] == pytest.approx(want, rel=1e-9)
    assert m["output_tokens_total"] == 18


def test_a_share_of_answers_call_a_tool(tmp_path: Path) -> None:
    """``tool_call_rate`` 0.5: the simulator answers some lines with text, the rest with a
    call (seeded per line: the same line, the same answer); TTFTC has one sample per request
    that called a tool."""
    lines = [{"prompt": f"question number {i}", "tools": [WEATHER]} for i in range(8)]
    sim = start_simulator_thread(SimConfig(ttft_ms=2, itl_ms=0.2, tool_call_rate=0.5, seed=5))
    try:
        s = spec(jsonl(tmp_path, lines), base_url=sim.base_url, num_prompts=16)
        res = run(run_load(s, run_tag="sim"))
    finally:
        sim.stop()
    called = {}
    for r in res.records:
        assert r.status is RequestStatus.OK
        kinds = {EventKind(k) for k in r.event_kind}
        is_call = EventKind.TOOL_CALL in kinds
        assert is_call != (EventKind.CONTENT in kinds)
        assert called.setdefault(r.index % 8, is_call) == is_call
    n_calls = sum(called.values()) * 2
    assert 0 < n_calls < 16
    m = compute_metrics(trace_from_records(res.records)).to_dict()
    assert m["ttftc_ms"]["count"] == n_calls and m["ttft_ms"]["count"] == 16


def test_the_cli_stores_and_shows_it(tmp_path: Path) -> None:
    db = f"sqlite:///{tmp_path / 't.db'}"
    sim = start_simulator_thread(SimConfig(ttft_ms=3, itl_ms=0.2, seed=1))
    try:
        argv = ["bench", "--base-url", sim.base_url, "--model", "sim", "--dataset-name", "jsonl",
                "--dataset-path", jsonl(tmp_path, LINES), "--num-prompts", "4",
                "--output-len", "4", "--database-url", db, "--no-scrape-metrics"]  # fmt: skip
        assert main(argv) == 0
    finally:
        sim.stop()
    sessions = session_factory(make_engine(db))
    with session_scope(sessions) as s:
        rows = s.execute(select(Request.ttft_ns, Request.metric_values)).all()
    assert len(rows) == 4
    for ttft_ns, values in rows:
        assert values is not None and values["ttftc_ms"] == ttft_ns  # the call came first
    from app.services.runs import execute_bench, open_database

    url = f"sqlite:///{tmp_path / 'r.db'}"
    sim = start_simulator_thread(SimConfig(ttft_ms=3, itl_ms=0.2, seed=1))
    try:
        out = execute_bench(
            spec(jsonl(tmp_path, LINES), base_url=sim.base_url, num_prompts=4),
            sessions=open_database(url),
            name="tools",
        )
    finally:
        sim.stop()
    buf = io.StringIO()
    render_report(out.report, Console(file=buf, width=200))
    p50 = out.report["metrics"]["ttftc_ms"]["p50"]
    assert "TTFTC" in buf.getvalue() and f"{p50:,.2f}" in buf.getvalue()
    with TestClient(web_app(url)) as c:  # the run page's latency table
        page = c.get(f"/runs/{out.run_id}").text
    assert "Time to first tool call" in page and f"{p50:,.2f}" in page
    # the export's column, per request: the same value as TTFT (the call came first)
    assert out.run_id is not None
    rows = list(csv.DictReader(io.StringIO(
        exports.export(open_database(url), out.run_id, "requests.csv").decode())))  # fmt: skip
    assert len(rows) == 4
    for row in rows:
        assert row["ttftc_ms"] != "" and float(row["ttftc_ms"]) == float(row["ttft_ms"])
    assert float(np.percentile([float(r["ttftc_ms"]) for r in rows], 50)) == pytest.approx(
        p50, rel=1e-9
    )


def test_a_whole_answer_that_is_a_tool_call_succeeds(tmp_path: Path) -> None:
    """Not streamed: the one event is the message's tool call (its name and arguments)."""
    sim = start_simulator_thread(SimConfig(ttft_ms=2, eos_len=4, seed=3))
    try:
        s = spec(jsonl(tmp_path, [LINES[1]]), base_url=sim.base_url, num_prompts=2,
                 stream=False, ignore_eos=False)  # fmt: skip
        res = run(run_load(s, run_tag="w"))
        truth = sim.ground_truth()["requests"]
    finally:
        sim.stop()
    for r in res.records:
        assert r.status is RequestStatus.OK, r.error
        assert [EventKind(k) for k in r.event_kind] == [EventKind.TOOL_CALL]
        assert r.output_tokens == truth[f"w-{r.index}"]["output_tokens"] == 4
    m = compute_metrics(trace_from_records(res.records)).to_dict()
    assert m["ttftc_ms"]["count"] == 2


def test_the_simulator_refuses_what_it_cannot_answer() -> None:
    """A tool without a name, a ``tool_choice`` naming no tool, an image part without a URL:
    400 naming what is wrong; ``tool_call_rate`` and ``image_tokens`` are bounded."""
    import httpx

    sim = start_simulator_thread(SimConfig(ttft_ms=1, seed=1))
    try:
        url = sim.base_url + "/v1/chat/completions"
        msgs = [{"role": "user", "content": "hi"}]
        for body, says in (
            ({"tools": [{"type": "function"}]}, "function.name"),
            ({"tools": [WEATHER], "tool_choice": {"function": {"name": "nope"}}}, "tool_choice"),
            ({"tools": "all"}, "'tools' must be a list"),
            ({"messages": [{"role": "user", "content": [{"type": "image_url"}]}]}, "image_url"),
        ):
            r = httpx.post(url, json={"model": "m", "messages": msgs, "max_tokens": 2} | body)
            assert r.status_code == 400 and says in r.text, (body, r.text)
        none = {"model": "m", "messages": msgs, "max_tokens": 2, "tools": [WEATHER],
                "tool_choice": "none"}  # fmt: skip
        answer = httpx.post(url, json=none).json()
        assert answer["choices"][0]["message"]["content"]  # text, no call
    finally:
        sim.stop()
    for bad in ({"tool_call_rate": 1.5}, {"tool_call_rate": float("nan")}, {"image_tokens": -1}):
        with pytest.raises(ValueError):
            SimConfig(**bad)


def test_the_simulator_flags() -> None:
    from app.targets.simulator.cli import build_arg_parser, config_from_args

    ns = build_arg_parser().parse_args(["--tool-call-rate", "0.25", "--image-tokens", "64"])
    cfg = config_from_args(ns)
    assert (cfg.tool_call_rate, cfg.image_tokens) == (0.25, 64)
    assert (SimConfig().tool_call_rate, SimConfig().image_tokens) == (1.0, 256)
