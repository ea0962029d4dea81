"""One lab for the issue-24 browser journeys (tests/test_browser_finish_job.py): a
concurrency sweep of three simulator runs, a multi-turn run, a 3,000-request import and a
saved baseline, in one SQLite file, made in a few seconds."""

from __future__ import annotations

import datetime as dt
import json
import math
from dataclasses import dataclass
from pathlib import Path

from sqlalchemy.orm import Session, sessionmaker

from app.client.spec import RunSpec
from app.domain import RunStatus
from app.services import baselines as baseline_svc
from app.services.file_imports import import_path
from app.services.runs import open_database
from app.storage import compare_repo
from app.storage import repository as repo
from app.storage.db import session_scope
from app.targets.sim_config import SimConfig
from tests.web_support import bench

N_BIG = 3_000  # requests of the imported run: 30 pages of 100
LONG_HOST = "inference-gateway.eu-west-1.internal.example.com"


@dataclass(frozen=True)
class Lab:
    url: str
    sessions: sessionmaker[Session]
    sweep_id: str
    step_runs: list[str]  # concurrency 1, 2, 4
    turns_run: str
    big_run: str
    long_target: str  # a run whose target URL has a long host name
    baseline: str  # a saved baseline: the concurrency-1 run


def big_csv(path: Path, n: int = N_BIG) -> Path:
    """``n`` requests, one every 10 ms, TTFT 20 + (i mod 50) ms, E2E 100 + i mod 7 ms."""
    lines = ["request_id,start_ts,first_token_ts,end_ts,input_tokens,output_tokens"]
    for i in range(n):
        t0 = 100.0 + i * 0.01
        ttft = 0.020 + (i % 50) / 1000
        lines.append(f"r{i},{t0:.3f},{t0 + ttft:.3f},{t0 + 0.1 + (i % 7) / 1000:.3f},64,8")
    path.write_text("\n".join(lines) + "\n")
    return path


def make_lab(tmp: Path) -> Lab:
    url = f"sqlite:///{tmp / 'finish.db'}"
    sessions = open_database(url)
    sim = SimConfig(ttft_ms=4, itl_ms=0.5, seed=3)
    steps = [
        bench(sessions, sim, f"c{c}", num_prompts=8, request_rate=math.inf, max_concurrency=c)
        for c in (1, 2, 4)
    ]  # fmt: skip
    with session_scope(sessions) as s:
        sweep_id = compare_repo.create_sweep(
            s,
            spec={"model": "tokentrace-sim", "base_url": "http://127.0.0.1:9"},
            mode="concurrencies",
            loads=[1.0, 2.0, 4.0],
            name="conc sweep",
            status="succeeded",
        )
        for i, (c, rid) in enumerate(zip((1, 2, 4), steps, strict=True)):
            compare_repo.add_step(
                s, sweep_id, step_idx=i, run_id=rid, load=float(c), load_kind="concurrency"
            )
        baseline_svc.save(s, steps[0], "nightly-c1")
    conv = tmp / "conv.jsonl"
    convs = [["a b c d", "e f g", "h i"], ["j k l m n", "o p"]]
    conv.write_text("".join(json.dumps({"turns": c}) + "\n" for c in convs))
    turns_run = bench(
        sessions, SimConfig(ttft_ms=3, itl_ms=0.5, seed=2), "multi-turn",
        dataset="jsonl", dataset_path=str(conv), multi_turn=True, endpoint="chat",
        num_prompts=4, output_len=4, request_rate=80.0,
    )  # fmt: skip
    (big_run,) = import_path(sessions, "csv", big_csv(tmp / "big.csv"), name="big import")
    with session_scope(sessions) as s:
        long_target = repo.create_run(
            s,
            RunSpec(base_url=f"https://{LONG_HOST}:8443/v1", model="m", num_prompts=1),
            name="long target",
            status=RunStatus.SUCCEEDED,
            created_at=dt.datetime.now(dt.UTC),
        )
    return Lab(url, sessions, sweep_id, steps, turns_run, big_run, long_target, "nightly-c1")
