"""The sweeps list page, sweep links on the runs and run pages, the run page's telemetry
link, and the probes page saying which worker takes probe jobs (TestClient, temp SQLite)."""

from __future__ import annotations

import re
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from fastapi.testclient import TestClient
from sqlalchemy.orm import Session, sessionmaker

from app.services.file_imports import import_path
from app.services.runs import open_database
from app.storage import compare_repo
from app.storage import jobs as job_repo
from app.storage import probes as probe_repo
from app.storage.db import session_scope
from app.worker.loop import Worker
from tests.web_support import CSV_LOG, web_app

FIXTURE = Path(__file__).parent / "fixtures" / "interop" / "guidellm-benchmarks.json"


@dataclass(frozen=True)
class Lab:
    url: str
    sessions: sessionmaker[Session]
    sweep_id: str
    step_runs: list[str]
    hostile_sweep: str


@pytest.fixture(scope="module")
def lab(tmp_path_factory: pytest.TempPathFactory) -> Lab:
    tmp = tmp_path_factory.mktemp("sweeps")
    url = f"sqlite:///{tmp / 'sweeps.db'}"
    sessions = open_database(url)
    run_ids = import_path(sessions, "guidellm", FIXTURE, name="gl")
    with session_scope(sessions) as s:
        sweep_ids = set(compare_repo.sweep_ids_of_runs(s, run_ids).values())
        assert len(sweep_ids) == 1
        (sweep_id,) = sweep_ids
        hostile = compare_repo.create_sweep(
            s,
            spec={"model": "<script>m</script>"},
            mode="rates",
            loads=[2.0, 4.0],
            name="<b>evil</b> sweep",
            status="stopped",
        )
        compare_repo.update_sweep(s, hostile, stop_reason="<img src=x onerror=alert(1)>")
    return Lab(url, sessions, sweep_id, run_ids, hostile)


@pytest.fixture(scope="module")
def client(lab: Lab) -> Iterator[TestClient]:
    with TestClient(web_app(lab.url)) as c:
        yield c


def _row(html: str, sweep_id: str) -> str:
    m = re.search(rf'<tr data-sweep-id="{sweep_id}">(.*?)</tr>', html, re.S)
    assert m is not None, sweep_id
    return m.group(1)


def test_sweeps_page_lists_every_sweep_newest_first_escaped(client: TestClient, lab: Lab) -> None:
    page = client.get("/sweeps")
    assert page.status_code == 200
    html = page.text
    assert 'id="empty-sweeps"' not in html
    # newest first: the hostile sweep was created after the import
    assert html.index(f'data-sweep-id="{lab.hostile_sweep}"') < html.index(
        f'data-sweep-id="{lab.sweep_id}"'
    )
    row = _row(html, lab.sweep_id)
    assert f'href="/sweeps/{lab.sweep_id}"' in row
    with session_scope(lab.sessions) as s:
        sweep = compare_repo.find_sweep(s, lab.sweep_id)
        assert sweep is not None
        mode, n_steps = sweep.mode, len(compare_repo.sweep_steps(s, lab.sweep_id))
    assert n_steps == len(lab.step_runs) >= 2
    assert f"<td>{mode}</td>" in row
    assert f'<td class="num">{n_steps}</td>' in row
    assert f'href="/sweeps/{lab.sweep_id}#max-goodput"' in row
    bad = _row(html, lab.hostile_sweep)
    assert "<b>evil</b>" not in html and "&lt;b&gt;evil&lt;/b&gt; sweep" in bad
    assert "<img src=x" not in html and "&lt;img src=x onerror=alert(1)&gt;" in bad
    assert "<script>m</script>" not in html
    assert "2, 4" in bad and "stopped" in bad and '<td class="num">0</td>' in bad
    # the sweep page it links to renders, under the Sweeps nav
    sweep_page = client.get(f"/sweeps/{lab.sweep_id}")
    assert sweep_page.status_code == 200
    assert 'href="/sweeps" class="on"' in sweep_page.text


def test_sweeps_page_empty_state_says_how_to_start_one(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'empty.db'}"
    open_database(url)
    with TestClient(web_app(url)) as c:
        page = c.get("/sweeps")
    assert page.status_code == 200
    assert 'id="empty-sweeps"' in page.text
    assert "tokentrace sweep --base-url" in page.text and "--rates 2 4 8" in page.text
    assert "POST /api/v1/sweeps" in page.text


def test_nav_has_a_sweeps_link(client: TestClient) -> None:
    for url in ("/", "/sweeps", "/workers"):
        html = client.get(url).text
        assert re.search(r'<nav>.*<a href="/sweeps"[^>]*>Sweeps</a>.*</nav>', html, re.S), url
    assert 'href="/sweeps" class="on"' in client.get("/sweeps").text
    assert 'href="/sweeps" class="on"' not in client.get("/").text


def test_runs_page_marks_sweep_steps(client: TestClient, lab: Lab) -> None:
    folded = client.get("/").text  # by default steps are folded under their sweep
    for run_id in lab.step_runs:
        assert f'<tr data-run-id="{run_id}">' not in folded
    assert 'id="steps-toggle"' in folded and 'class="sweep-link"' not in folded
    html = client.get("/?steps=1").text
    for run_id in lab.step_runs:
        m = re.search(rf'<tr data-run-id="{run_id}">(.*?)</tr>', html, re.S)
        assert m is not None
        assert f'class="sweep-link" href="/sweeps/{lab.sweep_id}"' in m.group(1)
    assert html.count('class="sweep-link"') == len(lab.step_runs)


def test_run_page_links_to_its_sweep(client: TestClient, lab: Lab) -> None:
    html = client.get(f"/runs/{lab.step_runs[0]}").text
    assert f'id="sweep-link" href="/sweeps/{lab.sweep_id}"' in html
    assert 'id="telemetry-link"' not in html


def test_run_page_links_to_job_telemetry_only_when_stored(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'tele.db'}"
    sessions = open_database(url)
    f = tmp_path / "log.csv"
    f.write_text(CSV_LOG)
    run_id = import_path(sessions, "csv", f, name="bench-like")[0]
    with session_scope(sessions) as s:
        job = job_repo.create_job(
            s, kind="bench", spec={}, requirements={}, run_id=run_id, max_attempts=1
        )
        job_id = job.id
    with TestClient(web_app(url)) as c:
        html = c.get(f"/runs/{run_id}").text
        assert 'id="telemetry-link"' not in html and 'id="sweep-link"' not in html
        with session_scope(sessions) as s:
            assert not probe_repo.has_telemetry(s, job_id)
            probe_repo.add_telemetry(
                s, job_id, 0, [{"t_s": 0.0, "util_pct": 50.0, "power_w": 100.0}]
            )
            assert probe_repo.has_telemetry(s, job_id)
        html = c.get(f"/runs/{run_id}").text
        assert f'id="telemetry-link" href="/jobs/{job_id}/telemetry"' in html
        assert c.get(f"/jobs/{job_id}/telemetry").status_code == 200


def test_probes_page_says_which_worker_takes_probe_jobs(tmp_path: Path) -> None:
    """A plain worker leases no probe jobs unless started with --kind probe; the embedded
    worker does where torch is installed; the probes page and docs/probes.md say so."""
    assert "probe" not in Worker("http://127.0.0.1:1", "tt_x").kinds
    url = f"sqlite:///{tmp_path / 'probes.db'}"
    open_database(url)
    with TestClient(web_app(url)) as c:
        html = c.get("/probes").text
    assert 'id="empty-probes"' in html and "--kind probe" in html
    assert "TOKENTRACE_LOCAL_WORKER_PROBES" in html
    docs = (Path(__file__).parents[1] / "docs" / "probes.md").read_text()
    assert "tokentrace serve" in docs and "--kind probe" in docs
    assert "TOKENTRACE_LOCAL_WORKER_PROBES" in docs
