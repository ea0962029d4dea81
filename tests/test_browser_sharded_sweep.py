"""A sweep dealt over two workers, launched from the sweep form in headless Chromium: the
dashboard's embedded worker and a ``tokentrace worker`` process take each step's two
shards; the sweep page says so and fills its steps table by itself; each step's run page
shows its By shard table with both shards. Every request the simulator saw is stored once,
on the step run it belongs to."""

from __future__ import annotations

import re
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from app.services import auth
from app.services.runs import open_database
from app.storage import compare_repo
from app.storage import repository as repo
from app.storage.db import session_scope
from app.targets.sim_config import SimConfig
from app.targets.simulator import start_simulator_thread
from tests.browser_support import (
    CHROMIUM,
    Console,
    DashboardServer,
    browser_missing,
    sign_in,
)
from tests.worker_helpers import start_worker_process

pytestmark = [pytest.mark.slow, pytest.mark.timeout(180)]
_MISSING = browser_missing()
if _MISSING:
    pytest.skip(f"browser tests skipped: {_MISSING}", allow_module_level=True)

from playwright.sync_api import sync_playwright  # noqa: E402


def _open_field(page: Any, selector: str) -> None:
    """Open the form group (a ``<details>``) holding ``selector``, if it is closed."""
    page.evaluate(
        """(sel) => { const el = document.querySelector(sel);
             const d = el && el.closest('details'); if (d) d.open = true; }""",
        selector,
    )


@pytest.fixture
def workers_lab(tmp_path: Path) -> Iterator[tuple[DashboardServer, str, Any, Any]]:
    url = f"sqlite:///{tmp_path / 'sharded.db'}"
    sessions = open_database(url)
    with session_scope(sessions) as s:
        _, secret = auth.create_token(s, scopes=["run"], name="browser")
        _, worker_token = auth.create_token(s, scopes=["worker"], name="loadgen")
    sim = start_simulator_thread(SimConfig(ttft_ms=5, itl_ms=2, seed=17))
    env = {"TOKENTRACE_DEFAULT_TARGET_URL": sim.base_url,
           "TOKENTRACE_DEFAULT_TARGET_MODEL": "tokentrace-sim"}  # fmt: skip
    srv = DashboardServer(url, tmp_path / "server.log", local_worker=True, env=env)
    proc: subprocess.Popen[bytes] | None = None
    try:
        proc = start_worker_process(srv.url, worker_token, tmp_path / "w1", "--kind", "bench")
        yield srv, secret, sessions, sim
    finally:
        if proc is not None:
            proc.terminate()
            try:
                proc.wait(10)
            except subprocess.TimeoutExpired:
                proc.kill()
        srv.stop()
        sim.stop()


def test_a_sweep_over_two_workers_from_the_form(
    workers_lab: tuple[DashboardServer, str, Any, Any],
) -> None:
    srv, secret, sessions, sim = workers_lab
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, args=["--no-sandbox"])
        page = browser.new_context(viewport={"width": 1400, "height": 1000}).new_page()
        con = Console(page)
        sign_in(page, srv, secret, "/launch/sweep")
        page.fill("#f-name", "two workers")
        page.select_option("#f-sweep_mode", "rates")
        page.fill("#f-loads", "20, 40")
        page.fill("#f-min_ratio", "0.01")  # both steps run
        for sel, value in (("#f-num_prompts", "12"), ("#f-input_len", "16"),
                           ("#f-output_len", "6"), ("#f-shards", "2")):  # fmt: skip
            _open_field(page, sel)
            page.fill(sel, value)
        with page.expect_navigation():
            page.click("#sweep-submit")
        m = re.search(r"/sweeps/(sw[0-9a-f]+)$", page.url)
        assert m, (page.url, page.content()[:2000])
        sweep_id = m.group(1)
        assert "dealt over 2 workers" in page.inner_text("#sweep-shards")

        deadline = time.monotonic() + 120
        status = None
        while time.monotonic() < deadline:  # the page follows the sweep by itself
            try:
                status = page.inner_text("#sweep-status", timeout=1000)
            except Exception:  # between two loads
                status = None
            if status not in (None, "queued", "running"):
                break
            time.sleep(0.3)
        assert status == "succeeded", (status, srv.log_path.read_text()[-3000:])
        links = page.locator("#steps-table tbody tr a[href^='/runs/']")
        assert links.count() == 2
        run_ids = [str(links.nth(i).get_attribute("href")).rsplit("/", 1)[-1] for i in range(2)]
        for run_id in run_ids:
            page.goto(f"{srv.url}/runs/{run_id}")
            rows = page.locator("#shard-table tbody tr")
            assert rows.count() == 2, page.inner_text("#shards")
        assert con.problems() == []
        browser.close()

    seen = sim.ground_truth()["requests"]
    with session_scope(sessions) as s:
        steps = compare_repo.sweep_steps(s, sweep_id)
        assert [st.run_id for st in steps] == run_ids
        stored: list[str] = []
        for run_id in run_ids:
            recs = [r for r in repo.load_records(s, run_id) if not r.warmup]
            assert sorted(r.index for r in recs) == list(range(12)), run_id
            assert {r.shard for r in recs} == {0, 1}, run_id
            stored += [f"{run_id}-{r.index}" for r in recs]
    # what the target saw, by request id: each step's 12 requests, once each
    assert sorted(rid for rid in seen if rid.split("-")[0] in run_ids) == sorted(stored)
