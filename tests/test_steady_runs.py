"""The steady window of real runs on the simulator (closed and open loop): the window
against one found by brute force from the stored requests (plain Python, not the module's
sweep), its figures against the requests counted by hand, and where it shows: the JSON
report, the run page (its section, the shaded charts), compare ``?basis=steady`` and the
sweep's steady basis."""

from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import dataclass
from itertools import pairwise

import pytest
from fastapi.testclient import TestClient

from app.analysis.metric_defs import REQUEST_THROUGHPUT, TTFT
from app.client.spec import RunSpec
from app.client.sweep_plan import SweepPlan
from app.services import compare as compare_svc
from app.services.errors import Invalid
from app.services.runs import execute_bench, open_database, run_report
from app.services.sweeps import execute_sweep, sweep_summary
from app.storage import repository as repo
from app.storage.db import session_scope
from app.targets.sim_config import SimConfig
from app.targets.simulator import start_simulator_thread
from tests.api_support import api_client
from tests.web_support import web_app

GAP_NS = 10_000_000


@dataclass(frozen=True)
class Lab:
    url: str
    sessions: object
    closed: str  # run ids
    closed2: str
    opened: str
    sweep: str


@pytest.fixture(scope="module")
def lab(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Lab]:
    tmp = tmp_path_factory.mktemp("steady")
    url = f"sqlite:///{tmp / 'steady.db'}"
    sessions = open_database(url)
    sim = start_simulator_thread(SimConfig(ttft_ms=5, itl_ms=4, output_len=8, seed=2))
    try:
        base = dict(
            base_url=sim.base_url, model="tokentrace-sim", input_len=8, output_len=8, seed=1,
            scrape_metrics=False,
        )  # fmt: skip
        closed = RunSpec(**base, num_prompts=24, max_concurrency=4)  # type: ignore[arg-type]
        opened = RunSpec(**base, num_prompts=60, request_rate=40.0, arrival="constant")  # type: ignore[arg-type]
        ids = [
            execute_bench(spec, sessions=sessions).run_id  # type: ignore[arg-type]
            for spec in (closed, closed, opened)
        ]
        sweep = execute_sweep(
            RunSpec(**base, num_prompts=12),  # type: ignore[arg-type]
            SweepPlan("concurrencies", (2.0, 4.0)),
            sessions=sessions,  # type: ignore[arg-type]
        )
    finally:
        sim.stop()
    assert all(ids)
    yield Lab(url, sessions, str(ids[0]), str(ids[1]), str(ids[2]), sweep.sweep_id)


def _requests(lab: Lab, run_id: str) -> list[tuple[int, int]]:
    with session_scope(lab.sessions) as s:  # type: ignore[arg-type]
        recs = repo.load_records(s, run_id)
    return [(r.sent_ns, r.end_ns) for r in recs if not r.warmup and r.sent_ns is not None]  # type: ignore[misc]


def _brute_longest(breaks: list[int], count: object, ok: object) -> tuple[int, int] | None:
    """The longest union of segments between consecutive ``breaks`` where ``ok(count(t))``
    at the segment's start, joined across failing gaps of at most 10 ms."""
    pts = sorted(set(breaks))
    segs = [(a, b) for a, b in pairwise(pts) if ok(count(a))]  # type: ignore[operator]
    best: tuple[int, int] | None = None
    cur: list[int] | None = None
    for a, b in segs:
        if cur is not None and a - cur[1] <= GAP_NS:
            cur[1] = b
        else:
            cur = [a, b]
        if best is None or cur[1] - cur[0] > best[1] - best[0]:
            best = (cur[0], cur[1])
    return best


def test_closed_loop_window_by_brute_force(lab: Lab) -> None:
    reqs = _requests(lab, lab.closed)
    found = _brute_longest(
        [t for r in reqs for t in r],
        lambda t: sum(1 for s, e in reqs if s <= t < e),
        lambda n: n >= 0.9 * 4,
    )
    report = run_report(lab.sessions, lab.closed)  # type: ignore[arg-type]
    steady = report["steady"]
    assert found is not None
    assert (steady["window"]["start_ns"], steady["window"]["end_ns"]) == found
    inside = [(s, e) for s, e in reqs if found[0] <= s <= found[1]]
    assert steady["requests"] == len(inside)
    dur = (found[1] - found[0]) / 1e9
    assert steady["metrics"][REQUEST_THROUGHPUT.key] == pytest.approx(len(inside) / dur)
    assert steady["metrics"]["requests"]["completed_ok"] == len(inside)


def test_open_loop_window_by_brute_force(lab: Lab) -> None:
    reqs = _requests(lab, lab.opened)
    sends = [s for s, _ in reqs]
    w = round(50 / 40.0 * 1e9)  # 50 arrivals at the asked 40 req/s
    found = _brute_longest(
        sends + [s + w for s in sends],
        lambda t: sum(1 for s in sends if s <= t < s + w),
        lambda n: 0.9 * 50 <= n <= 1.1 * 50,
    )
    steady = run_report(lab.sessions, lab.opened)["steady"]  # type: ignore[arg-type]
    assert found is not None
    assert (steady["window"]["start_ns"], steady["window"]["end_ns"]) == found
    assert steady["window"]["kind"] == "rate" and steady["window"]["target"] == 40.0
    assert steady["requests"] == sum(1 for s in sends if found[0] <= s <= found[1])


def test_run_page_report_and_charts_show_it(lab: Lab) -> None:
    steady = run_report(lab.sessions, lab.closed)["steady"]  # type: ignore[arg-type]
    w = steady["window"]
    with TestClient(web_app(lab.url)) as c:
        html = c.get(f"/runs/{lab.closed}").text
        assert 'id="steady-table"' in html
        assert f'<span id="steady-start">{w["start_s"]:.3f}</span>' in html
        assert f'<span id="steady-requests">{steady["requests"]}</span>' in html
        assert f'data-metric="{REQUEST_THROUGHPUT.key}"' in html
        body = c.get(f"/runs/{lab.closed}/report.json").json()
        assert body["steady"]["window"] == json.loads(json.dumps(w))
    with session_scope(lab.sessions) as s:  # type: ignore[arg-type]
        from app.services import run_summaries

        summary = run_summaries.fresh_summary(s, lab.closed)
    assert summary is not None
    for key in ("timeline", "throughput"):
        shapes = json.loads(summary.figures[key])["layout"]["shapes"]
        assert shapes[-1]["x0"] == pytest.approx(w["start_s"], abs=1e-6)
        assert shapes[-1]["x1"] == pytest.approx(w["end_s"], abs=1e-6)


def test_compare_and_sweeps_on_the_steady_basis(lab: Lab) -> None:
    out = compare_svc.compare_runs(lab.sessions, lab.closed, [lab.closed2], basis="steady")  # type: ignore[arg-type]
    assert out["basis"] == "steady"
    whole = compare_svc.load_samples(lab.sessions, lab.closed)  # type: ignore[arg-type]
    st = compare_svc.load_samples(lab.sessions, lab.closed, basis="steady")  # type: ignore[arg-type]
    n_steady = run_report(lab.sessions, lab.closed)["steady"]["requests"]  # type: ignore[arg-type]
    ttft = TTFT.key
    assert st.samples_ms[ttft].size == n_steady < whole.samples_ms[ttft].size
    assert st.report["basis"] == "steady"
    summ = sweep_summary(lab.sessions, lab.sweep, steady=True)  # type: ignore[arg-type]
    assert summ["basis"] == "steady"
    with TestClient(web_app(lab.url)) as c:
        html = c.get(f"/compare?ids={lab.closed}&ids={lab.closed2}&basis=steady").text
        assert "<b>Steady windows:</b>" in html and 'id="overall-verdict"' in html
        assert "basis=run" in html  # the toggle back
        html = c.get(f"/compare?ids={lab.closed}&ids={lab.closed2}").text
        assert "<b>Steady windows:</b>" not in html and "basis=steady" in html
        assert 'id="steady-basis"' in c.get(f"/sweeps/{lab.sweep}?steady=1").text
        page = c.get(f"/sweeps/{lab.sweep}").text
        assert 'id="steady-basis"' not in page and "?steady=1" in page
    for step in summ["steps"]:
        rep = run_report(lab.sessions, step["run_id"])  # type: ignore[arg-type]
        if rep["steady"]["window"] is not None:
            want = rep["steady"]["metrics"][REQUEST_THROUGHPUT.key]
            assert step["request_throughput_rps"] == pytest.approx(want)


def test_bad_basis_is_422_naming_it(lab: Lab, sqlite_url: str) -> None:
    with api_client(sqlite_url) as api:
        r = api.client.get("/api/v1/compare/x?ids=y&basis=bogus", headers=api.h(api.read))
        assert r.status_code == 422 and "basis" in r.text
    # a run without a steady window (no fixed load asked: all at once): 422 naming basis
    with pytest.raises(Invalid) as e:
        compare_svc._steady(
            {"id": "r"},
            {"steady": {"window": None, "reason": "no"}},
            None,  # type: ignore[arg-type]
        )
    assert e.value.loc == ("query", "basis")
