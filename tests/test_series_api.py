"""Named series over the REST API, on SQLite and PostgreSQL: runs join and settle, the
trend's values (recomputed with numpy from the imported logs) and intervals (the runs'
own), a known shift found at the right run and noise finding none, flag and refuse, moving
runs in and out, the gate, and bad input (422 naming the field, nothing changed)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from app.domain import RunStatus
from app.storage import repository as repo
from app.storage.db import session_scope
from tests.api_support import Api, api_client
from tests.series_support import import_run, p99, shifted

S = "/api/v1/series"


@pytest.fixture
def api(db_url: str) -> Any:
    with api_client(db_url) as a:
        yield a


def _series_of(api: Api, tmp: Path, name: str, ttfts: list[list[float]], **kw: Any) -> list[str]:
    ids = []
    for i, t in enumerate(ttfts):
        rid = import_run(api.sessions, tmp, t, name=f"{name}-{i}", **kw)
        r = api.client.post(f"{S}/{name}/runs", json={"run_id": rid}, headers=api.h(api.run))
        assert r.status_code == 200, r.text
        ids.append(rid)
    return ids


def test_trend_finds_the_shift_at_the_right_run(api: Api, tmp_path: Path) -> None:
    ttfts = shifted(14, 8)
    ids = _series_of(api, tmp_path, "nightly.a", ttfts)
    r = api.client.get(f"{S}/nightly.a/trend", params={"metric": "ttft:p99"})
    assert r.status_code == 200, r.text
    t = r.json()
    assert [p["run_id"] for p in t["points"]] == ids  # series order: the runs' creation
    for p, values in zip(t["points"], ttfts, strict=True):
        assert p["value"] == pytest.approx(p99(values), abs=1e-3)  # numpy, from the log
        assert p["ci_low"] <= p["value"] <= p["ci_high"]
        assert p["state"] == "member" and p["trusted"] and p["counted"]
    # each interval is the run's own, as its report gives it
    report = api.client.get(f"/api/v1/runs/{ids[3]}").json()["report"]
    assert [t["points"][3]["ci_low"], t["points"][3]["ci_high"]] == pytest.approx(
        report["metrics"]["ttft_ms"]["ci95"]["p99"]
    )
    (cp,) = t["change_points"]
    assert cp["index"] == 8 and cp["run_before"] == ids[7] and cp["run_after"] == ids[8]
    assert cp["kind"] == "regression" and cp["direction"] == "up"
    before = sorted(p99(v) for v in ttfts[:8])
    after = sorted(p99(v) for v in ttfts[8:])
    assert cp["before"] == pytest.approx((before[3] + before[4]) / 2, abs=1e-3)
    assert cp["after"] == pytest.approx((after[2] + after[3]) / 2, abs=1e-3)
    assert cp["changed_fields"] == []  # the same workload throughout
    detail = api.client.get(f"{S}/nightly.a", params={"metric": "ttft:p99"}).json()
    assert detail["verdict"]["run_id"] == ids[-1]
    assert detail["trend"]["change_points"] == t["change_points"]
    listed = api.client.get(S).json()["items"]
    assert [(x["name"], x["states"]) for x in listed] == [("nightly.a", {"member": 14})]


def test_noise_only_finds_no_change_point(api: Api, tmp_path: Path) -> None:
    _series_of(api, tmp_path, "quiet", shifted(12, None, seed=4))
    t = api.client.get(f"{S}/quiet/trend", params={"metric": "ttft:p50"}).json()
    assert len(t["points"]) == 12 and t["change_points"] == []


def test_flag_and_refuse_a_run_whose_key_differs(api: Api, tmp_path: Path) -> None:
    h = api.h(api.run)
    made = api.client.post(S, json={"name": "strict", "on_mismatch": "refuse"}, headers=h)
    assert made.status_code == 201, made.text
    assert made.json()["vary"] == ["engine_version"]
    base = [import_run(api.sessions, tmp_path, [100.0] * 4, name=f"s{i}") for i in range(2)]
    for rid in base:
        assert (
            api.client.post(f"{S}/strict/runs", json={"run_id": rid}, headers=h).json()["state"]
            == "member"
        )
    other = import_run(api.sessions, tmp_path, [100.0] * 4, name="long", input_tokens=400)
    r = api.client.post(f"{S}/strict/runs", json={"run_id": other}, headers=h)
    assert r.status_code == 409, r.text
    assert "measured input length p50" in r.json()["detail"]
    runs = api.client.get(f"{S}/strict").json()["runs"]
    assert [x["run_id"] for x in runs] == base  # refused: kept out
    # a series that flags keeps it, apart, with the reason
    ok = api.client.post(f"{S}/loose/runs", json={"run_id": base[0]}, headers=h).json()
    assert ok["state"] == "member" and ok["previous"] == "strict"
    flagged = api.client.post(f"{S}/loose/runs", json={"run_id": other}, headers=h).json()
    assert flagged["state"] == "flagged"
    assert "measured input length p50: series 200.0, run 400.0" in flagged["reason"]
    t = api.client.get(f"{S}/loose/trend").json()
    assert [(p["state"], p["counted"]) for p in t["points"]] == [
        ("member", True),
        ("flagged", False),
    ]


def test_move_out_and_a_run_created_with_a_series(api: Api, tmp_path: Path) -> None:
    h = api.h(api.run)
    rid = import_run(api.sessions, tmp_path, [50.0, 60.0], name="one")
    assert api.client.post(f"{S}/m/runs", json={"run_id": rid}, headers=h).status_code == 200
    gone = api.client.delete(f"{S}/m/runs/{rid}", headers=h)
    assert gone.status_code == 200 and gone.json()["series"] is None
    assert api.client.delete(f"{S}/m/runs/{rid}", headers=h).status_code == 404
    created = api.create_run(series="queued-series")
    detail = api.client.get(f"{S}/queued-series").json()
    assert [(x["run_id"], x["state"]) for x in detail["runs"]] == [(created["run_id"], "pending")]


BAD_NAMES = ["bad name", "a/b", "x" * 101, "", "nul\x00", "\u00e9", "semi;colon"]


def test_bad_series_names_are_422(api: Api) -> None:
    h = api.h(api.run)
    for name in BAD_NAMES:
        r = api.client.post(S, json={"name": name}, headers=h)
        assert r.status_code == 422, (name, r.text)
        assert r.json()["detail"][0]["loc"][-1] == "name"
        body = {"base_url": "http://127.0.0.1:9", "model": "m", "series": name}
        r = api.client.post("/api/v1/runs", json=body, headers=h)
        assert r.status_code == 422, (name, r.text)
        assert "series" in [str(x) for x in r.json()["detail"][0]["loc"]]
    assert api.client.get("/api/v1/runs").json()["total"] == 0  # nothing was created
    assert api.client.get(S).json()["items"] == []


def test_bad_paths_and_queries_are_4xx(api: Api, tmp_path: Path) -> None:
    assert api.client.get(f"{S}/bad%20name").status_code == 422
    assert api.client.get(f"{S}/{'y' * 101}").status_code == 422
    assert api.client.get(f"{S}/nope").status_code == 404
    _series_of(api, tmp_path, "q", [[10.0, 11.0]])
    r = api.client.get(f"{S}/q/trend", params={"metric": "ttft:p42"})
    assert r.status_code == 422 and r.json()["detail"][0]["loc"] == ["query", "metric"]
    r = api.client.get(f"{S}/q/trend", params={"metric": "nonsense"})
    assert r.status_code == 422
    h = api.h(api.run)
    r = api.client.post(f"{S}/q/runs", json={"run_id": "nope"}, headers=h)
    assert r.status_code == 404
    r = api.client.post(S, json={"name": "v", "vary": ["colour"]}, headers=h)
    assert r.status_code == 422 and r.json()["detail"][0]["loc"] == ["body", "vary"]
    assert api.client.post(S, json={"name": "q"}, headers=h).status_code == 409
    assert api.client.post(S, json={"name": "w"}).status_code == 401


def test_gate_judges_a_run_against_its_series(api: Api, tmp_path: Path) -> None:
    ttfts = shifted(9, 8)  # the last run jumps by 40 ms
    ids = _series_of(api, tmp_path, "gate", ttfts)
    r = api.client.get(f"{S}/gate/gate", params={"run_id": ids[-1], "metric": "ttft:p99"})
    assert r.status_code == 200, r.text
    g = r.json()
    (res,) = g["results"]
    median = sorted(p99(v) for v in ttfts[:8])
    assert res["reference"] == pytest.approx((median[3] + median[4]) / 2, abs=1e-3)
    assert res["reference_runs"] == ids[:8]
    assert res["verdict"] == "regressed" and g["verdict"] == "regressed"
    r = api.client.get(f"{S}/gate/gate", params={"run_id": ids[4], "metric": "ttft:p99"})
    assert r.json()["verdict"] == "no significant change"
    # an untrusted run gets no verdict unless asked
    with session_scope(api.sessions) as s:
        repo.finish_run(s, ids[-1], status=RunStatus.FAILED)
    from app.services import series as series_svc

    series_svc.settle_run(api.sessions, ids[-1])
    r = api.client.get(f"{S}/gate/gate", params={"run_id": ids[-1]})
    assert r.status_code == 409 and "no verdict" in r.json()["detail"]
    r = api.client.get(f"{S}/gate/gate", params={"run_id": ids[-1], "allow_invalid": "true"})
    assert r.status_code == 200 and r.json()["caveats"]


def test_a_sweep_queued_with_a_series(api: Api, tmp_path: Path) -> None:
    h = api.h(api.run)
    body = {"base_url": "http://127.0.0.1:9", "model": "m", "rates": [1, 2], "series": "sw"}
    r = api.client.post("/api/v1/sweeps", json=body, headers=h)
    assert r.status_code == 201, r.text
    sweep_id = r.json()["sweep_id"]
    assert api.client.get(f"{S}/sw").json()["runs"] == []  # its steps join as they finish
    from app.services import series as series_svc
    from app.storage import compare_repo

    step_run = import_run(api.sessions, tmp_path, [20.0, 30.0], name="step0")
    probe_run = import_run(api.sessions, tmp_path, [20.0, 30.0], name="probe")
    with session_scope(api.sessions) as s:  # as the worker's step creation stores them
        compare_repo.add_step(s, sweep_id, step_idx=0, run_id=step_run, load=1.0,
                              load_kind="rate")  # fmt: skip
        compare_repo.add_step(s, sweep_id, step_idx=1, run_id=probe_run, load=-1.0,
                              load_kind="rate", role="probe")  # fmt: skip
    assert series_svc.settle_run(api.sessions, step_run) is not None
    assert series_svc.settle_run(api.sessions, probe_run) is None  # a probe is no step
    runs = api.client.get(f"{S}/sw").json()["runs"]
    assert [(x["run_id"], x["track"], x["sweep_id"]) for x in runs] == [
        (step_run, "1 req/s", sweep_id)
    ]
    r = api.client.post("/api/v1/sweeps", json=body | {"series": "no good"}, headers=h)
    assert r.status_code == 422
