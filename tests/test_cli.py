"""The command line end to end: real SQLite file, real simulator over loopback."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest
from sqlalchemy import create_engine, inspect, text

from app.cli.main import main
from app.targets.sim_config import SimConfig
from app.targets.simulator import start_simulator_thread

EXAMPLE_B = """request_id,start_ts,first_token_ts,end_ts,input_tokens,output_tokens
r1,0.00,0.42,3.10,1024,80
r2,0.15,0.71,4.36,4096,96
r3,0.40,0.88,2.92,512,64
"""


@pytest.fixture
def db(tmp_path: Path) -> str:
    return f"sqlite:///{tmp_path / 'cli.db'}"


@pytest.fixture(scope="module")
def sim() -> Iterator[str]:
    handle = start_simulator_thread(SimConfig(ttft_ms=20, itl_ms=2, seed=3))
    try:
        yield handle.base_url
    finally:
        handle.stop()


def _count_runs(url: str) -> int:
    eng = create_engine(url)
    try:
        if "runs" not in inspect(eng).get_table_names():
            return 0
        with eng.connect() as c:
            return int(c.execute(text("select count(*) from runs")).scalar_one())
    finally:
        eng.dispose()


def _json_out(capsys: pytest.CaptureFixture[str]) -> dict:  # type: ignore[type-arg]
    out = capsys.readouterr().out
    return json.loads(out)  # type: ignore[no-any-return]


def test_bench_saves_run_and_report_is_consistent(
    sim: str, db: str, capsys: pytest.CaptureFixture[str]
) -> None:
    rc = main(
        [
            "bench",
            "--base-url",
            sim,
            "--model",
            "sim",
            "--endpoint",
            "chat",
            "--num-prompts",
            "12",
            "--input-len",
            "32",
            "--output-len",
            "16",
            "--seed",
            "7",
            "--request-rate",
            "200",
            "--goodput",
            "ttft:1000",
            "e2el:5000",
            "--database-url",
            db,
            "--json",
        ]
    )
    assert rc == 0
    rep = _json_out(capsys)
    assert rep["run_id"]
    assert rep["clock_source"] in ("kernel", "userspace")
    m = rep["metrics"]
    assert m["requests"]["completed_ok"] == 12 and m["requests"]["failed"] == 0
    assert m["ttft_ms"]["count"] == 12
    assert m["tpot_ms"]["count"] == 12
    assert m["itl_ms"]["count"] == 12 * 15  # n-1 per-token gaps per request
    # the simulator's TTFT is 20 ms plus per-token costs; the client cannot see less
    assert m["ttft_ms"]["p50"] >= 20.0
    assert rep["spec"]["seed"] == 7 and rep["slos_ms"] == {"ttft": 1000.0, "e2el": 5000.0}
    assert "api_key" not in rep["spec"]

    # the saved report reproduces the same figures from the stored event log
    assert main(["report", rep["run_id"], "--json", "--database-url", db]) == 0
    again = _json_out(capsys)
    assert again["metrics"]["ttft_ms"] == m["ttft_ms"]
    assert again["metrics"]["itl_ms"]["count"] == m["itl_ms"]["count"]

    assert main(["runs", "--json", "--database-url", db]) == 0
    runs = _json_out(capsys)
    assert [r["id"] for r in runs] == [rep["run_id"]]
    assert runs[0]["summary"]["completed"] == 12


def test_bench_profile_and_table_output(
    sim: str, db: str, capsys: pytest.CaptureFixture[str]
) -> None:
    rc = main(
        [
            "bench",
            "--base-url",
            sim,
            "--model",
            "sim",
            "--endpoint",
            "completions",
            "--num-prompts",
            "4",
            "--input-len",
            "8",
            "--output-len",
            "6",
            "--database-url",
            db,
            "--profile",
            "vllm",
        ]
    )
    assert rc == 0
    out = capsys.readouterr().out
    assert "TTFT" in out and "vllm" in out


@pytest.mark.parametrize(
    ("args", "flag"),
    [
        (["--input-len", "0"], "--input-len"),
        (["--request-rate", "fast"], "--request-rate"),
        (["--goodput", "ttft=5"], "--goodput"),
        (["--goodput", "latency:5"], "--goodput"),
        (["--endpoint", "moderations"], "--endpoint"),
        (["--max-concurrency", "0"], "--max-concurrency"),
        (["--extra-body", "[1]"], "--extra-body"),
        (["--dataset-name", "jsonl"], "--dataset"),
        (["--header", "Authorization: Bearer x"], "--header"),
        (["--ramp-up-strategy", "linear"], "--ramp-up-strategy"),
        (["--top-p", "0"], "--top-p"),
    ],
)
def test_bad_bench_arguments_exit_2_and_write_nothing(
    args: list[str], flag: str, db: str, capsys: pytest.CaptureFixture[str]
) -> None:
    base = ["bench", "--base-url", "http://127.0.0.1:9", "--model", "m", "--database-url", db]
    assert main(base + args) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and flag in err[0]
    assert _count_runs(db) == 0


def test_bad_url_is_rejected(db: str, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["bench", "--base-url", "ftp://x", "--model", "m", "--database-url", db]) == 2
    assert "--base-url" in capsys.readouterr().err


def test_unreachable_target_is_a_failed_run(db: str, capsys: pytest.CaptureFixture[str]) -> None:
    rc = main(
        [
            "bench",
            "--base-url",
            "http://127.0.0.1:9",
            "--model",
            "m",
            "--num-prompts",
            "3",
            "--output-len",
            "4",
            "--request-timeout",
            "5",
            "--database-url",
            db,
            "--json",
        ]
    )
    assert rc == 1
    rep = _json_out(capsys)
    assert rep["metrics"]["requests"]["failed"] == 3 and rep["metrics"]["error_rate"] == 1.0
    assert rep["metrics"]["ttft_ms"]["count"] == 0  # no data, not zero
    assert rep["status"] == "failed"


def test_import_csv_worked_example_b(
    tmp_path: Path, db: str, capsys: pytest.CaptureFixture[str]
) -> None:
    f = tmp_path / "requests.csv"
    f.write_text(EXAMPLE_B)
    assert main(["import", "csv", str(f), "--json", "--database-url", db]) == 0
    run_id = _json_out(capsys)["runs"][0]
    assert main(["report", run_id, "--json", "--database-url", db]) == 0
    rep = _json_out(capsys)
    m = rep["metrics"]
    assert m["ttft_ms"]["p50"] == pytest.approx(480.0)
    assert m["ttft_ms"]["p95"] == pytest.approx(552.0)
    assert m["window"]["duration_s"] == pytest.approx(4.36)
    assert m["output_throughput_tok_s"] == pytest.approx(240 / 4.36)
    assert round(m["output_throughput_tok_s"], 2) == 55.05
    assert rep["validity"]["summary_only"] is True
    assert m["itl_ms"]["count"] == 0


@pytest.mark.parametrize(
    ("row", "needle"),
    [
        ("r4,1.0,0.5,2.0,10,5", "row 4"),
        ("r4,1.0,1.5,1.2,10,5", "row 4"),
        ("r4,1.0,1.5,2.0,10,0", "row 4"),
        ("r4,1.0,abc,2.0,10,5", "first_token_ts"),
    ],
)
def test_import_csv_bad_row_rejected_whole(
    tmp_path: Path, db: str, row: str, needle: str, capsys: pytest.CaptureFixture[str]
) -> None:
    f = tmp_path / "bad.csv"
    f.write_text(EXAMPLE_B + row + "\n")
    assert main(["import", "csv", str(f), "--database-url", db]) == 2
    err = capsys.readouterr().err.strip()
    assert needle in err and len(err.splitlines()) == 1
    assert _count_runs(db) == 0


def test_report_unknown_run(db: str, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["report", "nope", "--database-url", db]) == 2
    assert "nope" in capsys.readouterr().err


def test_runs_empty_state(db: str, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["runs", "--database-url", db]) == 0
    assert "No runs yet" in capsys.readouterr().out


def test_bench_replays_a_trace_and_reports_its_lateness(
    sim: str, db: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    rows = [
        {"timestamp": t, "input_length": 600, "output_length": 4, "hash_ids": ids}
        for t, ids in ((0, [1, 2]), (30, [1, 3]), (60, [1, 2]), (90, [4, 5]))
    ]
    trace = tmp_path / "trace.jsonl"
    trace.write_text("".join(json.dumps(r) + "\n" for r in rows))
    base = ["bench", "--base-url", sim, "--model", "sim", "--database-url", db]
    args = ["--dataset-name", "mooncake", "--dataset-path", str(trace), "--num-prompts", "4"]
    assert main([*base, *args, "--trace-speedup", "3", "--no-scrape-metrics", "--json"]) == 0
    rep = _json_out(capsys)
    load = rep["load"]
    assert rep["spec"]["dataset_options"] == {"speedup": 3.0}
    # blocks 1 2 | 1 3 | 1 2 | 4 5: 8 blocks, 1 seen again twice and 2 once: 3/8
    assert load["workload"]["prefix_reuse_ratio"] == 3 / 8
    assert load["trace_lateness_ms"]["n"] == 4
    assert main(["report", rep["run_id"], "--database-url", db]) == 0
    out = capsys.readouterr().out
    assert "arrival lateness vs the trace p50" in out and "trace prefix reuse 37.5%" in out
    assert main([*base, *args, "--request-rate", "4"]) == 2
    assert "--request-rate: the dataset 'mooncake'" in capsys.readouterr().err
