"""The rerank surface (issue 25 part 3): a JSONL line's query and documents a request, in the
shape its ``rerank_api`` option names (vLLM/Jina ``/v1/rerank``, Cohere ``/v2/rerank``,
vLLM ``/v1/score``, TEI ``/rerank``), one JSON answer. A dataset without documents is
refused before anything is sent, naming both fields; each shape round-trips against the
simulator, documents/s and E2E recomputed here from the raw records; an answer of another
shape fails naming what was expected and what came."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from pydantic import ValidationError

from app.analysis.metrics import compute_metrics
from app.cli.main import main
from app.client.datasets.base import DatasetError
from app.client.runner import run_load
from app.client.spec import RunSpec
from app.domain import EventKind, RequestStatus, trace_from_records
from app.targets.sim_config import SimConfig
from app.targets.simulator import start_simulator_thread
from tests.api_support import api_client
from tests.endpoint_support import body_of
from tests.test_cli import _count_runs
from tests.test_client import Server, run
from tests.test_embeddings import answering

LINES = [
    {"query": "what is a cat", "documents": ["a cat is a pet", "dogs bark", "cats purr a lot"]},
    {"query": "capital of france", "documents": ["paris", "lyon is big"]},
    {"query": "rust", "documents": ["a language", "iron oxide", "a game", "a film"]},
]


def dataset(tmp_path: Path, lines: list[dict[str, Any]] = LINES) -> str:
    path = tmp_path / "pairs.jsonl"
    path.write_text("".join(json.dumps(x) + "\n" for x in lines))
    return str(path)


def spec(path: str | None = None, **kw: Any) -> RunSpec:
    base: dict[str, Any] = {
        "base_url": "http://127.0.0.1:9",
        "model": "m",
        "endpoint": "rerank",
        "dataset": "jsonl",
        "dataset_path": path or "/nonexistent.jsonl",
        "scrape_metrics": False,
    }
    return RunSpec(**(base | kw))


# ----------------------------------------------------------------------- refused


@pytest.mark.parametrize(
    ("kw", "names"),
    [
        ({"dataset": "random", "dataset_path": None}, ("dataset", "'rerank'", "'random'")),
        ({"dataset": "sharegpt", "dataset_path": None}, ("dataset", "'rerank'")),
        (
            {"endpoint_options": {"rerank_api": "score", "top_n": 2}},
            ("endpoint_options.top_n", "'score'"),
        ),
        ({"endpoint_options": {"rerank_api": "colbert"}}, ("endpoint_options.rerank_api",)),
        ({"multi_turn": True}, ("endpoint", "multi_turn", "'rerank'")),
        ({"goodput": {"tpot": 5.0}}, ("goodput", "tpot")),
    ],
)
def test_what_it_cannot_take_is_refused_naming_the_fields(
    kw: dict[str, Any], names: tuple[str, ...]
) -> None:
    with pytest.raises(ValidationError) as e:
        spec(**kw)
    for name in names:
        assert name in str(e.value), (name, str(e.value))


def test_refused_at_launch_422_and_exit_2(
    db_url: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    with api_client(db_url) as api:
        body = {"base_url": "http://127.0.0.1:9", "model": "m", "endpoint": "rerank"}
        r = api.client.post("/api/v1/runs", json=body, headers=api.h(api.run))
        assert r.status_code == 422 and "'rerank'" in r.text and "'random'" in r.text
        assert api.client.get("/api/v1/jobs", headers=api.h(api.admin)).json()["items"] == []
    db = f"sqlite:///{tmp_path / 'c.db'}"
    argv = ["bench", "--base-url", "http://127.0.0.1:9", "--model", "m", "--database-url", db]
    assert main([*argv, "--endpoint", "rerank"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "--dataset-name" in err[0] and "'rerank'" in err[0], err
    assert _count_runs(db) == 0


@pytest.mark.parametrize(
    ("lines", "message"),
    [
        ([{"prompt": "no documents here"}], "dataset_path: endpoint 'rerank' needs 'query'"),
        ([{"query": "q", "documents": []}], "dataset_path line 1: 'documents' must be a list"),
        ([LINES[0], {"query": "q", "documents": ["ok", 3]}], "dataset_path line 2: each of"),
    ],
)
def test_lines_without_documents_are_refused_before_anything_is_sent(
    tmp_path: Path, lines: list[dict[str, Any]], message: str
) -> None:
    path = dataset(tmp_path, lines)

    async def go() -> Server:
        async with Server(answering(lambda req: {})) as srv:
            with pytest.raises(DatasetError, match=message):
                await run_load(spec(path, base_url=srv.url), run_tag="r")
            return srv

    assert run(go()).requests == []


# ----------------------------------------------------------------------- bodies


@pytest.mark.parametrize(
    ("options", "path", "body"),
    [
        ({}, "/v1/rerank", {"model": "m", "query": "q", "documents": ["a", "b"]}),
        (
            {"rerank_api": "cohere", "top_n": 1},
            "/v2/rerank",
            {"model": "m", "query": "q", "documents": ["a", "b"], "top_n": 1},
        ),
        ({"rerank_api": "score"}, "/v1/score", {"model": "m", "text_1": "q", "text_2": ["a", "b"]}),
        ({"rerank_api": "tei"}, "/rerank", {"query": "q", "texts": ["a", "b"]}),
    ],
)
def test_the_bodies_and_paths(options: dict[str, Any], path: str, body: dict[str, Any]) -> None:
    got = body_of("rerank", prompt="q", inputs=("a", "b"), options=options)
    assert json.loads(got) == body and got == json.dumps(body, separators=(",", ":")).encode()
    from app.client.http_request import parse_target
    from tests.endpoint_support import path_of

    assert path_of(parse_target("http://h:1/v1"), "rerank", options) == path


# ----------------------------------------------------------------------- measured


@pytest.mark.parametrize(
    "options",
    [{}, {"rerank_api": "cohere"}, {"rerank_api": "score"}, {"rerank_api": "tei"}, {"top_n": 2}],
)
def test_each_shape_against_the_simulator(tmp_path: Path, options: dict[str, Any]) -> None:
    sim = start_simulator_thread(SimConfig(ttft_ms=2, per_input_token_ms=0.01, seed=6))
    try:
        s = spec(
            dataset(tmp_path), base_url=sim.base_url, model="sim", num_prompts=6,
            max_concurrency=2, endpoint_options=options,
        )  # fmt: skip
        res = run(run_load(s, run_tag="rr"))
        truth = sim.ground_truth()["requests"]
    finally:
        sim.stop()
    assert [r.status for r in res.records] == [RequestStatus.OK] * 6, res.records[0].error
    docs, e2e, tokens = 0, [], 0
    for r in res.records:
        line = LINES[r.index % 3]  # jsonl cycles its lines
        n = len(line["documents"])
        g = truth[f"rr-{r.index}"]
        assert g["events"]["kind"] == ["response"] and g["events"]["tokens"] == [n]
        assert r.event_kind.tolist() == [EventKind.ANSWER] and r.event_tokens.tolist() == [n]
        # the server's count where it says one (rerank, score), else the client's: the same
        # pairs rule, so equal here
        assert r.input_tokens == g["input_tokens"]
        assert r.sent_ns is not None
        docs += n
        tokens += g["input_tokens"]
        e2e.append((int(r.event_t_ns[0]) - r.sent_ns) / 1e6)
    m = compute_metrics(trace_from_records(res.records)).to_dict()
    sent = [r.sent_ns for r in res.records if r.sent_ns is not None]
    ends = [int(r.event_t_ns[-1]) for r in res.records] + [r.end_ns or 0 for r in res.records]
    window_s = (max(ends) - min(sent)) / 1e9
    assert m["items_total"] == docs == 18
    assert m["items_per_s"] == pytest.approx(docs / window_s, rel=1e-9)
    assert m["input_throughput_tok_s"] == pytest.approx(tokens / window_s, rel=1e-9)
    assert m["e2el_ms"]["p50"] == pytest.approx(float(np.percentile(e2e, 50)), rel=1e-9)
    assert m["ttft_ms"]["count"] == 0 and m["ttft_ms"]["reason"].startswith("not applicable")


@pytest.mark.parametrize(
    ("options", "answer", "error"),
    [
        (
            {"rerank_api": "score"},
            lambda req: {"id": "x", "model": "m", "results": [{"index": 0, "relevance_score": 1}]},
            "expected a score answer (data[].score), got a JSON object with 'id', 'model', "
            "'results'",
        ),
        (
            {"rerank_api": "tei"},
            lambda req: {"object": "list", "data": [{"index": 0, "score": 0.5}]},
            "expected a TEI rerank answer (a list of {index, score}), got a JSON object of "
            "'object': 'list'",
        ),
        (
            {},
            lambda req: [{"index": 0, "score": 0.5}],
            "expected a rerank answer (results[].relevance_score), got a JSON list of 1 items",
        ),
        (
            {},
            lambda req: {"results": [{"index": 0, "relevance_score": 0.5}]},
            "the answer carries 1 results; 3 were asked for",
        ),
    ],
)
def test_an_answer_of_another_shape_fails_naming_both(
    tmp_path: Path, options: dict[str, Any], answer: Any, error: str
) -> None:
    path = dataset(tmp_path, LINES[:1])

    async def go() -> Any:
        async with Server(answering(answer)) as srv:
            s = spec(path, base_url=srv.url, num_prompts=2, endpoint_options=options)
            return await run_load(s, run_tag="w")

    res = run(go())
    assert [(r.status, r.error) for r in res.records] == [(RequestStatus.ERROR, error)] * 2
