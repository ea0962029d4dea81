"""The runs list (pages, filters, sweep steps folded), a run's requests table (sorted and
filtered on the server), a request page's previous/next links and the live run figures,
each against an order or a figure computed here from the stored rows."""

from __future__ import annotations

import datetime as dt
import math
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from fastapi.testclient import TestClient
from sqlalchemy import select

from app.client.spec import RunSpec
from app.domain import RunStatus
from app.services.runs import open_database
from app.storage import compare_repo
from app.storage import repository as repo
from app.storage.db import session_scope
from app.storage.models import Request
from app.storage.request_table import LiveColumns
from app.web.runs_live import live_figures
from tests.web_support import Seeded, seed, web_app

# ------------------------------------------------------------------------- runs list

DAY0 = dt.datetime(2026, 1, 1, tzinfo=dt.UTC)
N_RUNS = 70
STEP_RUNS = (3, 10, 11, 40, 56)  # these are sweep steps


def _spec(i: int) -> RunSpec:
    return RunSpec(
        base_url="http://a.test:8000" if i % 3 else "http://b.test:8000",
        model="m-a" if i % 2 else "m-b",
        num_prompts=1,
    )


@pytest.fixture(scope="module")
def listed(tmp_path_factory: pytest.TempPathFactory) -> tuple[TestClient, list[dict[str, Any]]]:
    url = f"sqlite:///{tmp_path_factory.mktemp('list') / 'runs.db'}"
    sessions = open_database(url)
    runs: list[dict[str, Any]] = []
    with session_scope(sessions) as s:
        sweep_id = compare_repo.create_sweep(s, spec={}, mode="rates", loads=[1.0], name="sw")
        for i in range(N_RUNS):
            created = DAY0 + dt.timedelta(hours=7 * i)  # about 4 runs a day
            rid = repo.create_run(
                s,
                _spec(i),
                source="bench" if i % 4 else "import:csv",
                name=f"run-{i}",
                status=RunStatus.FAILED if i % 5 == 0 else RunStatus.SUCCEEDED,
                tags=["even"] if i % 2 == 0 else [],
                created_at=created,
            )
            if i in STEP_RUNS:
                compare_repo.add_step(
                    s, sweep_id, step_idx=i, run_id=rid, load=1.0, load_kind="rate"
                )
            runs.append(
                {
                    "id": rid,
                    "i": i,
                    "created": created,
                    "model": _spec(i).model,
                    "target": _spec(i).base_url,
                    "source": "bench" if i % 4 else "import:csv",
                    "status": "failed" if i % 5 == 0 else "succeeded",
                    "even": i % 2 == 0,
                    "step": i in STEP_RUNS,
                }
            )
    client = TestClient(web_app(url))
    client.__enter__()
    yield client, runs  # type: ignore[misc]
    client.__exit__(None, None, None)


def _ids(html: str) -> list[str]:
    return re.findall(r'<tr data-run-id="([0-9a-f]+)">', html)


def _newest_first(runs: list[dict[str, Any]]) -> list[str]:
    return [r["id"] for r in sorted(runs, key=lambda r: r["created"], reverse=True)]


def test_runs_list_pages_with_counts_and_folds_sweep_steps(
    listed: tuple[TestClient, list[dict[str, Any]]],
) -> None:
    client, runs = listed
    plain = [r for r in runs if not r["step"]]
    page1 = client.get("/")
    assert page1.status_code == 200
    assert _ids(page1.text) == _newest_first(plain)[:50]
    assert "1–50 of 65 matching (70 runs in all)" in page1.text
    assert "5 sweep steps folded under their sweeps" in page1.text
    sweep_id = re.findall(r'class="folded-sweep" href="/sweeps/([^"]+)">', page1.text)
    assert len(sweep_id) == 1 and f"{sweep_id[0]}</a> (5 steps)" in page1.text
    failed = client.get("/?status=failed").text  # steps 10 and 40 are failed runs
    assert f"{sweep_id[0]}</a> (2 steps)" in failed
    assert 'class="sweep-link"' not in page1.text
    m = re.search(r'href="([^"]*)" id="page-next"', page1.text)
    assert m and m.group(1) == "/?page=2"
    page2 = client.get("/?page=2").text
    assert _ids(page2) == _newest_first(plain)[50:]
    assert "51–65 of 65 matching" in page2 and 'id="page-next"' not in page2
    assert 'href="/" id="page-prev"' in page2
    shown = client.get("/?steps=1").text
    assert _ids(shown) == _newest_first(runs)[:50]
    assert "1–50 of 70 matching" in shown and shown.count('class="sweep-link"') == sum(
        1 for r in _newest_first(runs)[:50] if r in {x["id"] for x in runs if x["step"]}
    )
    assert re.search(r'href="/" id="steps-toggle">Fold them', shown)


@pytest.mark.parametrize(
    ("query", "keep"),
    [
        ("model=m-a", lambda r: r["model"] == "m-a"),
        ("target=http://b.test:8000", lambda r: r["target"] == "http://b.test:8000"),
        ("tag=even", lambda r: r["even"]),
        ("status=failed", lambda r: r["status"] == "failed"),
        ("source=import:csv", lambda r: r["source"] == "import:csv"),
        (
            "since=2026-01-03&until=2026-01-05",  # whole days, UTC, both ends included
            lambda r: dt.date(2026, 1, 3) <= r["created"].date() <= dt.date(2026, 1, 5),
        ),
        (
            "model=m-b&status=succeeded&tag=even",
            lambda r: r["model"] == "m-b" and r["status"] == "succeeded" and r["even"],
        ),
    ],
)
def test_runs_list_filters(
    listed: tuple[TestClient, list[dict[str, Any]]], query: str, keep: Any
) -> None:
    client, runs = listed
    want = _newest_first([r for r in runs if keep(r) and not r["step"]])
    html = client.get(f"/?{query}").text
    assert _ids(html) == want[:50]
    assert f"of {len(want)} matching" in html
    with_steps = _newest_first([r for r in runs if keep(r)])
    assert _ids(client.get(f"/?{query}&steps=1").text) == with_steps[:50]


def test_runs_list_filter_and_page_together(
    listed: tuple[TestClient, list[dict[str, Any]]],
) -> None:
    client, runs = listed
    want = _newest_first([r for r in runs if r["status"] == "succeeded"])
    html = client.get("/?status=succeeded&steps=1").text
    m = re.search(r'href="([^"]*)" id="page-next"', html)
    assert m and m.group(1) == "/?status=succeeded&amp;steps=1&amp;page=2"
    assert _ids(client.get("/?status=succeeded&steps=1&page=2").text) == want[50:]


def test_runs_list_bad_filters_are_named(listed: tuple[TestClient, list[dict[str, Any]]]) -> None:
    client, runs = listed
    r = client.get("/?since=yesterday&status=bogus&page=0")
    assert r.status_code == 422
    assert re.search(r'id="err-since">since: not a date', r.text)
    assert re.search(r'id="err-status">status: one of', r.text)
    assert re.search(r'id="err-page">page: a whole number', r.text)
    assert _ids(r.text) == _newest_first([x for x in runs if not x["step"]])[:50]
    r = client.get("/?since=2026-01-05&until=2026-01-01")
    assert r.status_code == 422 and 'id="err-until"' in r.text


# -------------------------------------------------------------------- requests table


@pytest.fixture(scope="module")
def seeded(tmp_path_factory: pytest.TempPathFactory) -> Seeded:
    return seed(tmp_path_factory.mktemp("tables"))


@pytest.fixture(scope="module")
def client(seeded: Seeded) -> Iterator[TestClient]:
    with TestClient(web_app(seeded.url)) as c:
        yield c


COLS = ("idx", "status", "sent_ns", "ttft_ns", "tpot_ns", "e2e_ns", "output_tokens")


def _stored(seeded: Seeded, run_id: str) -> list[dict[str, Any]]:
    t = Request.__table__
    with session_scope(seeded.sessions) as s:
        rows = s.execute(select(*(t.c[c] for c in COLS)).where(t.c.run_id == run_id)).all()
    return [dict(zip(COLS, r, strict=True)) | {"status": str(r[1])} for r in rows]


def _order(rows: list[dict[str, Any]], col: str, desc: bool) -> list[int]:
    """Missing values last either way; ties by index ascending."""
    have = [r for r in rows if r[col] is not None]
    missing = sorted((r for r in rows if r[col] is None), key=lambda r: r["idx"])
    have.sort(key=lambda r: r["idx"])
    have.sort(key=lambda r: r[col], reverse=desc)  # stable: ties keep index order
    return [r["idx"] for r in have + missing]


def _table_idx(html: str) -> list[int]:
    return [int(x) for x in re.findall(r'<tr data-idx="(\d+)">', html)]


@pytest.mark.parametrize(
    ("sort", "col"),
    [
        ("ttft", "ttft_ns"),
        ("e2e", "e2e_ns"),
        ("tpot", "tpot_ns"),
        ("output_tokens", "output_tokens"),
        ("status", "status"),
    ],
)
@pytest.mark.parametrize("desc", [False, True])
def test_requests_table_sorts_on_the_server(
    client: TestClient, seeded: Seeded, sort: str, col: str, desc: bool
) -> None:
    rows = _stored(seeded, seeded.normal)
    assert len(rows) == 60 and any(r["ttft_ns"] is None for r in rows)  # failures: no TTFT
    d = "desc" if desc else "asc"
    page = client.get(f"/runs/{seeded.normal}/requests?sort={sort}&dir={d}")
    assert page.status_code == 200
    assert _table_idx(page.text) == _order(rows, col, desc)


def test_requests_table_by_index_descending(client: TestClient, seeded: Seeded) -> None:
    html = client.get(f"/runs/{seeded.normal}/requests?dir=desc").text
    assert _table_idx(html) == list(range(59, -1, -1))


def test_requests_table_filters(client: TestClient, seeded: Seeded) -> None:
    rows = _stored(seeded, seeded.normal)
    failed = client.get(f"/runs/{seeded.normal}/requests?status=failed").text
    want = sorted(r["idx"] for r in rows if r["status"] != "ok")
    assert want and _table_idx(failed) == want
    assert f"of {len(want)} matching (60 in all)" in failed
    ttfts = sorted(r["ttft_ns"] for r in rows if r["ttft_ns"] is not None)
    cut_ms = ttfts[len(ttfts) // 2] / 1e6
    html = client.get(f"/runs/{seeded.normal}/requests?ttft_min={cut_ms!r}&sort=ttft&dir=desc")
    keep = [r for r in rows if r["ttft_ns"] is not None and r["ttft_ns"] >= cut_ms * 1e6]
    assert 0 < len(keep) < len(rows)
    assert _table_idx(html.text) == _order(keep, "ttft_ns", True)
    e2es = sorted(r["e2e_ns"] for r in rows if r["e2e_ns"] is not None)
    hi = e2es[len(e2es) // 3] / 1e6
    html = client.get(
        f"/runs/{seeded.normal}/requests?status=ok&e2e_max={hi!r}&output_tokens_min=1"
    ).text
    keep = [
        r["idx"]
        for r in rows
        if r["status"] == "ok"
        and r["e2e_ns"] is not None
        and r["e2e_ns"] <= hi * 1e6
        and (r["output_tokens"] or 0) >= 1
    ]
    assert keep and _table_idx(html) == sorted(keep)
    none = client.get(f"/runs/{seeded.normal}/requests?ttft_min=1e9").text
    assert "No request matches these filters." in none and _table_idx(none) == []


def test_requests_table_bad_parameters_are_named(client: TestClient, seeded: Seeded) -> None:
    r = client.get(f"/runs/{seeded.normal}/requests?sort=bogus&ttft_min=fast&dir=up&status=x")
    assert r.status_code == 422
    for key in ("sort", "ttft_min", "dir", "status"):
        assert re.search(rf'id="err-{key}">{key}: ', r.text), key
    assert _table_idx(r.text) == list(range(60))  # the bad parts are left out
    assert client.get(f"/runs/{seeded.normal}/requests?ttft_min=-1").status_code == 422
    assert client.get(f"/runs/{seeded.normal}/requests?ttft_min=nan").status_code == 422


def _nav(html: str) -> tuple[str | None, str | None]:
    prev = re.search(r'href="([^"]*)" id="request-prev"', html)
    nxt = re.search(r'href="([^"]*)" id="request-next"', html)
    return (prev.group(1) if prev else None, nxt.group(1) if nxt else None)


def test_request_page_previous_next_follow_the_table(client: TestClient, seeded: Seeded) -> None:
    rows = _stored(seeded, seeded.normal)
    order = _order(rows, "ttft_ns", True)
    qs = "?sort=ttft&amp;dir=desc"
    table = client.get(f"/runs/{seeded.normal}/requests?sort=ttft&dir=desc").text
    assert f'href="/runs/{seeded.normal}/requests/{order[0]}{qs}"' in table
    first = client.get(f"/runs/{seeded.normal}/requests/{order[0]}?sort=ttft&dir=desc").text
    assert _nav(first) == (None, f"/runs/{seeded.normal}/requests/{order[1]}{qs}")
    assert "1 of 60 in this sort/filter" in first
    mid = client.get(f"/runs/{seeded.normal}/requests/{order[7]}?sort=ttft&dir=desc").text
    assert _nav(mid) == (
        f"/runs/{seeded.normal}/requests/{order[6]}{qs}",
        f"/runs/{seeded.normal}/requests/{order[8]}{qs}",
    )
    last = client.get(f"/runs/{seeded.normal}/requests/{order[-1]}?sort=ttft&dir=desc").text
    assert _nav(last) == (f"/runs/{seeded.normal}/requests/{order[-2]}{qs}", None)
    # by index when it did not come from a sorted table
    plain = client.get(f"/runs/{seeded.normal}/requests/5").text
    assert _nav(plain) == (f"/runs/{seeded.normal}/requests/4", f"/runs/{seeded.normal}/requests/6")
    # a filter: neighbours are the failed requests only
    failed = sorted(r["idx"] for r in rows if r["status"] != "ok")
    html = client.get(f"/runs/{seeded.normal}/requests/{failed[1]}?status=failed").text
    assert _nav(html) == (
        f"/runs/{seeded.normal}/requests/{failed[0]}?status=failed",
        f"/runs/{seeded.normal}/requests/{failed[2]}?status=failed" if len(failed) > 2 else None,
    )


# ----------------------------------------------------------------------- live figures


def test_live_figures_by_hand() -> None:
    ms = 1_000_000
    cols = LiveColumns(
        ok=np.array([True, True, True, False, True]),
        sent_ns=np.array([0, 100 * ms, 200 * ms, 300 * ms, -1], np.int64),  # last: never sent
        end_ns=np.array([400 * ms, 600 * ms, 2000 * ms, 500 * ms, -1], np.int64),
        values={
            "ttft": np.array([10 * ms, 30 * ms, 20 * ms, np.nan, np.nan]),
            "tpot": np.array([2 * ms, 4 * ms, np.nan, np.nan, np.nan]),
            "e2e": np.array([400 * ms, 500 * ms, 1800 * ms, 200 * ms, np.nan]),
        },
        output_tokens=np.array([10, 20, 30, 99, -1], np.int64),
    )
    got = live_figures(cols)
    assert (got["stored"], got["ok"], got["failed"]) == (5, 4, 1)
    # TTFT of the ok requests: 10, 30, 20 ms (the fourth ok one has none) -> sorted 10 20 30
    # p50 at position 1 -> 20; p90 at 1.8 -> 20 + 0.8*10 = 28; p99 at 1.98 -> 29.8
    assert got["ttft"] == pytest.approx({"p50": 20.0, "p90": 28.0, "p99": 29.8, "count": 3})
    # TPOT 2, 4: p50 at 0.5 -> 3; p90 at 0.9 -> 3.8; p99 at 0.99 -> 3.98
    assert got["tpot"] == pytest.approx({"p50": 3.0, "p90": 3.8, "p99": 3.98, "count": 2})
    # E2E of ok 400 500 1800: p50 500; p90 at 1.8 -> 500 + 0.8*1300 = 1540;
    # p99 at 1.98 -> 500 + 0.98*1300 = 1774
    assert got["e2e"] == pytest.approx({"p50": 500.0, "p90": 1540.0, "p99": 1774.0, "count": 3})
    # window: first send 0 .. last end 2000 ms = 2 s; 4 ok requests, 10+20+30 tokens (-1: none)
    assert got["window_s"] == pytest.approx(2.0)
    assert got["req_per_s"] == pytest.approx(2.0)
    assert got["output_tok_per_s"] == pytest.approx(30.0)


def test_live_figures_without_requests() -> None:
    empty = np.zeros(0)
    cols = LiveColumns(
        np.zeros(0, np.bool_),
        *(np.zeros(0, np.int64) for _ in range(2)),
        {"ttft": empty, "tpot": empty, "e2e": empty},
        np.zeros(0, np.int64),
    )
    got = live_figures(cols)
    assert got["stored"] == 0 and got["req_per_s"] is None and got["output_tok_per_s"] is None
    assert got["ttft"] == {"p50": None, "p90": None, "p99": None, "count": 0}


def test_live_json_of_a_stored_run(client: TestClient, seeded: Seeded) -> None:
    r = client.get(f"/runs/{seeded.normal}/live.json")
    assert r.status_code == 200
    body = r.json()
    t = Request.__table__
    with session_scope(seeded.sessions) as s:
        rows = s.execute(
            select(
                t.c.status, t.c.ttft_ns, t.c.e2e_ns, t.c.sent_ns, t.c.end_ns, t.c.output_tokens
            ).where(t.c.run_id == seeded.normal, t.c.warmup.is_(False))
        ).all()
    ok = [r for r in rows if str(r[0]) == "ok"]
    assert body["stored"] == len(rows) and body["ok"] == len(ok)
    ttft = np.array([r[1] for r in ok if r[1] is not None], float) / 1e6
    e2e = np.array([r[2] for r in ok if r[2] is not None], float) / 1e6
    for p in (50, 90, 99):
        assert body["ttft"][f"p{p}"] == pytest.approx(float(np.percentile(ttft, p)))
        assert body["e2e"][f"p{p}"] == pytest.approx(float(np.percentile(e2e, p)))
    window = (
        max(r[4] for r in rows if r[4] is not None) - min(r[3] for r in rows if r[3] is not None)
    ) / 1e9
    assert body["req_per_s"] == pytest.approx(len(ok) / window)
    assert body["output_tok_per_s"] == pytest.approx(sum(r[5] for r in ok) / window)
    assert math.isfinite(body["window_s"])
    assert client.get("/runs/nope/live.json").status_code == 404


def test_live_json_needs_read_access_when_reads_are_protected(
    seeded: Seeded, tmp_path: Path
) -> None:
    from app.api.app import create_app
    from app.settings import Settings

    app = create_app(Settings(database_url=seeded.url, local_worker=False, auth_reads=True))
    with TestClient(app) as c:
        assert c.get(f"/runs/{seeded.normal}/live.json").status_code == 401
