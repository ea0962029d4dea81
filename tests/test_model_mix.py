"""A weighted model mix over two targets, against two real simulators on loopback, on SQLite
and PostgreSQL (issue 27, part 2).

Each simulator records every request it was sent (``X-Request-Id``, the model the body
asked for, the ``X-Session-ID`` header). For each run: what each simulator saw, request by
request, is what was stored (the request's model and target, from the per-request export);
the counts per model and per target agree; the stored per-model and per-target figures
(the report's ``groups``) equal a recomputation from the raw per-request export (numpy's
linear percentiles, output tokens over first send to last end); each target's ``/metrics``
was scraped. Paths: the CLI (round-robin, and dealt over two load processes: the same seed
assigns the same models and targets), and REST + a worker (multi-turn sessions with session
affinity: a session's turns on one target and one model, its header naming it). Bad input:
422 / exit 2 naming the field, and neither simulator sees a request.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import secrets
import threading
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from sqlalchemy import create_engine, text
from sqlalchemy.engine import URL

from app.cli.main import main as cli_main
from app.storage.db import upgrade_database
from app.targets.sim_config import SimConfig
from app.targets.simulator import SimulatorThread, start_simulator_thread
from app.worker.loop import Worker, WorkerOptions
from tests.live_server import LiveServer
from tests.worker_helpers import api, submit, wait_job

pytestmark = pytest.mark.timeout(180)

MIX = "llama-8b:0.7,llama-8b-lora-sql:0.3"
MODELS = ("llama-8b", "llama-8b-lora-sql")
WORKER = WorkerOptions(
    backoff_initial_s=0.02,
    backoff_max_s=0.2,
    batch_interval_s=0.05,
    batch_max_requests=5,
    shutdown_grace_s=3.0,
    heartbeat_interval_s=0.2,
    poll_interval_s=0.05,
)


@dataclasses.dataclass
class Lab:
    db_url: str
    server: LiveServer
    sims: tuple[SimulatorThread, SimulatorThread]
    data: Path

    @property
    def urls(self) -> list[str]:
        return [s.base_url for s in self.sims]


@pytest.fixture(scope="module")
def sims() -> Iterator[tuple[SimulatorThread, SimulatorThread]]:
    a = start_simulator_thread(SimConfig(ttft_ms=1, itl_ms=0.5, output_len=4, seed=11))
    b = start_simulator_thread(SimConfig(ttft_ms=2, itl_ms=0.5, output_len=4, seed=12))
    yield a, b
    a.stop()
    b.stop()


def _pg_schema(base: URL) -> tuple[str, Any]:
    schema = f"mix_{secrets.token_hex(6)}"
    admin = create_engine(base, isolation_level="AUTOCOMMIT")
    with admin.connect() as conn:
        conn.execute(text(f'CREATE SCHEMA "{schema}"'))
    url = base.update_query_dict({"options": f"-csearch_path={schema}"})
    return url.render_as_string(hide_password=False), (admin, schema)


@pytest.fixture(
    scope="module", params=["sqlite", pytest.param("postgres", marks=pytest.mark.postgres)]
)
def lab(
    request: pytest.FixtureRequest,
    tmp_path_factory: pytest.TempPathFactory,
    sims: tuple[SimulatorThread, SimulatorThread],
) -> Iterator[Lab]:
    """One server and one worker (a thread of this process) per database."""
    tmp = tmp_path_factory.mktemp(f"mix-{request.param}")
    cleanup: tuple[Any, str] | None = None
    if request.param == "postgres":
        base = request.getfixturevalue("_pg_database")
        if isinstance(base, str):
            pytest.skip(base)
        db_url, cleanup = _pg_schema(base)
    else:
        db_url = f"sqlite:///{tmp / 'mix.db'}"
    upgrade_database(db_url)
    data = tmp / "data"
    data.mkdir()
    convs = [[f"turn {t} of conversation {k}" for t in range(3)] for k in range(9)]
    (data / "conversations.jsonl").write_text(
        "\n".join(json.dumps({"turns": c}) for c in convs) + "\n"
    )
    srv = LiveServer(db_url, tmp).start()
    stop = asyncio.Event()
    loop_box: dict[str, Any] = {}

    def serve() -> None:
        async def go() -> None:
            loop_box["loop"] = asyncio.get_running_loop()
            opts = dataclasses.replace(WORKER, dataset_dirs=(str(data),))
            w = Worker(srv.url, srv.worker_token, state_dir=tmp / "state", name="mix", options=opts)
            await w.run_forever(stop)

        asyncio.run(go())

    worker = threading.Thread(target=serve, name="mix-worker", daemon=True)
    worker.start()
    try:
        yield Lab(db_url, srv, sims, data)
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


# ----------------------------------------------------------------------- the checks


def seen_by(lab: Lab, run_id: str) -> dict[str, tuple[str, dict[str, Any]]]:
    """Each request of the run a simulator was sent: its id -> (that target, its record)."""
    out: dict[str, tuple[str, dict[str, Any]]] = {}
    for sim in lab.sims:
        for rid, rec in sim.ground_truth()["requests"].items():
            if rid.startswith(run_id + "-"):
                assert rid not in out, f"{rid} reached both targets"
                out[rid] = (sim.base_url, rec)
    return out


def exported(lab: Lab, run_id: str) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    with api(lab.server) as c:
        detail = c.get(f"/runs/{run_id}").json()
        r = c.get(f"/runs/{run_id}/export/requests.json")
        r.raise_for_status()
    return detail, r.json()


def rid_of(run_id: str, row: dict[str, Any]) -> str:
    if row["session"] is not None and not row["warmup"]:
        return f"{run_id}-s{row['session']}-t{row['turn']}"
    return f"{run_id}-{row['idx']}"


def recomputed(rows: list[dict[str, Any]], dim: str) -> dict[str, dict[str, Any]]:
    """The per-group figures from the raw export: its own arithmetic, not the app's."""
    measured = [r for r in rows if not r["warmup"]]
    t0 = min(r["sent_ms"] for r in measured if r["sent_ms"] is not None)
    t1 = max(r["end_ms"] for r in measured if r["end_ms"] is not None)
    span_s = (t1 - t0) / 1e3
    out: dict[str, dict[str, Any]] = {}
    for name in {r[dim] for r in measured}:
        group = [r for r in measured if r[dim] == name]
        ok = [r for r in group if r["status"] == "ok"]
        ttft = np.array([r["ttft_ms"] for r in ok if r["ttft_ms"] is not None], float)
        tpot = np.array([r["tpot_ms"] for r in ok if r["tpot_ms"] is not None], float)
        tokens = sum(int(r["output_tokens"] or 0) for r in ok)
        out[name] = {
            "requests": len(group),
            "ok": len(ok),
            "failed": len(group) - len(ok),
            "ttft_p50_ms": float(np.percentile(ttft, 50)),
            "ttft_p99_ms": float(np.percentile(ttft, 99)),
            "tpot_p50_ms": float(np.percentile(tpot, 50)) if tpot.size else None,
            "output_tokens": tokens,
            "output_tok_s": tokens / span_s,
        }
    return out


def check_run(lab: Lab, run_id: str, *, planned: int) -> list[dict[str, Any]]:
    """Target-side = stored, per request; the groups = the recomputation; both scraped."""
    detail, rows = exported(lab, run_id)
    seen = seen_by(lab, run_id)
    report = detail["report"]
    assert detail["run"]["status"] == "succeeded", report["validity"]["notes"]
    assert len(rows) == len(seen) == planned, (len(rows), len(seen), planned)
    for row in rows:
        target, rec = seen[rid_of(run_id, row)]
        assert row["target"] == target and row["model"] == rec["model"], (row, target, rec)
    measured = [r for r in rows if not r["warmup"]]
    for dim in ("model", "target"):
        by_sim = Counter(
            (rec["model"] if dim == "model" else target)
            for rid, (target, rec) in seen.items()
            if rid in {rid_of(run_id, r) for r in measured}
        )
        assert by_sim == Counter(r[dim] for r in measured), dim
        stored = {g[dim]: g for g in report["groups"][dim]}
        want = recomputed(rows, dim)
        assert set(stored) == set(want)
        for name, figures in want.items():
            for key, v in figures.items():
                got = stored[name][key]
                assert got == pytest.approx(v, rel=1e-6, abs=1e-9), (dim, name, key, got, v)
    assert {g["model"] for g in report["groups"]["model"]} == set(MODELS)
    assert {g["target"] for g in report["groups"]["target"]} == set(lab.urls)
    scrapes = report["load"]["server_metrics"]["targets"]
    assert [s["target"] for s in scrapes] == lab.urls
    assert all(s["status"] == "ok" and s["scrapes"] >= 1 for s in scrapes), scrapes
    with api(lab.server) as c:  # the stored series: each named by its target
        series = c.get(f"/runs/{run_id}/server-metrics").json()
    per_target = Counter(x["labels"].get("tokentrace_target") for x in series)
    assert set(per_target) == set(lab.urls), per_target
    assert per_target[lab.urls[0]] == per_target[lab.urls[1]] > 0  # the same simulator twice
    return rows


def cli_args(lab: Lab, *extra: str) -> list[str]:
    a, b = lab.urls
    return [
        "bench", "--base-url", a, "--base-url", b, "--model", MIX, "--num-prompts", "24",
        "--num-warmups", "2", "--input-len", "8", "--output-len", "4", "--max-concurrency",
        "4", "--seed", "5", "--database-url", lab.db_url, "--json", *extra,
    ]  # fmt: skip


# ------------------------------------------------------------------------- the paths


def test_cli_round_robin(lab: Lab, capsys: pytest.CaptureFixture[str]) -> None:
    assert cli_main(cli_args(lab)) == 0
    report = json.loads(capsys.readouterr().out)
    rows = check_run(lab, report["run_id"], planned=26)
    a, b = lab.urls
    # round-robin by request index, warm-ups included
    assert all(r["target"] == (a, b)[r["idx"] % 2] for r in rows)
    assert report["spec"]["model"] == "llama-8b" and len(report["spec"]["model_mix"]) == 2
    assert report["spec"]["base_urls"] == [a, b] and report["spec"]["routing"] == "round-robin"


def test_cli_two_processes_draw_what_one_does(lab: Lab, capsys: pytest.CaptureFixture[str]) -> None:
    if not lab.db_url.startswith("sqlite"):
        pytest.skip("the load path is the same on either database")
    assignment = []
    for processes in ("1", "2"):
        assert cli_main(cli_args(lab, "--processes", processes)) == 0
        run_id = json.loads(capsys.readouterr().out)["run_id"]
        rows = check_run(lab, run_id, planned=26)
        assignment.append({r["idx"]: (r["model"], r["target"]) for r in rows})
    assert assignment[0] == assignment[1]
    assert {m for m, _ in assignment[0].values()} == set(MODELS)


def test_rest_and_worker_sessions_with_affinity(lab: Lab) -> None:
    a, b = lab.urls
    spec = {
        "model_mix": [{"model": MODELS[0], "weight": 7}, {"model": MODELS[1], "weight": 3}],
        "base_urls": [a, b],
        "routing": "session",
        "dataset": "jsonl",
        "dataset_path": str(lab.data / "conversations.jsonl"),
        "multi_turn": True,
        "num_prompts": 8,
        "warmup_requests": 1,
        "output_len": 4,
        "max_concurrency": 3,
        "seed": 3,
    }
    with api(lab.server) as c:
        run_id, job_id = submit(c, spec)
        j = wait_job(c, job_id, ("succeeded", "failed", "cancelled"), 120)
    assert j["state"] == "succeeded", j
    rows = check_run(lab, run_id, planned=1 + 8 * 3)
    seen = seen_by(lab, run_id)
    sessions: dict[int, set[tuple[str, str]]] = {}
    for row in rows:
        target, rec = seen[rid_of(run_id, row)]
        if row["warmup"]:
            assert rec["session"] == f"{run_id}-r{row['idx']}"  # a request of its own
            continue
        assert rec["session"] == f"{run_id}-s{row['session']}"  # the header names it
        sessions.setdefault(row["session"], set()).add((target, rec["model"]))
    assert len(sessions) == 8
    assert all(len(v) == 1 for v in sessions.values()), sessions  # one target, one model
    assert len({t for v in sessions.values() for t, _ in v}) == 2  # both targets served some


BAD_REST: list[tuple[dict[str, Any], str]] = [
    ({"model": "a:0,b:1"}, "model_mix"),
    ({"model": "a:x,b:1"}, "model"),
    ({"model_mix": [{"model": "", "weight": 1}, {"model": "b"}]}, "model_mix"),
    ({"base_urls": ["{a}", "{a}"]}, "base_urls"),
    ({"routing": "nearest"}, "routing"),
    ({"model_mix": [{"model": f"m{i}"} for i in range(65)]}, "model_mix"),
]


def test_bad_input_is_refused_and_nothing_sent(
    lab: Lab, capsys: pytest.CaptureFixture[str]
) -> None:
    a = lab.urls[0]
    before = [len(s.ground_truth()["requests"]) for s in lab.sims]
    with api(lab.server) as c:
        for fields, field in BAD_REST:
            body = {"base_url": a, "model": "m", "num_prompts": 2} | {
                k: [u.format(a=a) for u in v] if k == "base_urls" else v for k, v in fields.items()
            }
            r = c.post("/runs", json=body)
            assert r.status_code == 422, (fields, r.text)
            assert field in r.text, (field, r.text)
    for args, flag in (
        (["--model", "a:0,b:1"], "--model"),
        (["--routing", "nearest"], "--routing"),
        (["--base-url", a], "--base-url"),  # a third --base-url, the first again
    ):
        base = cli_args(lab)
        if flag == "--model":
            base[base.index("--model") + 1] = args[1]
            argv = base
        else:
            argv = base + args
        assert cli_main(argv) == 2, argv
        assert flag in capsys.readouterr().err
    assert [len(s.ground_truth()["requests"]) for s in lab.sims] == before


def test_an_agent_trace_keeps_each_session_on_one_model_and_target(
    sims: tuple[SimulatorThread, SimulatorThread],
) -> None:
    """An agent trace's sessions (``agent_sessions``): every request of a session, its
    subagent branches included, on the session's one target and one model, named by the
    session header; the records say the same."""
    from app.client.runner import run_load
    from app.client.spec import RunSpec
    from tests.test_client import run

    trace = str(Path(__file__).parent / "fixtures" / "agent_trace.jsonl")
    spec = RunSpec(
        base_urls=[s.base_url for s in sims], model=MIX, routing="session",
        dataset="agentic", dataset_path=trace, output_len=3, scrape_metrics=False, seed=9,
    )  # fmt: skip
    res = run(run_load(spec, run_tag="agentmix"))
    seen: dict[str, tuple[str, dict[str, Any]]] = {}
    for sim in sims:
        for rid, rec in sim.ground_truth()["requests"].items():
            if rid.startswith("agentmix-"):
                seen[rid] = (sim.base_url, rec)
    recs = [r for r in res.records if not r.warmup]
    assert recs and len(seen) == len(recs)
    by_session: dict[int, set[tuple[str, str | None, str | None]]] = {}
    for r in recs:
        target, rec = seen[f"agentmix-s{r.session}-t{r.turn}"]
        assert r.status.value == "ok" and (r.target, r.model) == (target, rec["model"])
        assert rec["session"] == f"agentmix-s{r.session}"
        assert r.session is not None
        by_session.setdefault(r.session, set()).add((target, rec["model"], rec["session"]))
    assert len(by_session) >= 2 and all(len(v) == 1 for v in by_session.values())


def test_a_key_bound_to_one_target_is_sent_to_neither(
    lab: Lab, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """``--api-key-env`` bound to the first simulator only: a run that also names the second
    exits 2 naming it, and neither simulator sees a request; bound to both, it runs."""
    if not lab.db_url.startswith("sqlite"):
        pytest.skip("no storage involved")
    a, b = lab.urls
    var = "TOKENTRACE_TARGET_KEY_MIXLAB"
    monkeypatch.setenv(var, "sk-mixlab")
    monkeypatch.setenv(var + "_TARGETS", a)
    before = [len(s.ground_truth()["requests"]) for s in lab.sims]
    assert cli_main([*cli_args(lab), "--api-key-env", var]) == 2
    err = capsys.readouterr().err
    assert "--api-key-env" in err and f"may not be sent to {b}" in err, err
    assert [len(s.ground_truth()["requests"]) for s in lab.sims] == before
    monkeypatch.setenv(var + "_TARGETS", f"{a},{b}")
    assert cli_main([*cli_args(lab), "--api-key-env", var]) == 0
    check_run(lab, json.loads(capsys.readouterr().out)["run_id"], planned=26)
