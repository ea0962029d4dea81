"""Every workload type through every path, on SQLite and PostgreSQL: what the target saw is
what was stored (issue 23, item 2).

Dataset types: random, prefix_repetition, sharegpt (a small file of its own, single and
multi-turn), jsonl (prompts, and conversations as multi-turn sessions), timed_jsonl and
mooncake. Paths: the CLI (``tokentrace bench --database-url``, in this process), REST and a
worker (``POST /api/v1/runs``, then an in-process worker leasing over loopback HTTP), and
the dashboard's launch form driven in headless Chromium (the same worker runs it).

For each run the simulator's own records (``X-Request-Id`` starts with the run id) count the
requests the target was sent; the stored run must hold exactly as many, each index once
(0..n-1: the warm-up and every measured request or turn), its load counts must agree, and
it must have lost nothing and succeeded. One server and one worker per database for the
module, one browser, tiny runs (4 requests, 1 warm-up) against a fast simulator.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import re
import secrets
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import create_engine, text
from sqlalchemy.engine import URL

from app.cli.args import option_flag
from app.cli.main import main as cli_main
from app.storage.db import upgrade_database
from app.targets.sim_config import SimConfig
from app.targets.simulator import SimulatorThread, start_simulator_thread
from app.worker.loop import Worker, WorkerOptions
from tests.browser_support import CHROMIUM, Console, browser_missing, sign_in
from tests.live_server import LiveServer
from tests.worker_helpers import api, request_indices, submit, wait_job

pytestmark = pytest.mark.timeout(120)

MODEL = "tokentrace-sim"
COMMON: dict[str, Any] = {
    "input_len": 8,
    "output_len": 4,
    "num_prompts": 4,
    "warmup_requests": 1,
    "max_concurrency": 2,
}
WORDS = [
    "please",
    "tell",
    "me",
    "a",
    "little",
    "more",
    "about",
    "the",
    "weather",
    "in",
    "the",
    "old",
    "harbour",
    "town",
    "today",
]
WORKER = WorkerOptions(
    backoff_initial_s=0.02,
    backoff_max_s=0.2,
    batch_interval_s=0.05,
    batch_max_requests=3,  # several batches per run
    shutdown_grace_s=3.0,
    heartbeat_interval_s=0.2,
    poll_interval_s=0.05,
)


def _text(k: int) -> str:
    return " ".join(WORDS[k % 5 :] + WORDS[: k % 5])


def _write_files(d: Path) -> dict[str, str]:
    """Small dataset files of every file-based type, in ``d``."""
    convs = [[_text(k + t) for t in range(n)] for k, n in enumerate((3, 2, 1, 3, 2))]
    sharegpt = [
        {
            "conversations": [
                m
                for t in c
                for m in ({"from": "human", "value": t}, {"from": "gpt", "value": _text(7)})
            ]
        }
        for c in convs
    ]
    files = {
        "sharegpt": json.dumps(sharegpt),
        "prompts": "\n".join(json.dumps({"prompt": _text(k)}) for k in range(6)),
        "conversations": "\n".join(json.dumps({"turns": c}) for c in convs),
        "timed": "\n".join(json.dumps({"timestamp": 3 * k, "prompt": _text(k)}) for k in range(6)),
        "mooncake": "\n".join(
            json.dumps(
                {
                    "timestamp": 3 * k,
                    "input_length": 12,
                    "output_length": 4,
                    "hash_ids": [k % 2, 10 + k],
                }
            )
            for k in range(6)
        ),
    }
    out = {}
    for name, body in files.items():
        path = d / f"{name}.{'json' if name == 'sharegpt' else 'jsonl'}"
        path.write_text(body + "\n")
        out[name] = str(path)
    return out


def workloads(files: dict[str, str]) -> dict[str, dict[str, Any]]:
    """Each workload under test: the spec fields beyond ``COMMON``."""
    return {
        "random": {"dataset": "random"},
        "prefix_repetition": {
            "dataset": "prefix_repetition",
            "dataset_options": {"num_prefixes": 2, "prefix_len": 16, "suffix_len": 8},
        },
        "sharegpt": {
            "dataset": "sharegpt",
            "dataset_path": files["sharegpt"],
            "dataset_options": {"output_len": 4},
        },
        "sharegpt_multi_turn": {
            "dataset": "sharegpt",
            "dataset_path": files["sharegpt"],
            "dataset_options": {"output_len": 4},
            "multi_turn": True,
            "max_turns": 3,
        },
        "jsonl": {"dataset": "jsonl", "dataset_path": files["prompts"]},
        "jsonl_multi_turn": {
            "dataset": "jsonl",
            "dataset_path": files["conversations"],
            "multi_turn": True,
        },
        "timed_jsonl": {
            "dataset": "timed_jsonl",
            "dataset_path": files["timed"],
            "dataset_options": {"speedup": 10.0},
        },
        "mooncake": {
            "dataset": "mooncake",
            "dataset_path": files["mooncake"],
            "dataset_options": {"block_size": 8, "speedup": 10.0},
        },
    }


KINDS = list(
    workloads({k: "" for k in ("sharegpt", "prompts", "conversations", "timed", "mooncake")})
)


# ------------------------------------------------------------------------- the lab


@dataclasses.dataclass
class Lab:
    db_url: str
    server: LiveServer
    sim: SimulatorThread
    files: dict[str, str]
    run_token: str
    rest: dict[str, tuple[str, str]] = dataclasses.field(default_factory=dict)  # run, job ids


def _pg_schema(base: URL) -> tuple[str, Any]:
    schema = f"m_{secrets.token_hex(6)}"
    admin = create_engine(base, isolation_level="AUTOCOMMIT")
    with admin.connect() as conn:
        conn.execute(text(f'CREATE SCHEMA "{schema}"'))
    url = base.update_query_dict({"options": f"-csearch_path={schema}"})
    return url.render_as_string(hide_password=False), (admin, schema)


@pytest.fixture(scope="module")
def sim() -> Iterator[SimulatorThread]:
    s = start_simulator_thread(SimConfig(ttft_ms=1, itl_ms=0.5, output_len=4, seed=11))
    yield s
    s.stop()


@pytest.fixture(
    scope="module", params=["sqlite", pytest.param("postgres", marks=pytest.mark.postgres)]
)
def lab(
    request: pytest.FixtureRequest,
    tmp_path_factory: pytest.TempPathFactory,
    sim: SimulatorThread,
) -> Iterator[Lab]:
    """One server, one worker (a thread of this process) and the dataset files, per database."""
    tmp = tmp_path_factory.mktemp(f"matrix-{request.param}")
    cleanup: tuple[Any, str] | None = None
    if request.param == "postgres":
        base = request.getfixturevalue("_pg_database")
        if isinstance(base, str):
            pytest.skip(base)
        db_url, cleanup = _pg_schema(base)
    else:
        db_url = f"sqlite:///{tmp / 'matrix.db'}"
    upgrade_database(db_url)
    data = tmp / "data"
    data.mkdir()
    files = _write_files(data)
    srv = LiveServer(db_url, tmp).start()
    stop = asyncio.Event()
    loop_box: dict[str, Any] = {}

    def serve() -> None:
        async def go() -> None:
            loop_box["loop"] = asyncio.get_running_loop()
            opts = dataclasses.replace(WORKER, dataset_dirs=(str(data),))
            w = Worker(srv.url, srv.worker_token, state_dir=tmp / "state", name="m", options=opts)
            await w.run_forever(stop)

        asyncio.run(go())

    worker = threading.Thread(target=serve, name="matrix-worker", daemon=True)
    worker.start()
    try:
        out = Lab(db_url, srv, sim, files, srv.create_token("run", name="matrix-browser"))
        with api(srv) as c:  # queued at once: the worker runs them while the CLI runs its own
            out.rest = {kind: submit(c, _spec(out, kind)) for kind in KINDS}
        yield out
    finally:
        loop = loop_box.get("loop")
        if loop is not None:
            loop.call_soon_threadsafe(stop.set)
        worker.join(20)
        srv.stop()
        if cleanup is not None:
            admin, schema = cleanup
            with admin.connect() as conn:
                conn.execute(text(f'DROP SCHEMA IF EXISTS "{schema}" CASCADE'))
            admin.dispose()


def _spec(lab: Lab, kind: str) -> dict[str, Any]:
    return {"base_url": lab.sim.base_url, "model": MODEL} | COMMON | workloads(lab.files)[kind]


# ----------------------------------------------------------------------- the checks


def _check(lab: Lab, run_id: str, kind: str) -> None:
    """Target count = stored count, each index once, the load's counts agree, nothing lost."""
    with api(lab.server) as c:
        detail = c.get(f"/runs/{run_id}").json()
        stored = request_indices(c, run_id)
    seen = sum(1 for rid in lab.sim.ground_truth()["requests"] if rid.startswith(run_id + "-"))
    run, report = detail["run"], detail["report"]
    counts = report["load"]["counts"]
    assert seen == len(stored), f"{kind}: the target saw {seen}, {len(stored)} were stored"
    assert sorted(stored) == list(range(seen)), f"{kind}: indices {sorted(stored)}"
    assert (
        seen == counts["warmup"] + counts["sent"] == COMMON["warmup_requests"] + counts["planned"]
    )
    if "multi_turn" in kind:  # sessions of several turns: more requests than sessions
        assert counts["sent"] > COMMON["num_prompts"], f"{kind}: {counts}"
    else:
        assert counts["sent"] == COMMON["num_prompts"], f"{kind}: {counts}"
    assert run["status"] == "succeeded", f"{kind}: {run['status']} {report['validity']['notes']}"
    assert run["lost_requests"] == 0 and report["validity"]["lost_requests"] == 0
    assert report["metrics"]["requests"]["completed_ok"] == counts["sent"]


# ------------------------------------------------------------------------- the paths


def _cli_args(lab: Lab, kind: str) -> list[str]:
    spec = _spec(lab, kind)
    args = [
        "bench",
        "--base-url",
        spec["base_url"],
        "--model",
        MODEL,
        "--dataset-name",
        spec["dataset"],
        "--input-len",
        str(spec["input_len"]),
        "--output-len",
        str(spec["output_len"]),
        "--num-prompts",
        str(spec["num_prompts"]),
        "--num-warmups",
        str(spec["warmup_requests"]),
        "--max-concurrency",
        str(spec["max_concurrency"]),
        "--database-url",
        lab.db_url,
        "--json",
    ]
    if "dataset_path" in spec:
        args += ["--dataset-path", spec["dataset_path"]]
    if spec.get("multi_turn"):
        args.append("--multi-turn")
    if spec.get("max_turns"):
        args += ["--max-turns", str(spec["max_turns"])]
    for field, value in spec.get("dataset_options", {}).items():
        args += [option_flag(spec["dataset"], field), str(value)]
    return args


@pytest.mark.parametrize("kind", KINDS)
def test_cli(lab: Lab, kind: str, capsys: pytest.CaptureFixture[str]) -> None:
    assert cli_main(_cli_args(lab, kind)) == 0
    report = json.loads(capsys.readouterr().out)
    _check(lab, report["run_id"], kind)


@pytest.mark.parametrize("kind", KINDS)
def test_rest_and_worker(lab: Lab, kind: str) -> None:
    run_id, job_id = lab.rest[kind]  # POST /api/v1/runs when the lab started
    with api(lab.server) as c:
        j = wait_job(c, job_id, ("succeeded", "failed", "cancelled"), 90)
    assert j["state"] == "succeeded", j
    _check(lab, run_id, kind)


# ---------------------------------------------------------------------- the browser

_MISSING = browser_missing()


@pytest.fixture(scope="module")
def browser(lab: Lab) -> Iterator[Any]:
    """Chromium, closed with its database's lab: while Playwright's sync API is open it
    holds this thread's event loop, which the CLI path (``asyncio.run``) needs."""
    if _MISSING:
        pytest.skip(f"browser path skipped: {_MISSING}")
    from playwright.sync_api import sync_playwright

    with sync_playwright() as p:
        b = p.chromium.launch(executable_path=CHROMIUM, args=["--no-sandbox"])
        yield b
        b.close()


@pytest.fixture(scope="module")
def launch_page(lab: Lab, browser: Any) -> Iterator[tuple[Any, Console]]:
    """One signed-in page per server, reused by every launch."""
    ctx = browser.new_context(viewport={"width": 1400, "height": 1000})
    page = ctx.new_page()
    con = Console(page)
    sign_in(page, lab.server, lab.run_token, "/launch")  # type: ignore[arg-type]
    yield page, con
    ctx.close()


def _fill_launch_form(page: Any, spec: dict[str, Any]) -> None:
    page.wait_for_selector("body[data-dataset-options=ready]")
    page.fill("#f-base_url", spec["base_url"])
    page.fill("#f-model", MODEL)
    page.select_option("#f-dataset", spec["dataset"])
    page.fill("#f-dataset_path", spec.get("dataset_path", ""))
    for field in ("input_len", "output_len", "num_prompts", "warmup_requests", "max_concurrency"):
        page.fill(f"#f-{field}", str(spec[field]))
    page.set_checked("#f-multi_turn", bool(spec.get("multi_turn")))
    page.fill("#f-max_turns", str(spec.get("max_turns") or ""))
    for field, value in spec.get("dataset_options", {}).items():
        page.fill(f"#f-opt-{spec['dataset']}-{field}", str(value))


@pytest.fixture(scope="module")
def browser_runs(lab: Lab, launch_page: tuple[Any, Console]) -> dict[str, str]:
    """Every workload launched through the form, one after another (the worker runs each
    while the next form is filled): kind -> the page the launch went to."""
    page, _con = launch_page
    out: dict[str, str] = {}
    for kind in KINDS:
        page.goto(f"{lab.server.url}/launch")
        _fill_launch_form(page, _spec(lab, kind))
        with page.expect_navigation(wait_until="commit"):
            page.click("#launch-submit")
        out[kind] = page.url
    page.goto(f"{lab.server.url}/launch")  # off the last run page, which reloads as it ends
    return out


@pytest.mark.slow
@pytest.mark.parametrize("kind", KINDS)
def test_browser_launch(
    lab: Lab, launch_page: tuple[Any, Console], browser_runs: dict[str, str], kind: str
) -> None:
    m = re.search(r"/runs/([0-9a-f]+)$", browser_runs[kind])
    assert m, f"{kind}: the launch went to {browser_runs[kind]}"
    run_id = m.group(1)
    with api(lab.server) as c:
        job_id = c.get(f"/runs/{run_id}").json()["job"]["id"]
        j = wait_job(c, job_id, ("succeeded", "failed", "cancelled"), 90)
    assert j["state"] == "succeeded", j
    _check(lab, run_id, kind)
    assert launch_page[1].problems() == []
