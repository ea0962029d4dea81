"""Issue 17 in headless Chromium against a real dashboard (its embedded worker, the
simulator as target): launch a sweep from its form and watch its steps appear live, then
cancel it from its page; pick two sweeps and compare their curves on one chart; launch a
CPU probe from its form and see it in the probes list; the workers page shows the embedded
worker online with its heartbeat age and a queued job no worker can take, with why; the
launch form starts with the server's configured target. Setup goes through the services;
every action under test goes through the pages."""

from __future__ import annotations

import re
import time
from collections.abc import Iterator
from dataclasses import dataclass

import pytest
from sqlalchemy.orm import Session, sessionmaker

from app.client import sweep_plan
from app.client.spec import RunSpec
from app.probes.spec import ProbeSpec
from app.protocol.wire import JobRequirements
from app.services import auth, probe_jobs
from app.services import sweeps as sweep_svc
from app.services.runs import open_database
from app.storage import compare_repo
from app.storage import jobs as job_repo
from app.storage import repository as repo
from app.storage.db import session_scope
from app.targets.sim_config import SimConfig
from app.targets.simulator import SimulatorThread, start_simulator_thread
from app.worker.capabilities import torch_version
from tests.browser_support import (
    CHROMIUM,
    Console,
    DashboardServer,
    assert_drawn,
    browser_missing,
    sign_in,
    submit_refused,
)

pytestmark = pytest.mark.slow
_MISSING = browser_missing()
if _MISSING:
    pytest.skip(f"browser tests skipped: {_MISSING}", allow_module_level=True)

from playwright.sync_api import Browser, Page, sync_playwright  # noqa: E402
from playwright.sync_api import Error as PlaywrightError  # noqa: E402


@dataclass(frozen=True)
class Lab:
    url: str
    sessions: sessionmaker[Session]
    sim: SimulatorThread
    secret: str  # a token with the run scope
    sweeps: tuple[str, str]  # two finished sweeps for the compare journey


def _seed_sweep(
    sessions: sessionmaker[Session], base_url: str, name: str, rates: tuple[float, ...]
) -> str:
    spec = RunSpec(
        base_url=base_url, model="tokentrace-sim", num_prompts=8, input_len=16, output_len=8
    )
    plan = sweep_plan.SweepPlan("rates", rates, min_ratio=0.01)
    return sweep_svc.execute_sweep(spec, plan, sessions=sessions, name=name).sweep_id


@pytest.fixture(scope="module")
def lab(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Lab]:
    tmp = tmp_path_factory.mktemp("journeys")
    url = f"sqlite:///{tmp / 'journeys.db'}"
    sessions = open_database(url)
    sim = start_simulator_thread(SimConfig(ttft_ms=20, itl_ms=4, seed=11))
    try:
        a = _seed_sweep(sessions, sim.base_url, "sweep A", (20.0, 40.0))
        b = _seed_sweep(sessions, sim.base_url, "sweep B", (20.0, 40.0, 80.0))
        with session_scope(sessions) as s:
            _, secret = auth.create_token(s, scopes=["run"], name="browser")
        yield Lab(url, sessions, sim, secret, (a, b))
    finally:
        sim.stop()


@pytest.fixture(scope="module")
def server(lab: Lab, tmp_path_factory: pytest.TempPathFactory) -> Iterator[DashboardServer]:
    log = tmp_path_factory.mktemp("logs") / "server.log"
    env = {
        "TOKENTRACE_DEFAULT_TARGET_URL": lab.sim.base_url,
        "TOKENTRACE_DEFAULT_TARGET_MODEL": "tokentrace-sim",
        "TOKENTRACE_LEASE_TTL_S": "10",
    }
    srv = DashboardServer(lab.url, log, local_worker=True, env=env)
    yield srv
    srv.stop()


@pytest.fixture(scope="module")
def browser(server: DashboardServer) -> Iterator[Browser]:
    with sync_playwright() as p:  # after the seeding (it uses asyncio.run on this thread)
        b = p.chromium.launch(executable_path=CHROMIUM, args=["--no-sandbox"])
        yield b
        b.close()


@pytest.fixture
def page(browser: Browser) -> Iterator[Page]:
    ctx = browser.new_context(viewport={"width": 1400, "height": 1000})
    pg = ctx.new_page()
    yield pg
    ctx.close()


def _text(page: Page, selector: str) -> str | None:
    """The element's text, or None while the page is between two loads."""
    try:
        loc = page.locator(selector)
        return loc.inner_text(timeout=1000) if loc.count() else None
    except PlaywrightError:
        return None


ROWS_JS = """() => document.readyState === 'complete' && document.getElementById('sweep-live')
  ? document.querySelectorAll('#steps-table tbody tr').length : null"""


def _rows(page: Page) -> int | None:
    """The steps table's rows once the page has loaded (None between two loads)."""
    try:
        n = page.evaluate(ROWS_JS)
    except PlaywrightError:
        return None
    return None if n is None else int(n)


def test_sweep_form_live_steps_and_cancel(page: Page, server: DashboardServer, lab: Lab) -> None:
    con = Console(page)
    sign_in(page, server, lab.secret, "/launch/sweep")
    assert page.locator("#signin-needed").count() == 0
    # the target defaults to the server's (here: the simulator)
    assert page.input_value("#f-base_url") == lab.sim.base_url
    page.fill("#f-loads", "4, 2")  # a message beside the field first, nothing queued
    submit_refused(page, con, "#sweep-submit")
    assert "increasing order" in page.inner_text("#err-loads")
    assert page.url.endswith("/launch/sweep")

    page.fill("#f-name", "browser sweep")
    page.select_option("#f-sweep_mode", "rates")
    page.fill("#f-loads", "3, 4, 5, 6, 7, 8, 9, 10")  # ~20 s of steps in all
    page.fill("#f-min_ratio", "0.01")  # a short step's achieved rate varies: never stop early
    page.fill("#f-num_prompts", "12")
    page.fill("#f-input_len", "16")
    page.fill("#f-output_len", "8")
    with page.expect_navigation():
        page.click("#sweep-submit")
    m = re.search(r"/sweeps/(sw[0-9a-f]+)$", page.url)
    assert m, page.url
    sweep_id = m.group(1)
    assert page.locator("#sweep-live").count() == 1

    # the page follows the sweep by itself (no reload from here): steps appear one by one
    seen: list[int] = []
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        n = _rows(page)
        if n is not None and (not seen or n != seen[-1]):
            seen.append(n)
        if n is not None and n >= 2 and page.locator("#sweep-cancel").count() == 1:
            break
        time.sleep(0.2)
    assert seen and seen[-1] >= 2, (seen, server.log_path.read_text()[-3000:])
    assert seen == sorted(seen) and len(set(seen)) >= 2, seen  # grew while we watched
    assert "running" in (_text(page, "#sweep-status") or "")

    with page.expect_navigation():
        page.click("#sweep-cancel")
    # cancelled: the worker stops at its next heartbeat; the page reloads when it ends
    deadline = time.monotonic() + 60
    status = None
    while time.monotonic() < deadline:
        status = _text(page, "#sweep-status")
        if status not in (None, "queued", "running"):
            break
        time.sleep(0.3)
    assert status == "cancelled", status
    stop = _text(page, "#stop-reason") or ""
    assert stop.startswith("cancelled after"), stop
    kept = _rows(page) or 0
    assert 2 <= kept < 8  # the finished steps are kept; not every planned step ran
    with session_scope(lab.sessions) as s:
        sweep = compare_repo.find_sweep(s, sweep_id)
        assert sweep is not None and sweep.status == "cancelled"
        assert len(compare_repo.sweep_steps(s, sweep_id)) == kept
    assert_drawn(page, expect=6)
    assert page.locator("#sweep-cancel").count() == 0
    assert con.problems() == []


def test_pick_two_sweeps_and_compare_their_curves(
    page: Page, server: DashboardServer, lab: Lab
) -> None:
    con = Console(page)
    page.goto(f"{server.url}/sweeps")
    a, b = lab.sweeps
    page.check(f"#sweeps-table tr[data-sweep-id='{a}'] input[name=sweeps]")
    page.check(f"#sweeps-table tr[data-sweep-id='{b}'] input[name=sweeps]")
    with page.expect_navigation():
        page.click("#compare-sweeps")
    assert "/compare?" in page.url and a in page.url and b in page.url
    found = {c["id"]: c for c in assert_drawn(page)}
    for key in ("sweep_tput", "sweep_load_ttft_ms", "sweep_load_e2el_ms", "sweep_ttft_ms"):
        chart = found[f"plot-{key}"]
        assert not chart["hidden"], key
    # throughput vs load: one line per sweep (+ the y = x line), both on one chart
    tput = page.evaluate(
        "() => document.getElementById('plot-sweep_tput').data.map((t) => [t.name, t.x.length])"
    )
    # sweep A, created first, is the baseline: its legend entries say so
    assert ["sweep A (baseline)", 2] in tput and ["sweep B", 3] in tput, tput
    lat = page.evaluate(
        "() => document.getElementById('plot-sweep_load_e2el_ms').data.map((t) => t.name)"
    )
    want = {"sweep A (baseline) p50", "sweep A (baseline) p99", "sweep B p50", "sweep B p99"}
    assert want <= set(lat), lat
    assert page.locator("#sweep-verdicts").count() == 1
    assert con.problems() == []


@pytest.mark.skipif(torch_version() is None, reason="torch is not installed (extra: probes)")
def test_probe_form_runs_a_cpu_probe(page: Page, server: DashboardServer, lab: Lab) -> None:
    con = Console(page)
    sign_in(page, server, lab.secret, "/launch/probe")
    page.select_option("#f-kind", "linear")
    page.select_option("#f-device", "cpu")
    # only the chosen kind's parameters show
    assert page.locator("fieldset[data-group='Linear parameters']").is_visible()
    assert page.locator("fieldset[data-group='Ceilings parameters']").is_hidden()
    page.fill("#f-name", "browser probe")
    page.fill("#f-linear_width", "0")  # a message beside the field first
    submit_refused(page, con, "#probe-submit")
    assert "greater than or equal to 1" in page.inner_text("#err-linear_width")
    for field, value in (("width", "16"), ("batch", "2"), ("seq", "4"), ("sweep_max", "2"),
                         ("warmup", "1"), ("iters", "2")):  # fmt: skip
        page.fill(f"#f-linear_{field}", value)
    with page.expect_navigation():
        page.click("#probe-submit")
    m = re.search(r"/probes/([0-9a-f]+)$", page.url)
    assert m, page.url
    # the embedded worker (torch here) runs it; the page reloads itself when it ends
    deadline = time.monotonic() + 120
    status = None
    while time.monotonic() < deadline:
        status = _text(page, "h1 .status")
        if status not in (None, "queued", "running"):
            break
        time.sleep(0.5)
    assert status == "succeeded", (status, _text(page, "#probe-error"))
    assert page.locator("#cpu-label").count() == 1
    page.goto(f"{server.url}/probes")
    row = page.locator("#probes-table tr", has_text="browser probe")
    assert row.count() == 1 and "succeeded" in row.inner_text() and "linear" in row.inner_text()
    assert con.problems() == []


def test_workers_page_online_worker_and_a_job_no_worker_takes(
    page: Page, server: DashboardServer, lab: Lab
) -> None:
    with session_scope(lab.sessions) as s:
        pid, job_id = probe_jobs.submit(
            s,
            ProbeSpec(kind="ceilings", device="cpu", name="needs rack z"),
            requirements=JobRequirements(labels={"rack": "z"}),
            max_attempts=1,
        )
    con = Console(page)
    page.goto(f"{server.url}/workers")
    row = page.locator("#workers-table tbody tr").first
    assert "online" in row.locator(".worker-state").inner_text()
    age = row.locator(".worker-age [data-age-s]").inner_text()
    assert re.fullmatch(r"\d+ s ago", age), age
    assert int(age.split()[0]) <= 10  # within the lease TTL (heartbeats every 0.5 s)
    q = page.locator(f"#queue-table tr[data-job-id='{job_id}']")
    assert q.count() == 1
    assert q.locator(".queue-reason").inner_text() == (
        "no online worker matches its requirements (rack=z)"
    )
    assert q.locator(f"a[href='/probes/{pid}']").count() == 1
    time.sleep(2.2)  # the age ticks between reloads
    later = row.locator(".worker-age [data-age-s]").inner_text()
    assert int(later.split()[0]) >= int(age.split()[0]) + 2, (age, later)
    assert con.problems() == []
    with session_scope(lab.sessions) as s:  # leave nothing queued for the other tests
        job_repo.transition(s, job_id, from_states=("queued",), state="cancelled")


def test_launch_form_starts_with_the_servers_target(
    page: Page, server: DashboardServer, lab: Lab
) -> None:
    con = Console(page)
    sign_in(page, server, lab.secret, "/launch")
    assert page.input_value("#f-base_url") == lab.sim.base_url
    assert page.input_value("#f-model") == "tokentrace-sim"
    assert page.is_checked("#f-scrape_metrics")
    nav = page.locator("header nav")
    for href in ("/probes", "/roofline", "/throughput", "/capacity"):
        assert nav.locator(f"a[href='{href}']").count() == 1, href
    page.fill("#f-num_prompts", "5")
    page.fill("#f-name", "default target")
    with page.expect_navigation():
        page.click("#launch-submit")
    m = re.search(r"/runs/([0-9a-f]+)$", page.url)
    assert m, page.url
    with session_scope(lab.sessions) as s:  # queued against the default target, untouched
        spec = dict(repo.get_run(s, m.group(1)).spec or {})
    assert spec["base_url"] == lab.sim.base_url and spec["num_prompts"] == 5
    assert con.problems() == []
