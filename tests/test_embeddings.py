"""The embeddings surface (issue 25 part 3): ``/v1/embeddings``, ``batch_size`` inputs a
request, one JSON answer. What does not apply to it is refused before anything is sent,
naming the fields; its requests carry the dataset's texts in order; a run against the
simulator measures each request's E2E latency (its answer's arrival), inputs/s and input
tokens/s, every figure recomputed here from the raw records; TTFT/ITL/TPOT say "not
applicable", never 0; an answer of another surface's shape fails its request naming what
was expected and what came."""

from __future__ import annotations

import asyncio
import io
import json
import re
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from fastapi.testclient import TestClient
from pydantic import ValidationError
from rich.console import Console

from app.analysis.metrics import compute_metrics
from app.cli.main import main
from app.cli.render import render_report
from app.client.runner import run_load
from app.client.spec import RunSpec
from app.domain import EventKind, RequestStatus, trace_from_records
from app.services.runs import execute_bench, open_database
from app.targets.sim_config import SimConfig
from app.targets.simulator import start_simulator_thread
from tests.api_support import api_client
from tests.endpoint_support import body_of
from tests.test_cli import _count_runs
from tests.test_client import Req, Server, Writer, run
from tests.web_support import web_app


def spec(**kw: Any) -> RunSpec:
    base: dict[str, Any] = {
        "base_url": "http://127.0.0.1:9",
        "model": "m",
        "endpoint": "embeddings",
        "scrape_metrics": False,
    }
    return RunSpec(**(base | kw))


def jsonl(tmp_path: Path, lines: list[dict[str, Any]]) -> str:
    path = tmp_path / "d.jsonl"
    path.write_text("".join(json.dumps(x) + "\n" for x in lines))
    return str(path)


# ----------------------------------------------------------------------- the spec


@pytest.mark.parametrize(
    ("kw", "names"),
    [
        ({"multi_turn": True, "dataset": "sharegpt"}, ("endpoint", "multi_turn", "'embeddings'")),
        ({"temperature": 0.5}, ("temperature", "'embeddings'")),
        ({"goodput": {"ttft": 100.0}}, ("goodput", "'embeddings'", "ttft")),
        ({"endpoint_options": {"batch_size": 0}}, ("endpoint_options.batch_size",)),
        ({"endpoint_options": {"batch_size": 5000}}, ("endpoint_options.batch_size",)),
        ({"endpoint_options": {"topn": 1}}, ("endpoint_options.topn", "'embeddings'")),
        (
            {"dataset": "mooncake", "dataset_path": "/x", "endpoint_options": {"batch_size": 2}},
            ("endpoint_options.batch_size", "'mooncake'"),
        ),
    ],
)
def test_what_does_not_apply_is_refused_naming_the_fields(
    kw: dict[str, Any], names: tuple[str, ...]
) -> None:
    with pytest.raises(ValidationError) as e:
        spec(**kw)
    text = str(e.value)
    for name in names:
        assert name in text, (name, text)


def test_the_spec_as_stored() -> None:
    s = spec(endpoint_options={"batch_size": 16, "encoding_format": "float"}, goodput={"e2el": 5})
    assert s.stream is False  # one answer: stored as what was asked
    assert s.endpoint_options == {"batch_size": 16}  # less the defaults
    assert s.workload_params().num_prompts == 100 * 16  # dataset prompts: 16 a request
    with pytest.raises(ValidationError, match=r"endpoint_options\.batch_size.*'chat'"):
        RunSpec(base_url="http://h:1", model="m", endpoint_options={"batch_size": 2})


def test_the_api_refuses_with_422_and_queues_nothing(db_url: str) -> None:
    with api_client(db_url) as api:
        body = {"base_url": "http://127.0.0.1:9", "model": "m", "endpoint": "embeddings"}
        r = api.client.post(
            "/api/v1/runs",
            json=body | {"multi_turn": True, "dataset": "sharegpt"},
            headers=api.h(api.run),
        )
        assert r.status_code == 422
        assert "multi_turn" in r.text and "embeddings" in r.text
        listed = api.client.get("/api/v1/jobs", headers=api.h(api.admin))
        assert listed.status_code == 200 and listed.json()["items"] == []


def test_the_cli_refuses_with_exit_2(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    db = f"sqlite:///{tmp_path / 'c.db'}"
    base = ["bench", "--base-url", "http://127.0.0.1:9", "--model", "m", "--database-url", db]
    argv = [*base, "--endpoint", "embeddings", "--multi-turn", "--dataset-name", "sharegpt"]
    assert main(argv) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "--endpoint" in err[0] and "multi_turn" in err[0]
    assert main([*base, "--batch-size", "4"]) == 2  # an option of embeddings, not of chat
    err = capsys.readouterr().err.strip().splitlines()
    assert err[0].endswith("--batch-size: an option of --endpoint embeddings, not of chat")
    assert main([*base, "--endpoint", "embeddings", "--batch-size", "0"]) == 2
    assert "--batch-size" in capsys.readouterr().err
    assert _count_runs(db) == 0


# ----------------------------------------------------------------------- requests


def test_the_body() -> None:
    opts = {"batch_size": 2, "dimensions": 64}
    body = body_of("embeddings", prompt=None, inputs=("a", "b"), options=opts)
    assert body == b'{"model":"m","input":["a","b"],"encoding_format":"float","dimensions":64}'
    plain = body_of("embeddings", prompt=None, inputs=("a",), extra_body={"user": "u"})
    assert json.loads(plain) == {
        "model": "m",
        "input": ["a"],
        "encoding_format": "float",
        "user": "u",
    }


def answering(answer: Any) -> Any:
    """A server answering every request with ``answer(request)`` as one JSON body."""

    async def b(req: Req, w: Writer) -> None:
        data = json.dumps(answer(req)).encode()
        w.write(
            b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n%s"
            % (len(data), data)
        )
        await w.drain()

    return b


def embeddings_answer(req: Req) -> dict[str, Any]:
    n = len(req.body.get("input") or [1])
    data = [{"object": "embedding", "index": i, "embedding": [0.5, -0.5]} for i in range(n)]
    return {"object": "list", "data": data, "usage": {"prompt_tokens": 7 * len(data)}}


def test_each_request_carries_batch_size_texts_in_order(tmp_path: Path) -> None:
    path = jsonl(tmp_path, [{"prompt": f"p{i}"} for i in range(6)])

    async def go() -> tuple[Any, Server]:
        async with Server(answering(embeddings_answer)) as srv:
            s = spec(
                base_url=srv.url, dataset="jsonl", dataset_path=path, num_prompts=2,
                endpoint_options={"batch_size": 3}, max_concurrency=1,
            )  # fmt: skip
            return await run_load(s, run_tag="e"), srv

    res, srv = run(go())
    assert [r.path for r in srv.requests] == ["/v1/embeddings"] * 2
    assert [r.body["input"] for r in srv.requests] == [["p0", "p1", "p2"], ["p3", "p4", "p5"]]
    assert all(r.headers["accept"] == "application/json" for r in srv.requests)
    for rec in res.records:
        assert rec.status is RequestStatus.OK, rec.error
        assert rec.event_kind.tolist() == [EventKind.ANSWER] and rec.event_tokens.tolist() == [3]
        assert rec.input_tokens == 21 and rec.output_tokens is None  # usage: 7 an input


def test_a_dataset_of_messages_is_refused_before_anything_is_sent(tmp_path: Path) -> None:
    from app.client.datasets.base import DatasetError

    path = jsonl(tmp_path, [{"messages": [{"role": "user", "content": "hi"}]}])

    async def go() -> Server:
        async with Server(answering(embeddings_answer)) as srv:
            with pytest.raises(DatasetError, match="dataset: endpoint 'embeddings' embeds text"):
                s = spec(base_url=srv.url, dataset="jsonl", dataset_path=path)
                await run_load(s, run_tag="e")
            return srv

    assert run(go()).requests == []


@pytest.mark.parametrize(
    ("endpoint", "answer", "error"),
    [
        (
            "embeddings",
            lambda req: {"object": "chat.completion", "choices": [{"message": {"content": "x"}}]},
            "expected an embeddings answer (data[].embedding), got a JSON object of 'object': "
            "'chat.completion'",
        ),
        (
            "chat",
            embeddings_answer,
            "expected chat completion chunks (choices[].delta), got a JSON object of 'object': "
            "'list'",
        ),
        (
            "embeddings",
            lambda req: {"data": [{"embedding": [1.0]}]},
            "the answer carries 1 results; 2 were asked for",
        ),
        (
            "embeddings",
            lambda req: {"data": [{"embedding": [1.0]}, {"embedding": [1.0, 2.0]}]},
            "the embeddings answer holds embeddings of different lengths",
        ),
    ],
)
def test_an_answer_of_another_shape_fails_naming_both(
    endpoint: str, answer: Any, error: str
) -> None:
    async def go() -> Any:
        async with Server(answering(answer)) as srv:
            s = (
                spec(base_url=srv.url, num_prompts=2, endpoint_options={"batch_size": 2})
                if endpoint == "embeddings"
                else RunSpec(base_url=srv.url, model="m", num_prompts=2, scrape_metrics=False)
            )
            return await run_load(s, run_tag="w")

    res = run(go())
    assert [(r.status, r.error) for r in res.records] == [(RequestStatus.ERROR, error)] * 2


# ----------------------------------------------------------------------- measured


def test_a_run_against_the_simulator_measures_what_applies() -> None:
    sim = start_simulator_thread(SimConfig(ttft_ms=3, per_input_token_ms=0.01, seed=4))
    try:
        s = spec(
            base_url=sim.base_url, model="sim", num_prompts=12, input_len=9, max_concurrency=3,
            endpoint_options={"batch_size": 4, "encoding_format": "base64"}, warmup_requests=1,
        )  # fmt: skip
        res = run(run_load(s, run_tag="sim"))
        truth = sim.ground_truth()["requests"]
    finally:
        sim.stop()
    measured = [r for r in res.records if not r.warmup]
    assert len(measured) == 12 and all(r.status is RequestStatus.OK for r in measured)
    e2e, items, tokens = [], 0, 0
    for r in measured:
        g = truth[f"sim-{r.index}"]
        assert g["events"]["kind"] == ["response"] and g["events"]["tokens"] == [4]
        assert r.input_tokens == g["input_tokens"] == 36  # usage: the server's own count
        assert r.sent_ns is not None
        e2e.append((int(r.event_t_ns[0]) - r.sent_ns) / 1e6)
        items += int(r.event_tokens[0])
        tokens += r.input_tokens
        assert e2e[-1] >= 3.0 + 0.01 * 36  # never before the server's latency
    m = compute_metrics(trace_from_records(res.records)).to_dict()
    sent = [r.sent_ns for r in measured if r.sent_ns is not None]
    ends = [int(r.event_t_ns[-1]) for r in measured] + [r.end_ns or 0 for r in measured]
    window_s = (max(ends) - min(sent)) / 1e9
    assert m["e2el_ms"]["p50"] == pytest.approx(float(np.percentile(e2e, 50)), rel=1e-9)
    assert m["e2el_ms"]["count"] == 12
    assert m["items_total"] == items == 48
    assert m["items_per_s"] == pytest.approx(48 / window_s, rel=1e-9)
    assert m["input_throughput_tok_s"] == pytest.approx(tokens / window_s, rel=1e-9)
    assert m["output_throughput_tok_s"] is None and m["e2e_end"] == "answer"
    for key in ("ttft_ms", "tpot_ms", "itl_ms", "ttfot_ms"):
        assert m[key]["count"] == 0 and m[key]["reason"].startswith("not applicable"), key


def test_the_report_cli_and_run_page_show_it(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'e.db'}"
    sessions = open_database(url)
    sim = start_simulator_thread(SimConfig(ttft_ms=2, seed=1))
    try:
        s = spec(
            base_url=sim.base_url, model="sim", num_prompts=8, endpoint_options={"batch_size": 2}
        )
        out = execute_bench(s, sessions=sessions, name="emb")
    finally:
        sim.stop()
    assert out.run_id is not None and not out.failed
    m = out.report["metrics"]
    assert m["items_total"] == 16
    buf = io.StringIO()
    render_report(out.report, Console(file=buf, width=200))
    text = buf.getvalue()
    rate, tokens = f"{m['items_per_s']:,.2f}", f"{m['input_throughput_tok_s']:,.2f}"
    assert re.search(rf"inputs throughput \(inputs/s\)\s*│ {re.escape(rate)}", text)
    assert re.search(rf"input throughput \(tok/s\)\s*│ {re.escape(tokens)}", text)
    assert "endpoint embeddings (batch_size=2)" in text
    assert "not streamed" not in text  # the chat note: an embeddings answer is never streamed
    assert "not applicable (no tokens generated)" in text and "TTFT" in text
    assert "not applicable: this run's answers carry no generated tokens" in text
    with TestClient(web_app(url)) as c:
        page = c.get(f"/runs/{out.run_id}").text
    assert 'id="card-items-throughput"' in page and "Inputs throughput" in page
    rate = m["items_per_s"]
    assert (f"{rate:,.0f} inputs/s" if rate >= 100 else f"{rate:.2f} inputs/s") in page
    assert "not applicable" in page


def test_one_event_per_answer() -> None:
    """No stream: each answer is one event, whatever the batch."""
    sim = start_simulator_thread(SimConfig(ttft_ms=1, seed=2))
    try:
        res = asyncio.run(run_load(spec(base_url=sim.base_url, num_prompts=2), run_tag="s"))
    finally:
        sim.stop()
    assert [len(r.event_t_ns) for r in res.records] == [1, 1]
