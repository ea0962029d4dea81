"""An agent trace's per-session and per-depth figures (app.analysis.agent_sessions) against
numbers computed by hand on a small DAG, and the CLI's run end to end with storage."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from app.analysis.agent_sessions import (
    AgentRow,
    critical_path_ns,
    depth_table,
    session_table,
    start_lags,
)
from app.domain import AgentLink

MS = 1_000_000
FIXTURES = Path(__file__).parent / "fixtures"


def _row(i: int, ready: int, sent: int, end: int, ttft: float, parents: tuple[int, ...],
         depth: int, delay: int, ok: bool = True) -> AgentRow:  # fmt: skip
    link = AgentLink(parents, depth, delay * MS)
    return AgentRow(i, 0, ready * MS, sent * MS, end * MS, ok, ttft * MS, link)


# A -> (B, C) -> D, times in ms (session start 0):
#   A: ready 0, sent 1, end 11, TTFT 3
#   B: delay 2 -> ready 13, sent 14, end 20, TTFT 2
#   C: delay 5 -> ready 16, sent 16, end 30, TTFT 4
#   D: delay 1 -> ready 31 (C's end 30 + 1), sent 33, end 40, TTFT 1
DAG = [
    _row(10, 0, 1, 11, 3, (), 0, 0),
    _row(11, 13, 14, 20, 2, (10,), 1, 2),
    _row(12, 16, 16, 30, 4, (10,), 1, 5),
    _row(13, 31, 33, 40, 1, (11, 12), 2, 1),
]


def test_session_figures_by_hand() -> None:
    # critical path: A 10; B 10+2+6 = 18; C 10+5+14 = 29; D max(18, 29)+1+7 = 37
    assert critical_path_ns(DAG) == 37 * MS
    (row,) = session_table(DAG)
    assert row["requests"] == 4 and row["ok"] == 4 and row["max_depth"] == 2
    assert row["wall_ms"] == pytest.approx(40.0)  # D's end - the session's start
    assert row["critical_path_ms"] == pytest.approx(37.0)
    # queueing: (sent - ready) + TTFT = (1+3) + (1+2) + (0+4) + (2+1) = 14
    assert row["queueing_ms"] == pytest.approx(14.0)
    # generation: duration - TTFT = (10-3) + (6-2) + (14-4) + (7-1) = 27
    assert row["generation_ms"] == pytest.approx(27.0)
    assert row["queueing_share"] == pytest.approx(14 / 41)


def test_failed_requests_leave_queueing_and_generation_but_not_the_path() -> None:
    rows = [*DAG[:3], _row(13, 31, 33, 35, float("nan"), (11, 12), 2, 1, ok=False)]
    (row,) = session_table(rows)
    assert row["ok"] == 3
    assert row["queueing_ms"] == pytest.approx(11.0) and row["generation_ms"] == pytest.approx(21)
    assert row["critical_path_ms"] == pytest.approx(29 + 1 + 2)  # D's 2 ms still count
    # a root delayed 5 ms: the session started 5 ms before its ready time
    late = [_row(20, 5, 5, 9, 1, (), 0, 5)]
    assert session_table(late)[0]["wall_ms"] == pytest.approx(9.0)


def test_depth_table_and_start_lags_by_hand() -> None:
    depths = {r["depth"]: r for r in depth_table(DAG)}
    assert depths[0]["ttft"] == {"n": 1, "mean": 3.0, "p50": 3.0, "p99": 3.0}
    d1 = depths[1]["ttft"]
    assert d1["n"] == 2 and d1["mean"] == pytest.approx(3.0) and d1["p50"] == pytest.approx(3.0)
    assert d1["p99"] == pytest.approx(2 + 0.99 * 2)  # linear between 2 and 4
    assert depths[2]["ttft"]["mean"] == pytest.approx(1.0)
    # B: 14 - 11 - 2 = 1; C: 16 - 11 - 5 = 0; D: 33 - max(20, 30) - 1 = 2
    assert sorted(start_lags(DAG)) == [0, 1 * MS, 2 * MS]


def test_cli_agentic_run_end_to_end_with_storage(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from app.cli.main import main
    from app.services.runs import open_database
    from app.storage import repository as repo
    from app.storage.db import session_scope
    from app.targets.sim_config import SimConfig
    from app.targets.simulator import start_simulator_thread

    db = f"sqlite:///{tmp_path / 'a.db'}"
    sim = start_simulator_thread(SimConfig(ttft_ms=4, itl_ms=1, seed=2))
    try:
        args = ["bench", "--base-url", sim.base_url, "--model", "sim", "--dataset-name"]
        args += ["agentic", "--dataset-path", str(FIXTURES / "agent_trace.jsonl")]
        args += ["--trace-speedup", "4", "--database-url", db, "--no-scrape-metrics"]
        assert main([*args, "--json"]) == 0
        rep = json.loads(capsys.readouterr().out)
        assert rep["metrics"]["requests"]["completed_ok"] == 7
        tables = rep["load"]["agent_sessions"]
        with session_scope(open_database(db)) as s:
            stored = [r for r in repo.load_records(s, rep["run_id"]) if not r.warmup]
        # the stored requests keep their session, parents, depth and delay (metric_values)
        assert sorted((r.session, r.turn) for r in stored) == [(0, t) for t in range(1, 6)] + [
            (1, 1),
            (1, 2),
        ]
        links = {(r.session, r.turn): r.agent for r in stored}
        assert all(link is not None for link in links.values())
        join = links[(0, 5)]
        assert join is not None and join.depth == 3 and join.delay_ns == 15 * MS // 4
        # the run's session table, recomputed from the stored records' times
        for row in tables["sessions"]:
            mine = [r for r in stored if r.session == row["session"]]
            start = min(
                r.scheduled_ns - r.agent.delay_ns for r in mine if r.agent and not r.agent.parents
            )
            wall = (max(r.end_ns or 0 for r in mine) - start) / MS
            assert row["wall_ms"] == pytest.approx(wall)
            assert row["requests"] == len(mine) and row["ok"] == len(mine)
        assert [d["depth"] for d in tables["depths"]] == [0, 1, 2, 3]
        assert [d["requests"] for d in tables["depths"]] == [2, 2, 2, 1]
        # the stored run's report prints the session and depth tables
        assert main(["report", rep["run_id"], "--database-url", db]) == 0
        printed = capsys.readouterr().out
        assert "Agent sessions" in printed and "TTFT by depth" in printed
        # the spec refuses a non-conversation surface: exit 2 naming the flag
        assert main([*args, "--endpoint", "completions"]) == 2
        captured = capsys.readouterr()
        assert "endpoint must be 'chat'" in captured.out + captured.err
        # a bad trace: exit 2 naming the line and field, nothing sent
        bad = tmp_path / "bad.jsonl"
        bad.write_text(
            '{"session_id": "s", "request_id": "a", "parent_ids": ["a"], "prompt": "x"}\n'
        )
        sim.reset()
        bad_args = [*args[:6], "agentic", "--dataset-path", str(bad), "--database-url", db]
        assert main([*bad_args, "--no-scrape-metrics"]) == 2
        captured = capsys.readouterr()
        assert "line 1: 'parent_ids': a cycle" in captured.out + captured.err
        assert sim.ground_truth()["requests"] == {}
    finally:
        sim.stop()


def test_swim_lanes_put_parallel_branches_on_lanes_of_their_own() -> None:
    from app.figures.agents import lanes, session_timeline

    lane = lanes(DAG)
    # B (sent 14, ends 20) and C (sent 16) overlap at depth 1: two lanes
    assert lane == {10: "depth 0", 11: "depth 1", 12: "depth 1.2", 13: "depth 2"}
    fig = session_timeline(DAG, "session 0", {10: "#1"})
    bars = next(t for t in fig["data"] if t["name"] == "sent → end")
    # a bar per request from its send to its end, ms from the session's start
    assert bars["base"] == [1.0, 14.0, 16.0, 33.0] and bars["x"] == [10.0, 6.0, 14.0, 7.0]
    waits = next(t for t in fig["data"] if t["name"] == "ready → sent")
    assert waits["base"] == [0.0, 13.0, 31.0] and waits["x"] == [1.0, 1.0, 2.0]
    assert fig["layout"]["yaxis"]["categoryarray"] == ["depth 2", "depth 1.2", "depth 1", "depth 0"]


def test_run_page_shows_the_session_table_and_timeline(tmp_path: Path) -> None:
    import re

    from fastapi.testclient import TestClient

    from app.services.runs import open_database
    from app.targets.sim_config import SimConfig
    from tests.web_support import bench, web_app

    url = f"sqlite:///{tmp_path / 'w.db'}"
    run_id = bench(
        open_database(url), SimConfig(ttft_ms=3, itl_ms=1, seed=1), "agents",
        dataset="agentic", dataset_path=str(FIXTURES / "agent_trace.jsonl"), num_prompts=None,
        request_rate=float("inf"), output_len=4, scrape_metrics=False,
    )  # fmt: skip
    with TestClient(web_app(url)) as c:
        page = c.get(f"/runs/{run_id}")
        assert page.status_code == 200, page.text[:300]
        text = page.text
        assert 'id="agent-session-table"' in text and 'id="agent-depth-table"' in text
        assert re.search(r'<tr data-session="0"[^>]*>', text)
        assert 'id="plot-agent_timeline"' in text
        fig = json.loads(re.search(r'id="fig-agent_timeline">(.*?)</script>', text, re.S)[1])
        bars = next(t for t in fig["data"] if t["name"] == "sent → end")
        # the slowest session is drawn by default: session 0, five requests
        assert len(bars["base"]) == 5 and "session 0" in fig["layout"]["title"]["text"]
        other = c.get(f"/runs/{run_id}?agent_session=1").text
        fig1 = json.loads(re.search(r'id="fig-agent_timeline">(.*?)</script>', other, re.S)[1])
        assert "session 1" in fig1["layout"]["title"]["text"]
