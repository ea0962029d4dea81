"""``tokentrace`` and series, end to end on a real SQLite file: ``bench/import/sweep
--series``, ``series list|show|create|add|remove|alert``, ``compare RUN --series`` (the
gate: exit 1 on a regression) and bad input (exit 2, one line, nothing changed)."""

from __future__ import annotations

import contextlib
import json
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from app.cli.main import main
from app.targets.sim_config import SimConfig
from app.targets.simulator import start_simulator_process, start_simulator_thread
from tests.series_support import csv_text, p99, shifted


@pytest.fixture(scope="module")
def sim() -> Iterator[str]:
    handle = start_simulator_thread(SimConfig(ttft_ms=8, itl_ms=1, seed=3))
    try:
        yield handle.base_url
    finally:
        handle.stop()


def _json(capsys: pytest.CaptureFixture[str]) -> Any:
    return json.loads(capsys.readouterr().out)


def _error_line(capsys: pytest.CaptureFixture[str]) -> str:
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1, err
    return err[0]


def _import(tmp: Path, db: str, name: str, ttfts: list[float], series: str | None) -> None:
    f = tmp / f"{name}.csv"
    f.write_text(csv_text(ttfts))
    args = ["import", "csv", str(f), "--name", name, "--json", "--database-url", db]
    assert main([*args, *(["--series", series] if series else [])]) == 0


def test_import_show_and_gate(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    db = f"sqlite:///{tmp_path / 'cli.db'}"
    ttfts = shifted(12, 9, seed=8)
    ids = []
    for i, t in enumerate(ttfts):
        _import(tmp_path, db, f"n{i}", t, "nightly-x")
        ids += _json(capsys)["runs"]
    assert main(["series", "list", "--json", "--database-url", db]) == 0
    (item,) = _json(capsys)
    assert item["name"] == "nightly-x" and item["states"] == {"member": 12}
    assert main(["series", "show", "nightly-x", "--metric", "ttft:p99", "--json",
                 "--database-url", db]) == 0  # fmt: skip
    shown = _json(capsys)
    points = shown["trend"]["points"]
    assert [p["value"] for p in points] == pytest.approx([p99(t) for t in ttfts], abs=1e-3)
    (cp,) = shown["trend"]["change_points"]
    assert cp["index"] == 9 and cp["run_after"] == points[9]["run_id"]
    last = points[-1]["run_id"]
    assert [p["run_id"] for p in points] == ids
    assert main(["series", "show", "nightly-x", "--database-url", db]) == 0
    text = capsys.readouterr().out
    assert "change point" in text and "regression" in text and "E-Divisive" in text
    # the gate: the newest run against its segment (after the change point): fine
    assert main(["compare", last, "--series", "nightly-x", "--metric", "ttft:p99",
                 "--database-url", db]) == 0  # fmt: skip
    capsys.readouterr()
    # the first run after the change, against the runs before it: regressed (exit 1)
    first_after = points[9]["run_id"]
    assert main(["compare", first_after, "--series", "--metric", "ttft:p99", "--json",
                 "--database-url", db]) == 1  # fmt: skip
    gate = _json(capsys)
    assert gate["verdict"] == "regressed" and gate["series"] == "nightly-x"
    ref = sorted(p99(t) for t in ttfts[:9])
    assert gate["results"][0]["reference"] == pytest.approx(ref[4], abs=1e-3)


def test_add_remove_alert_and_bad_input(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    db = f"sqlite:///{tmp_path / 'cli.db'}"
    _import(tmp_path, db, "free", [50.0, 60.0, 70.0], None)
    run_id = _json(capsys)["runs"][0]
    assert main(["series", "create", "s1", "--on-mismatch", "refuse", "--json",
                 "--database-url", db]) == 0  # fmt: skip
    assert _json(capsys)["on_mismatch"] == "refuse"
    assert main(["series", "add", "s1", run_id, "--json", "--database-url", db]) == 0
    assert _json(capsys)["state"] == "member"
    assert main(["series", "remove", "s1", run_id, "--json", "--database-url", db]) == 0
    assert _json(capsys)["series"] is None
    assert main(["series", "remove", "s1", run_id, "--database-url", db]) == 2
    assert "is not in series 's1'" in _error_line(capsys)
    for bad in ("bad name", "x" * 101, "a/b"):
        assert main(["series", "show", bad, "--database-url", db]) == 2
        assert "is not valid" in _error_line(capsys)
        f = tmp_path / "y.csv"
        f.write_text(csv_text([1.0]))
        assert main(["import", "csv", str(f), "--series", bad, "--database-url", db]) == 2
        assert _error_line(capsys).startswith("tokentrace import: error: --series:")
    assert main(["series", "show", "nope", "--database-url", db]) == 2
    assert "no series named 'nope'" in _error_line(capsys)
    for url, why in (
        ("http://169.254.169.254/x", "link-local"),
        ("http://127.0.0.1:8000/hook", "this dashboard itself"),
        ("file:///etc/passwd", "http://"),
    ):
        assert main(["series", "alert", "s1", "--webhook", url, "--database-url", db]) == 2
        assert why in _error_line(capsys)
    assert main(["series", "alert", "s1", "--metric", "ttft:p7", "--webhook",
                 "http://127.0.0.1:9/h", "--database-url", db]) == 2  # fmt: skip
    assert "statistic 'p7'" in _error_line(capsys)
    assert main(["series", "list", "--json", "--database-url", db]) == 0
    assert [(x["name"], x["alerts"], x["runs"]) for x in _json(capsys)] == [("s1", 0, 0)]


def test_bench_and_sweep_join_a_series(
    sim: str, tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("TOKENTRACE_SECRET_KEY_FILE", str(tmp_path / "key"))
    db = f"sqlite:///{tmp_path / 'cli.db'}"
    base = ["--base-url", sim, "--model", "tokentrace-sim", "--num-prompts", "4",
            "--input-len", "16", "--output-len", "4", "--database-url", db]  # fmt: skip
    assert main(["bench", *base, "--series", "no/slash"]) == 2
    assert _error_line(capsys).startswith("tokentrace bench: error: --series:")
    assert main(["runs", "--json", "--database-url", db]) == 0
    assert _json(capsys) == []  # nothing ran
    assert main(["bench", *base, "--request-rate", "50", "--series", "b1", "--json"]) == 0
    run_id = _json(capsys)["run_id"]
    assert main(["series", "show", "b1", "--json", "--database-url", db]) == 0
    shown = _json(capsys)
    # whether the client trusted its own run depends on this machine's load (a client-limited
    # run is untrusted): the membership is this test's subject, trust is tests/test_series_api's
    assert [(r["run_id"], r["state"]) for r in shown["runs"]] == [(run_id, "member")]
    assert shown["key"]["model"] == "tokentrace-sim" and shown["key_run_id"] == run_id
    sweep_args = ["--rates", "40", "80", "--min-ratio", "0.01", "--series", "sw1", "--json"]
    assert main(["sweep", *base, *sweep_args]) == 0
    sweep = _json(capsys)
    assert main(["series", "show", "sw1", "--json", "--database-url", db]) == 0
    shown = _json(capsys)
    assert shown["tracks"] == ["40 req/s", "80 req/s"]
    steps = [s["run_id"] for s in sweep["steps"]]
    assert sorted(r["run_id"] for r in shown["runs"]) == sorted(steps)
    assert {r["state"] for r in shown["runs"]} == {"member"}
    assert "sweep: rates 40, 80" in shown["key"]["load_shape"]


def _realtime(pid: int) -> None:
    """The simulator's loop at real-time priority where allowed (its answers' timing is what
    the series compares; a loaded machine would otherwise add its own noise)."""
    with contextlib.suppress(AttributeError, PermissionError, OSError):
        os.sched_setscheduler(pid, os.SCHED_FIFO, os.sched_param(1))


@pytest.mark.slow
def test_a_change_point_names_the_field_that_changed(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Twelve real runs against the simulator: six on engine 1.0 (TTFT ~5 ms), six on 2.0
    (~30 ms, another simulator: another target); the series lets the engine version vary,
    and with it the target, so all count (those the client trusts), and its change point sits
    at the first counted 2.0 run and says the engine version (and the target) changed."""
    monkeypatch.setenv("TOKENTRACE_SECRET_KEY_FILE", str(tmp_path / "key"))
    db = f"sqlite:///{tmp_path / 'cli.db'}"
    ids = []
    for version, ttft in (("1.0", 5.0), ("2.0", 30.0)):
        # the simulator in its own process (no GIL shared with the client whose trust
        # counts) and the load thread at real-time priority: a run's trust is the client's
        # own lag, which a loaded machine would otherwise give it
        with start_simulator_process(SimConfig(ttft_ms=ttft, itl_ms=1, seed=2)) as sim:
            _realtime(sim.pid)
            for _ in range(6):
                args = ["bench", "--base-url", sim.base_url, "--model", "tokentrace-sim",
                        "--num-prompts", "4", "--input-len", "8", "--output-len", "2",
                        "--engine", "sim", "--engine-version", version, "--series", "eng",
                        "--realtime", "--json", "--database-url", db]  # fmt: skip
                assert main(args) == 0
                ids.append(_json(capsys)["run_id"])
    assert main(["series", "show", "eng", "--metric", "ttft:p50", "--json",
                 "--database-url", db]) == 0  # fmt: skip
    t = _json(capsys)["trend"]
    assert [p["state"] for p in t["points"]] == ["member"] * 12
    # the change sits between the last counted 1.0 run and the first 2.0 run (a run the
    # client could not trust under the machine's load is shown but not counted)
    counted = [p["counted"] for p in t["points"]]
    before = max(i for i in range(6) if counted[i])
    after = min(i for i in range(6, 12) if counted[i])
    assert sum(counted[:6]) >= 3 and sum(counted[6:]) >= 3
    # real runs on a shared machine: a run slowed by other load can make a second, smaller
    # change within one version's runs; the engine's change is the one at the boundary and
    # the largest
    at = [c for c in t["change_points"] if c["index"] == after]
    assert len(at) == 1, t["change_points"]
    (cp,) = at
    for other in t["change_points"]:
        if other is not cp:
            assert abs(other["delta"]) < abs(cp["delta"]) / 2, t["change_points"]
            assert "engine_version" not in {f["field"] for f in other["changed_fields"]}
    assert (cp["index"], cp["run_before"], cp["run_after"]) == (after, ids[before], ids[after])
    assert cp["kind"] == "regression" and cp["delta"] == pytest.approx(cp["after"] - cp["before"])
    # each version ran on a simulator of its own: the target (its port) changed with it
    changed = {f["field"]: f for f in cp["changed_fields"]}
    assert set(changed) == {"engine_version", "target"}
    eng = changed["engine_version"]
    assert (eng["label"], eng["values"]) == ("engine version", ["1.0", "2.0"])
    # a run that cannot be trusted gets no verdict from the gate (exit 2, one line)
    from app.domain import RunStatus
    from app.services import series as series_svc
    from app.services.runs import open_database
    from app.storage import repository as repo
    from app.storage.db import session_scope

    sessions = open_database(db)
    with session_scope(sessions) as s:
        repo.finish_run(s, ids[-1], status=RunStatus.FAILED)
    series_svc.settle_run(sessions, ids[-1])
    assert main(["compare", ids[-1], "--series", "eng", "--database-url", db]) == 2
    assert "no verdict" in _error_line(capsys)
    assert main(["compare", ids[-1], "--series", "eng", "--allow-invalid",
                 "--database-url", db]) in (0, 1)  # fmt: skip
    assert "untrusted" in capsys.readouterr().out
