"""Comparisons know what changed (issue 24 item 10), on SQLite and PostgreSQL, against real
simulators on loopback: the target (URL and the server's identity) is a comparability
field, said when it differs and allowed as the variable under test; sweep comparisons take
the baseline the user picks (else the oldest, never the list order) and flag the steps
whose runs cannot be trusted. Expected values are built here by hand (URLs from the ports)
or recomputed from the raw per-request export."""

from __future__ import annotations

from dataclasses import dataclass, replace

import numpy as np
import pytest
from fastapi.testclient import TestClient
from sqlalchemy.orm import Session, sessionmaker

from app.services import baselines as baseline_svc
from app.services import compare as compare_svc
from app.services import compare_sets
from app.services.errors import Invalid
from app.services.exports import request_rows
from app.services.runs import open_database
from app.storage import compare_repo
from app.storage import repository as repo
from app.storage.db import session_scope
from app.targets.sim_config import SimConfig
from tests.live_server import free_port
from tests.web_support import bench, web_app

OK = {"num_prompts": 20, "client_lag_bound_ms": 1000.0}  # valid on a loaded test box
LIMITED = {"num_prompts": 20, "client_lag_bound_ms": 0.001}  # any lag: client-limited


@dataclass(frozen=True)
class Lab:
    url: str
    sessions: sessionmaker[Session]
    port: int  # the one server's port (its runs and sweeps)
    other_port: int  # another server, same configuration
    a1: str  # fast server, rate 50
    a2: str  # fast server, rate 100
    b1: str  # slow server (3x TTFT), rate 50
    b2: str  # slow server, rate 100, client-limited
    elsewhere: str  # fast configuration on another port, rate 50
    sweep_a: str  # [a1 @ 50, a2 @ 100], created first
    sweep_b: str  # [b1 @ 50, b2 @ 100]


def _target(port: int) -> str:
    """The target as a comparison shows it, built by hand: the simulator's URL, the engine
    its /metrics names (vLLM's series) and the model its /v1/models lists."""
    return f"http://127.0.0.1:{port} · vllm /metrics · serves tokentrace-sim"


def _sweep(sessions: sessionmaker[Session], name: str, steps: list[tuple[float, str]]) -> str:
    with session_scope(sessions) as s:
        sweep_id = compare_repo.create_sweep(
            s, spec={"model": "tokentrace-sim"}, mode="rates", loads=[x for x, _ in steps],
            name=name, status="succeeded",
        )  # fmt: skip
        for k, (load, run_id) in enumerate(steps):
            compare_repo.add_step(
                s, sweep_id, step_idx=k, run_id=run_id, load=load, load_kind="rate"
            )
    return sweep_id


def make_lab(url: str) -> Lab:
    sessions = open_database(url)
    port, other = free_port(), free_port()
    fast, slow = SimConfig(ttft_ms=20, itl_ms=1, seed=1), SimConfig(ttft_ms=60, itl_ms=1, seed=1)
    fast, slow = replace(fast, port=port), replace(slow, port=port)
    a1 = bench(sessions, fast, "a1", request_rate=50.0, **OK)
    a2 = bench(sessions, fast, "a2", request_rate=100.0, **OK)
    b1 = bench(sessions, slow, "b1", request_rate=50.0, **OK)
    b2 = bench(sessions, slow, "b2", request_rate=100.0, **LIMITED)
    elsewhere = bench(sessions, replace(fast, port=other), "elsewhere", request_rate=50.0, **OK)
    sweep_a = _sweep(sessions, "sweep A", [(50.0, a1), (100.0, a2)])
    sweep_b = _sweep(sessions, "sweep B", [(50.0, b1), (100.0, b2)])
    return Lab(url, sessions, port, other, a1, a2, b1, b2, elsewhere, sweep_a, sweep_b)


def _p50_ttft(sessions: sessionmaker[Session], run_id: str) -> float:
    """TTFT p50 (ms) of the run's successful measured requests, from the raw export."""
    rows = request_rows(sessions, run_id)
    ttft = [r["ttft_ms"] for r in rows if r["status"] == "ok" and not r["warmup"]]
    return float(np.percentile(np.array(ttft, np.float64), 50))


def test_target_and_sweep_baselines(db_url: str) -> None:
    lab = make_lab(db_url)
    _runs_against_different_targets(lab)
    _sweep_baseline_is_picked_and_untrusted_steps_are_flagged(lab)
    _the_api_takes_the_baseline(lab)
    _the_page_picks_labels_and_flags(lab)


def _runs_against_different_targets(lab: Lab) -> None:
    here, there = _target(lab.port), _target(lab.other_port)
    same = compare_svc.compare_runs(lab.sessions, lab.a1, [lab.b1])
    assert same["comparability"]["message"] == "same workload and setup: every key field matches"
    assert same["runs"][0]["key"]["target"]["url"] == f"http://127.0.0.1:{lab.port}"
    out = compare_svc.compare_runs(lab.sessions, lab.a1, [lab.elsewhere])
    comp = out["comparability"]
    assert [d["field"] for d in comp["differing"]] == ["target"]
    assert comp["differing"][0]["values"] == [here, there]
    assert comp["comparable"] and comp["variable"] == "target"
    assert comp["message"] == (
        f"one variable under test: target (URL and server identity); target differs: {here} "
        f"vs {there}"
    )
    # another variable under test: the target is an unexpected difference, named
    seed = compare_svc.compare_runs(lab.sessions, lab.a1, [lab.elsewhere], variable="seed")
    comp = seed["comparability"]
    assert not comp["comparable"] and comp["differing"][0]["expected"] is False
    assert f"target differs: {here} vs {there}" in comp["message"]
    assert comp["message"].startswith("not a one-variable comparison")
    # the same server restarted with another model list is another target at the same URL
    moved = SimConfig(ttft_ms=20, itl_ms=1, seed=1, port=lab.port, model="other-model")
    renamed = bench(lab.sessions, moved, "renamed", request_rate=50.0, **OK)
    diff = compare_svc.compare_runs(lab.sessions, lab.a1, [renamed])["comparability"]
    assert diff["differing"][0]["values"] == [
        here, f"http://127.0.0.1:{lab.port} · vllm /metrics · serves other-model"
    ]  # fmt: skip


def _sweep_baseline_is_picked_and_untrusted_steps_are_flagged(lab: Lab) -> None:
    # listed newest first: the oldest (A) is the baseline all the same
    out = compare_sets.compare_sweep_set(lab.sessions, [lab.sweep_b, lab.sweep_a])
    assert out["baseline"] == lab.sweep_a and out["baseline_chosen"] == "the oldest"
    (pair,) = out["comparisons"]
    assert (pair["baseline"], pair["candidate"]) == (lab.sweep_a, lab.sweep_b)
    first, second = pair["steps"]
    assert (first["baseline"], first["candidate"]) == (lab.a1, lab.b1)
    p50 = first["metrics"]["ttft_ms"]["percentiles"][0]
    assert p50["baseline"] == pytest.approx(_p50_ttft(lab.sessions, lab.a1), rel=1e-9)
    assert p50["candidate"] == pytest.approx(_p50_ttft(lab.sessions, lab.b1), rel=1e-9)
    assert first["metrics"]["ttft_ms"]["verdict"] == "regressed"  # 20 ms -> 60 ms
    # the client-limited step is judged and flagged, as run comparisons flag runs
    with session_scope(lab.sessions) as s:
        limited = {rid for rid in (lab.a1, lab.a2, lab.b1, lab.b2)
                   if repo.get_run(s, rid).client_limited}  # fmt: skip
    assert limited == {lab.b2}
    assert not first["untrusted"] and first["trust_issues"] == {}
    assert second["untrusted"] and list(second["trust_issues"]) == [lab.b2]
    assert "client-limited" in second["trust_issues"][lab.b2][0]
    assert pair["untrusted_loads"] == [100.0] and out["untrusted"] == {lab.sweep_b: [100.0]}
    # B picked as the baseline: the same step reads the other way
    picked = compare_sets.compare_sweep_set(
        lab.sessions, [lab.sweep_b, lab.sweep_a], baseline=lab.sweep_b
    )
    assert picked["baseline"] == lab.sweep_b and picked["baseline_chosen"] == "chosen"
    (pair,) = picked["comparisons"]
    step = pair["steps"][0]
    assert (step["baseline"], step["candidate"]) == (lab.b1, lab.a1)
    assert step["metrics"]["ttft_ms"]["verdict"] == "improved"
    assert step["metrics"]["ttft_ms"]["percentiles"][0]["baseline"] == pytest.approx(
        _p50_ttft(lab.sessions, lab.b1), rel=1e-9
    )
    assert pair["untrusted_loads"] == [100.0]
    with pytest.raises(Invalid, match="not one of the sweeps") as e:
        compare_sets.compare_sweep_set(lab.sessions, [lab.sweep_a, lab.sweep_b], baseline="x")
    assert e.value.loc == ("query", "baseline")
    # runs: the oldest too, or the one picked
    runs = compare_sets.compare_run_set(lab.sessions, [lab.b1, lab.a1])
    assert runs["baseline"] == lab.a1 and runs["baseline_chosen"] == "the oldest"
    assert runs["runs"][0]["trust_issues"] == []


def _the_api_takes_the_baseline(lab: Lab) -> None:
    with TestClient(web_app(lab.url)) as c:
        r = c.get(f"/api/v1/compare?sweeps={lab.sweep_b},{lab.sweep_a}")
        assert r.status_code == 200, r.text
        body = r.json()
        assert body["baseline"] == lab.sweep_a and body["baseline_chosen"] == "the oldest"
        assert body["comparisons"][0]["steps"][1]["untrusted"] is True
        r = c.get(f"/api/v1/compare?sweeps={lab.sweep_b}&sweeps={lab.sweep_a}"
                  f"&baseline={lab.sweep_b}")  # fmt: skip
        assert r.status_code == 200 and r.json()["baseline"] == lab.sweep_b
        assert r.json()["comparisons"][0]["steps"][0]["verdicts"]["ttft_ms"] == "improved"
        runs = c.get(f"/api/v1/compare?ids={lab.elsewhere},{lab.a1}&baseline={lab.elsewhere}")
        assert runs.status_code == 200 and runs.json()["baseline"] == lab.elsewhere
        assert "target differs" in runs.json()["comparability"]["message"]
        as_var = c.get(f"/api/v1/compare/{lab.a1}?ids={lab.elsewhere}&variable=target")
        assert as_var.json()["comparability"]["comparable"] is True
        for query, loc in (
            (f"sweeps={lab.sweep_a},{lab.sweep_b}&baseline=nope", "baseline"),
            (f"sweeps={lab.sweep_a}&ids={lab.a1}", "ids"),
            ("", "ids"),
            (f"sweeps={lab.sweep_a}", "sweeps"),
            ("sweeps=" + ",".join(f"s{i}" for i in range(7)), "sweeps"),  # before any read
            (f"ids={lab.a1},{lab.b1}&variable=colour", "variable"),
            (f"sweeps={lab.sweep_a},{lab.sweep_b}&variable=colour", "variable"),
        ):
            bad = c.get(f"/api/v1/compare?{query}")
            assert bad.status_code == 422, (query, bad.text)
            assert bad.json()["detail"][0]["loc"] == ["query", loc], (query, bad.json())
        assert c.get(f"/api/v1/compare?sweeps={lab.sweep_a},nope").status_code == 404


def _the_page_picks_labels_and_flags(lab: Lab) -> None:
    with TestClient(web_app(lab.url)) as c:
        html = c.get(f"/compare?sweeps={lab.sweep_b}&sweeps={lab.sweep_a}").text
        heading = html[html.index('id="sweep-compare-heading"') :]
        assert heading.index("sweep A") < heading.index("(baseline)") < heading.index("sweep B")
        assert f'id="sweep-base-{lab.sweep_a}" checked' in html
        assert f'<li data-run-id="{lab.b2}" data-load="100">' in html  # the banner
        assert 'data-untrusted="yes"' in html and 'data-untrusted="no"' in html
        assert "sweep A (baseline) p50" in html  # the legend's name
        picked = c.get(f"/compare?sweeps={lab.sweep_b}&sweeps={lab.sweep_a}&base={lab.sweep_b}")
        html = picked.text
        heading = html[html.index('id="sweep-compare-heading"') :]
        assert heading.index("sweep B") < heading.index("(baseline)") < heading.index("sweep A")
        assert "sweep B (baseline) p50" in html and "sweep A (baseline)" not in html
        runs = c.get(f"/compare?ids={lab.a1}&ids={lab.elsewhere}").text
        assert 'data-field="target"' in runs and "target differs" in runs
        # a saved sweep baseline picks the baseline too; a run baseline is refused by name
        with session_scope(lab.sessions) as s:
            baseline_svc.save(s, lab.sweep_b, "sweeps-main")
            baseline_svc.save(s, lab.a1, "run-main")
        saved = c.get(f"/compare?sweeps={lab.sweep_a}&sweeps={lab.sweep_b}&baseline=sweeps-main")
        heading = saved.text[saved.text.index('id="sweep-compare-heading"') :]
        assert heading.index("sweep B") < heading.index("(baseline)") < heading.index("sweep A")
        assert "baseline: saved baseline" in " ".join(heading.split())
        wrong = c.get(f"/compare?sweeps={lab.sweep_a}&sweeps={lab.sweep_b}&baseline=run-main")
        assert wrong.status_code == 422 and "no sweep baseline named" in wrong.text
