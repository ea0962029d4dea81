"""Multi-turn warm-ups never share a measured session's conversation (issue 24 item 2): a
file with exactly ``num_prompts + warmup_requests`` usable conversations gives warm-ups of
their own (against the simulator's prefix cache: no measured first turn finds a cached
token); one with fewer is refused before anything is sent, naming the counts, on the CLI
(exit 2, one line, no run stored) and through REST and a worker (the job fails saying so,
the target sees no request)."""

from __future__ import annotations

import asyncio
import dataclasses
import json
from pathlib import Path
from typing import Any

import pytest

from app.client.datasets.base import BuildContext, DatasetError, WorkloadParams
from app.client.datasets.conversations import build_sessions
from app.client.datasets.sharegpt import ShareGPTOptions
from app.client.runner import run_load_sync
from app.client.spec import RunSpec
from app.client.tokenizer import BuiltinTokenizer
from app.domain import RequestStatus
from app.targets.sim_config import SimConfig
from app.targets.simulator import start_simulator_thread
from tests.live_server import LiveServerFactory, live_server  # noqa: F401
from tests.worker_helpers import api, submit, wait_job

TOK = BuiltinTokenizer()
N, W = 3, 2  # measured sessions, warm-ups


def jsonl_convs(path: Path, count: int, words: int = 20) -> str:
    """``count`` conversations of 2 turns, each turn ``words`` + 2 tokens, none sharing a
    first token with another (the simulator's prefix cache then shares nothing)."""
    body = " ".join(f"w{i}" for i in range(words))
    rows = [{"turns": [f"c{c} one {body}", f"c{c} two {body}"]} for c in range(count)]
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return str(path)


def sharegpt_convs(path: Path, count: int) -> str:
    rows = [
        {"conversations": [{"from": "human", "value": f"c{c} a b c d"},
                           {"from": "gpt", "value": "r r r r"}]}
        for c in range(count)
    ]  # fmt: skip
    path.write_text(json.dumps(rows))
    return str(path)


def params(path: str, n: int = N, w: int = W) -> WorkloadParams:
    return WorkloadParams(n, w, 1, 4, 0, path)


@pytest.mark.parametrize("kind", ["jsonl", "sharegpt"])
def test_exactly_enough_conversations_give_warmups_of_their_own(tmp_path: Path, kind: str) -> None:
    make = jsonl_convs if kind == "jsonl" else sharegpt_convs
    path = make(tmp_path / "c", N + W)
    s = build_sessions(kind, params(path), ShareGPTOptions(), BuildContext(TOK), None)
    measured = [c.turns[0].text for c in s.measured]
    warm = [c.turns[0].text for c in s.warmup]
    assert len(measured) == N and len(warm) == W
    assert not set(measured) & set(warm) and len(set(measured + warm)) == N + W
    alone = build_sessions(kind, params(path, w=0), ShareGPTOptions(), BuildContext(TOK), None)
    assert alone.measured == s.measured  # warm-ups change nothing measured


@pytest.mark.parametrize("kind", ["jsonl", "sharegpt"])
@pytest.mark.parametrize("count", [N + W - 1, N, 1])
def test_fewer_conversations_refuse_warmups_naming_the_counts(
    tmp_path: Path, kind: str, count: int
) -> None:
    make = jsonl_convs if kind == "jsonl" else sharegpt_convs
    path = make(tmp_path / "c", count)
    with pytest.raises(DatasetError) as e:
        build_sessions(kind, params(path), ShareGPTOptions(), BuildContext(TOK), None)
    assert str(e.value).startswith(
        f"warmup_requests: {W} warm-up sessions need conversations apart from the {N} "
        "measured sessions'"
    )
    assert f"the file has {count} usable" in str(e.value)
    # without warm-ups the measured sessions cycle the file as before
    s = build_sessions(kind, params(path, w=0), ShareGPTOptions(), BuildContext(TOK), None)
    assert len(s.measured) == N


def test_unusable_conversations_do_not_count(tmp_path: Path) -> None:
    """A ShareGPT conversation whose first turn fails the filters is no session: 5 entries,
    one too short, is one fewer than 3 measured + 2 warm-ups."""
    path = tmp_path / "sg.json"
    rows = json.loads(Path(sharegpt_convs(tmp_path / "ok", N + W)).read_text())
    rows[2]["conversations"][0]["value"] = "too short"
    path.write_text(json.dumps(rows))
    with pytest.raises(DatasetError, match="the file has 4 usable"):
        build_sessions("sharegpt", params(str(path)), ShareGPTOptions(), BuildContext(TOK), None)


def test_measured_first_turns_find_nothing_cached_after_the_warmups(tmp_path: Path) -> None:
    """Against the simulator's prefix cache: the warm-ups run first, and no measured
    session's first turn (22 tokens + a role marker, one 16-token block) is cached."""
    path = jsonl_convs(tmp_path / "c.jsonl", N + W)
    sim = start_simulator_thread(SimConfig(ttft_ms=1, itl_ms=0.5, seed=1, prefix_cache_block=16))
    try:
        spec = RunSpec(
            base_url=sim.base_url, model="sim", dataset="jsonl", dataset_path=path,
            multi_turn=True, num_prompts=N, warmup_requests=W, output_len=4,
            scrape_metrics=False, request_timeout_s=10,
        )  # fmt: skip
        res = run_load_sync(spec, run_tag="wu", handle_sigint=False)
    finally:
        sim.stop()
    warm = [r for r in res.records if r.warmup]
    first = [r for r in res.records if not r.warmup and r.turn == 1]
    assert len(warm) == W and len(first) == N
    assert all(r.status is RequestStatus.OK for r in res.records)
    assert [r.cached_prompt_tokens for r in first] == [0] * N
    # the cache works: each second turn finds its first turn's blocks
    second = [r for r in res.records if not r.warmup and r.turn == 2]
    assert all((r.cached_prompt_tokens or 0) >= 16 for r in second)


def test_cli_refuses_with_one_line_and_stores_nothing(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from app.cli.main import main
    from app.services.runs import list_runs, open_database

    path = jsonl_convs(tmp_path / "c.jsonl", N + W - 1)
    db = f"sqlite:///{tmp_path / 'x.db'}"
    sim = start_simulator_thread(SimConfig(ttft_ms=1, itl_ms=0.5, seed=1))
    try:
        rc = main([
            "bench", "--base-url", sim.base_url, "--model", "tokentrace-sim",
            "--dataset-name", "jsonl", "--dataset-path", path, "--multi-turn",
            "--num-prompts", str(N), "--num-warmups", str(W), "--database-url", db,
            "--no-scrape-metrics",
        ])  # fmt: skip
        seen = sim.ground_truth()["requests"]
    finally:
        sim.stop()
    assert rc == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1, err
    assert err[0].startswith("tokentrace bench: error: --num-warmups: 2 warm-up sessions need")
    assert "the file has 4 usable" in err[0]
    assert seen == {}  # nothing was sent
    assert list_runs(open_database(db)) == []  # and no run was kept


def test_rest_and_worker_fail_the_job_naming_the_counts(
    live_server: LiveServerFactory,  # noqa: F811
    sqlite_url: str,
    tmp_path: Path,
) -> None:
    from app.worker.loop import Worker
    from tests.test_worker import FAST

    srv = live_server(sqlite_url)
    path = jsonl_convs(tmp_path / "c.jsonl", N + W - 1)
    sim = start_simulator_thread(SimConfig(ttft_ms=1, itl_ms=0.5, seed=1))
    spec: dict[str, Any] = {
        "base_url": sim.base_url, "model": "tokentrace-sim", "dataset": "jsonl",
        "dataset_path": path, "multi_turn": True, "num_prompts": N, "warmup_requests": W,
        "scrape_metrics": False,
    }  # fmt: skip
    try:
        with api(srv) as c:
            run_id, job_id = submit(c, spec)
            opts = dataclasses.replace(FAST, dataset_dirs=(str(tmp_path),))
            worker = Worker(srv.url, srv.worker_token, state_dir=tmp_path / "w", options=opts)
            outcome = asyncio.run(worker.run_once())
            j = wait_job(c, job_id, ("failed",), 10)
            run = c.get(f"/runs/{run_id}").json()
        seen = sim.ground_truth()["requests"]
    finally:
        sim.stop()
    assert outcome is not None and outcome.status == "failed"
    assert "2 warm-up sessions need conversations apart" in (j.get("error") or ""), j
    assert "the file has 4 usable" in j["error"]
    assert run["report"]["status"] == "failed"
    assert seen == {}
