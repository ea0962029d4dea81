"""A trace replayed without ``num_prompts`` is the whole trace (issue 24 item 6), on the CLI,
through REST and a worker, and from the launch form; and a trace line's numbers are bounded
(issue 23 item 8): a timestamp of 1e300, NaN, infinity, a negative or huge value, in any
numeric field, is refused before anything is sent, naming the line and the field."""

from __future__ import annotations

import asyncio
import dataclasses
import json
import re
from pathlib import Path
from typing import Any

import pytest
from fastapi.testclient import TestClient
from sqlalchemy.orm import Session, sessionmaker

from app.client.datasets.base import DatasetError
from app.client.datasets.trace_times import MAX_REPLAY_MS
from app.client.spec import RunSpec
from app.client.tokenizer import BuiltinTokenizer
from app.client.workload import build_workload
from app.storage import jobs as job_repo
from app.storage.db import session_scope
from app.targets.sim_config import SimConfig
from app.targets.simulator import SimulatorThread, start_simulator_thread
from tests.live_server import LiveServerFactory, live_server  # noqa: F401
from tests.test_web_dataset_options import client, sessions, token  # noqa: F401
from tests.web_support import post_form
from tests.worker_helpers import api, request_indices, submit, wait_job

TOK = BuiltinTokenizer()
LINES = 40


def mooncake(path: Path, n: int = LINES) -> str:
    rows = [
        {"timestamp": 2 * i, "input_length": 8, "output_length": 2, "hash_ids": [i]}
        for i in range(n)
    ]
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return str(path)


def timed(path: Path, n: int = LINES) -> str:
    rows = [{"timestamp": 2 * i, "prompt": f"p{i} a b", "output_len": 2} for i in range(n)]
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return str(path)


MAKERS = {"mooncake": mooncake, "timed_jsonl": timed}


@pytest.fixture(scope="module")
def sim() -> Any:
    s = start_simulator_thread(SimConfig(ttft_ms=1, itl_ms=0.5, seed=4))
    yield s
    s.stop()


def spec(**kw: Any) -> RunSpec:
    return RunSpec.model_validate({"base_url": "http://127.0.0.1:9", "model": "m"} | kw)


# ------------------------------------------------------------------ the spec and the build


@pytest.mark.parametrize("dataset", list(MAKERS))
def test_no_num_prompts_replays_the_whole_trace(tmp_path: Path, dataset: str) -> None:
    path = MAKERS[dataset](tmp_path / "t.jsonl")
    s = spec(dataset=dataset, dataset_path=path)
    assert s.num_prompts is None  # stored so: the whole trace, whatever its length
    assert RunSpec.model_validate(s.model_dump()).num_prompts is None
    w = build_workload(s, TOK)
    assert len(w.measured) == LINES and w.at_ns == [2 * i * 1_000_000 for i in range(LINES)]
    assert len(build_workload(s.model_copy(update={"num_prompts": 7}), TOK).measured) == 7
    with pytest.raises(DatasetError) as e:  # asked for more than it has: refused, not cycled
        build_workload(s.model_copy(update={"num_prompts": 100}), TOK)
    assert str(e.value).startswith(f"num_prompts: 100 requested, the trace has {LINES} ")
    assert "or leave it out to replay the whole trace" in str(e.value)


def test_other_types_keep_their_default_count() -> None:
    assert spec().num_prompts == 100
    assert spec(dataset="prefix_repetition").num_prompts == 100
    assert spec(dataset="jsonl", dataset_path="/x.jsonl").num_prompts == 100


def test_a_whole_timed_jsonl_has_no_lines_left_for_warmups(tmp_path: Path) -> None:
    path = timed(tmp_path / "t.jsonl")
    s = spec(dataset="timed_jsonl", dataset_path=path, warmup_requests=2)
    with pytest.raises(DatasetError, match=r"warmup_requests: 2 warm-ups need lines the replay"):
        build_workload(s, TOK)
    w = build_workload(s.model_copy(update={"num_prompts": LINES - 3}), TOK)
    assert [p.prompt for p in w.warmup] == [f"p{LINES - 1} a b", f"p{LINES - 2} a b"]
    assert not {p.prompt for p in w.warmup} & {p.prompt for p in w.measured}


# ------------------------------------------------------------------ the CLI


@pytest.mark.parametrize("dataset", list(MAKERS))
def test_cli_without_num_prompts_replays_every_line(
    tmp_path: Path, sim: SimulatorThread, dataset: str, capsys: pytest.CaptureFixture[str]
) -> None:
    from app.cli.main import main

    path = MAKERS[dataset](tmp_path / "t.jsonl")
    sim.reset()
    argv = ["bench", "--base-url", sim.base_url, "--model", "tokentrace-sim",
            "--dataset-name", dataset, "--dataset-path", path, "--no-save",
            "--no-scrape-metrics", "--json"]  # fmt: skip
    assert main(argv) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["load"]["counts"]["planned"] == LINES
    assert report["metrics"]["requests"]["completed_ok"] == LINES
    assert len(sim.ground_truth()["requests"]) == LINES
    assert main([*argv, "--num-prompts", "100"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith(
        f"tokentrace bench: error: --num-prompts: 100 requested, the trace has {LINES} "
    ), err


# ------------------------------------------------------------------ REST and a worker


@pytest.mark.parametrize("dataset", list(MAKERS))
def test_rest_and_worker_replay_the_whole_trace(
    live_server: LiveServerFactory,  # noqa: F811
    sqlite_url: str,
    tmp_path: Path,
    sim: SimulatorThread,
    dataset: str,
) -> None:
    from app.worker.loop import Worker
    from tests.test_worker import FAST

    srv = live_server(sqlite_url)
    path = MAKERS[dataset](tmp_path / "t.jsonl")
    body = {"base_url": sim.base_url, "model": "tokentrace-sim", "dataset": dataset,
            "dataset_path": path, "scrape_metrics": False}  # fmt: skip
    sim.reset()
    with api(srv) as c:
        run_id, job_id = submit(c, body)
        assert c.get(f"/jobs/{job_id}").json()["spec"]["num_prompts"] is None
        opts = dataclasses.replace(FAST, dataset_dirs=(str(tmp_path),))
        worker = Worker(srv.url, srv.worker_token, state_dir=tmp_path / "w", options=opts)
        outcome = asyncio.run(worker.run_once())
        assert outcome is not None and outcome.status == "succeeded", outcome
        wait_job(c, job_id, ("succeeded",), 10)
        report = c.get(f"/runs/{run_id}").json()["report"]
        indices = request_indices(c, run_id)
    assert sorted(indices) == list(range(LINES))  # every line stored, once
    assert report["status"] == "succeeded"
    assert report["load"]["counts"]["planned"] == LINES
    assert len(sim.ground_truth()["requests"]) == LINES


# ------------------------------------------------------------------ the launch form


def test_launch_form_blank_count_is_the_whole_trace_or_100(
    client: TestClient,  # noqa: F811
    sessions: sessionmaker[Session],  # noqa: F811
) -> None:
    from app.web import launch_form

    html = client.get("/launch").text
    assert re.search(r'name="num_prompts" id="f-num_prompts"\s+value=""', html)  # blank
    assert "blank: 100, or a trace&#39;s every line" in html
    base = launch_form.defaults() | {"base_url": "http://127.0.0.1:9", "model": "m"}
    for dataset, want in (("mooncake", None), ("timed_jsonl", None), ("random", 100)):
        form = base | {"dataset": dataset, "dataset_path": "/data/t.jsonl"}
        r = post_form(client, "/launch", form, follow_redirects=False)
        assert r.status_code == 303, r.text
        run_id = r.headers["location"].removeprefix("/runs/")
        with session_scope(sessions) as s:
            job = job_repo.job_for_run(s, run_id)
            assert job is not None and job.spec["num_prompts"] == want, dataset


# ------------------------------------------------------------------ bounded numbers


BAD_TRACE_LINES = [
    ('"timestamp": 1e300', "dataset_path line 2: 'timestamp' is over 1e+13 ms"),
    ('"timestamp": 1e400', "dataset_path line 2: 'timestamp' must be a finite number"),
    ('"timestamp": 1' + "0" * 400, "dataset_path line 2: 'timestamp' is over 1e+13 ms"),
    ('"timestamp": 1' + "0" * 5000, "dataset_path line 2: not valid JSON (Exceeds the limit"),
    ('"timestamp": NaN', "dataset_path line 2: not valid JSON (NaN is not a JSON number)"),
    ('"timestamp": -Infinity', "dataset_path line 2: not valid JSON (-Infinity is not a JSON"),
    ('"timestamp": -1e300', "dataset_path line 2: 'timestamp' must be >= 0, got -1e+300"),
    ('"timestamp": -' + "9" * 400, "dataset_path line 2: 'timestamp' must be >= 0, got -1e+300"),
    ('"timestamp": true', "dataset_path line 2: 'timestamp' must be a number of ms"),
    ('"timestamp": 40000000000', "dataset_path line 2: 'timestamp' 4e+10 is 4e+10 ms after"),
    ('"timestamp": 5, "input_length": 1' + "0" * 40, "line 2: 'input_length' is over 1,000,000"),
    ('"timestamp": 5, "output_length": -' + "9" * 40, "line 2: 'output_length' must be a pos"),
    ('"timestamp": 5, "input_length": 1.5', "line 2: 'input_length' must be an integer"),
    ('"timestamp": 5, "hash_ids": [NaN]', "dataset_path line 2: not valid JSON (NaN is not"),
    ('"timestamp": 5, "hash_ids": [1e300]', "line 2: 'hash_ids' must be a list of integers"),
    ('"timestamp": 5, "x": [' + "[" * 100_000, "dataset_path line 2: not valid JSON"),
]


@pytest.mark.parametrize(("field", "msg"), BAD_TRACE_LINES)
def test_a_mooncake_lines_numbers_are_bounded(tmp_path: Path, field: str, msg: str) -> None:
    good = {"timestamp": 0, "input_length": 4, "output_length": 2, "hash_ids": [1]}
    rest = [f'"{k}": {json.dumps(v)}' for k, v in good.items() if f'"{k}"' not in field]
    second = ", ".join([field, *rest])
    path = tmp_path / "t.jsonl"
    path.write_text(json.dumps(good) + "\n{" + second + "}\n")
    with pytest.raises(DatasetError) as e:
        build_workload(spec(dataset="mooncake", dataset_path=str(path)), TOK)
    assert str(e.value).startswith(msg) or msg in str(e.value), str(e.value)
    assert len(str(e.value)) < 400  # a huge number is never printed whole


@pytest.mark.parametrize(
    ("field", "msg"),
    [
        ('"timestamp": 1e300', "dataset_path line 2: 'timestamp' is over 1e+13 ms"),
        ('"timestamp": 5, "output_len": 1' + "0" * 30, "line 2: 'output_len' is over 1,000,000"),
        ('"timestamp": 5, "output_len": 0', "line 2: 'output_len' must be a positive integer"),
        ('"timestamp": 5, "output_len": Infinity', "line 2: not valid JSON (Infinity is not"),
    ],
)
def test_a_timed_jsonl_lines_numbers_are_bounded(tmp_path: Path, field: str, msg: str) -> None:
    path = tmp_path / "t.jsonl"
    path.write_text('{"timestamp": 0, "prompt": "a"}\n{' + field + ', "prompt": "b"}\n')
    with pytest.raises(DatasetError) as e:
        build_workload(spec(dataset="timed_jsonl", dataset_path=str(path)), TOK)
    assert msg in str(e.value) and str(e.value).startswith("dataset_path line 2"), str(e.value)


def test_a_tiny_speedup_cannot_stretch_the_replay_past_a_year(tmp_path: Path) -> None:
    path = mooncake(tmp_path / "t.jsonl", 3)  # 0, 2, 4 ms
    s = spec(dataset="mooncake", dataset_path=path, dataset_options={"speedup": 1e-12})
    with pytest.raises(DatasetError) as e:
        build_workload(s, TOK)
    assert str(e.value).startswith("dataset_path line 2: 'timestamp' 2 is 2 ms after")
    assert "at speedup 1e-12 the replay would last over 365 days" in str(e.value)
    ok = spec(dataset="mooncake", dataset_path=path, dataset_options={"speedup": 1e-9})
    w = build_workload(ok, TOK)  # 4 ms / 1e-9 = 4e9 ms: under a year, and an int64 of ns
    assert w.at_ns is not None and w.at_ns[-1] == 4 * 10**15 and w.at_ns[-1] < MAX_REPLAY_MS * 1e6


def test_cli_refuses_the_issues_trace_naming_line_and_field(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """The issue's case: a timestamp of 1e300 was an uncaught OverflowError; now exit 2, one
    line naming the line and the field, and no run stored."""
    from app.cli.main import main
    from app.services.runs import list_runs, open_database

    path = tmp_path / "t.jsonl"
    path.write_text(
        '{"timestamp": 0, "input_length": 4, "output_length": 2, "hash_ids": [1]}\n'
        '{"timestamp": 1e300, "input_length": 4, "output_length": 2, "hash_ids": [1]}\n'
    )
    db = f"sqlite:///{tmp_path / 'x.db'}"
    args = ["--base-url", "http://127.0.0.1:9", "--model", "m", "--dataset-name", "mooncake",
            "--dataset-path", str(path), "--database-url", db, "--no-scrape-metrics"]  # fmt: skip
    line = (
        "--dataset-path line 2: 'timestamp' is over 1e+13 ms (ms from the trace's start, "
        "or Unix ms)"
    )
    for command, extra in (("bench", []), ("sweep", ["--concurrencies", "1", "2"])):
        assert main([command, *args, *extra]) == 2, command
        err = capsys.readouterr().err.strip().splitlines()
        assert err[-1] == f"tokentrace {command}: error: {line}", err  # a sweep: "step 0" first
        assert len(err) == (1 if command == "bench" else 2), err
    assert list_runs(open_database(db)) == []


@pytest.mark.parametrize("multi_turn", [False, True])
@pytest.mark.parametrize(
    ("field", "msg"),
    [
        ('"output_len": 1' + "0" * 30, "dataset_path line 2: 'output_len' is over 1,000,000"),
        ('"output_len": -1', "dataset_path line 2: 'output_len' must be a positive integer"),
        ('"output_len": NaN', "dataset_path line 2: not valid JSON (NaN is not a JSON number)"),
        ('"output_len": 1e400', "dataset_path line 2: 'output_len' must be a positive integer"),
    ],
)
def test_a_jsonl_lines_numbers_are_bounded(
    tmp_path: Path, field: str, msg: str, multi_turn: bool
) -> None:
    from app.client.datasets.base import BuildContext
    from app.client.datasets.conversations import build_sessions

    path = tmp_path / "p.jsonl"
    key = '"turns": ["b"]' if multi_turn else '"prompt": "b"'
    path.write_text('{"prompt": "a", "turns": ["a"]}\n{' + key + ", " + field + "}\n")
    s = spec(dataset="jsonl", dataset_path=str(path), multi_turn=multi_turn)
    with pytest.raises(DatasetError) as e:
        if multi_turn:
            build_sessions("jsonl", s.workload_params(), None, BuildContext(TOK), None)
        else:
            build_workload(s, TOK)
    assert str(e.value).startswith(msg), str(e.value)
