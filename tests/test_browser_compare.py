"""The comparison page in headless Chromium: comparability first, verdicts, overlaid CDFs,
and the options form."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from app.services.runs import open_database
from app.storage import compare_repo
from app.storage.db import session_scope
from app.targets.sim_config import SimConfig
from tests.browser_support import (
    CHROMIUM,
    Console,
    DashboardServer,
    assert_drawn,
    browser_missing,
    wait_js,
)
from tests.live_server import free_port
from tests.web_support import bench

pytestmark = pytest.mark.slow
Runs = tuple[str, str, str, str, str]  # db url, fast, slow, fp8, client-limited
_MISSING = browser_missing()
if _MISSING:
    pytest.skip(f"browser tests skipped: {_MISSING}", allow_module_level=True)

from playwright.sync_api import Page, sync_playwright  # noqa: E402

# a loaded test box can make any client fall 10 ms behind: these runs must stay valid
OK = {"num_prompts": 60, "client_lag_bound_ms": 1000.0}


@pytest.fixture(scope="module")
def sim_port() -> int:
    """One port for the simulators started one after another: their runs measured one
    target (another port is another server)."""
    return free_port()


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory, sim_port: int) -> Runs:
    tmp: Path = tmp_path_factory.mktemp("cmp")
    url = f"sqlite:///{tmp / 'cmp.db'}"
    sessions = open_database(url)
    fast_sim = SimConfig(ttft_ms=30, itl_ms=2, seed=1, port=sim_port)
    fast = bench(sessions, fast_sim, "fast", **OK)
    slow = bench(sessions, SimConfig(ttft_ms=90, itl_ms=2, seed=1, port=sim_port), "slow", **OK)
    other = bench(sessions, fast_sim, "fp8", dtype="fp8", seed=9, **OK)
    limited = bench(
        sessions, fast_sim, "limited", num_prompts=60,
        client_lag_bound_ms=0.001,  # any send lag is over this bound: a client-limited run
    )  # fmt: skip
    return url, fast, slow, other, limited


@dataclass(frozen=True)
class Sweeps:
    fast: str  # "sweep fast": a fast run @ 1, a client-limited one @ 2; created first
    slow: str  # "sweep slow": two slow runs (3x TTFT) @ 1 and @ 2
    limited: str  # the client-limited step run of "sweep fast"
    elsewhere: str  # a run of the fast configuration against another port
    other_port: int


@pytest.fixture(scope="module")
def sweeps(runs: Runs, sim_port: int) -> Sweeps:
    """Two sweeps of their own runs (a sweep's steps are folded away on the runs list,
    which the tests above use), and a run against another server."""
    sessions = open_database(runs[0])
    fast = SimConfig(ttft_ms=30, itl_ms=2, seed=1, port=sim_port)
    slow = SimConfig(ttft_ms=90, itl_ms=2, seed=1, port=sim_port)
    few = OK | {"num_prompts": 30}
    steps = {
        "sweep fast": (
            bench(sessions, fast, "fast step", **few),
            bench(sessions, fast, "limited step", num_prompts=30, client_lag_bound_ms=0.001),
        ),
        "sweep slow": (
            bench(sessions, slow, "slow step 1", **few),
            bench(sessions, slow, "slow step 2", **few),
        ),
    }
    other_port = free_port()
    far = SimConfig(ttft_ms=30, itl_ms=2, seed=1, port=other_port)
    elsewhere = bench(sessions, far, "elsewhere", **OK)
    made = []
    for name, run_ids in steps.items():
        with session_scope(sessions) as s:
            sweep_id = compare_repo.create_sweep(
                s, spec={}, mode="rates", loads=[1.0, 2.0], name=name, status="succeeded"
            )
            for k, run_id in enumerate(run_ids):
                compare_repo.add_step(
                    s, sweep_id, step_idx=k, run_id=run_id, load=k + 1.0, load_kind="rate"
                )
        made.append(sweep_id)
    return Sweeps(made[0], made[1], steps["sweep fast"][1], elsewhere, other_port)


@pytest.fixture(scope="module")
def page(
    runs: Runs, sweeps: Sweeps, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[tuple[Page, str]]:
    """Chromium on the dashboard, once every run and sweep is stored (benchmarks run their
    own event loop: before Playwright's)."""
    srv = DashboardServer(runs[0], tmp_path_factory.mktemp("log") / "s.log", local_worker=False)
    try:
        with sync_playwright() as p:
            b = p.chromium.launch(executable_path=CHROMIUM, args=["--no-sandbox"])
            pg = b.new_context(viewport={"width": 1400, "height": 1000}).new_page()
            yield pg, srv.url
            b.close()
    finally:
        srv.stop()


def _points(page: Page, div_id: str) -> int:
    js = """(id) => { const d = document.getElementById(id);
      if (!d || !d.data) return -1;
      return d.data.reduce((n, t) => n + ((t.x || []).length), 0); }"""
    return int(page.evaluate(js, div_id))


def test_comparison_page(page: tuple[Page, str], runs: Runs) -> None:
    pg, base = page
    _, fast, slow, _other, _ = runs
    errors: list[str] = []
    pg.on("console", lambda m: errors.append(m.text) if m.type == "error" else None)
    pg.on("pageerror", lambda e: errors.append(str(e)))
    resp = pg.goto(f"{base}/compare?ids={fast}&ids={slow}")
    assert resp is not None and resp.status == 200
    pg.wait_for_load_state("load")
    assert "same workload and setup" in pg.locator("#comparability-message").inner_text()
    cell = pg.locator('td.verdict-cell[data-metric="ttft_ms"][data-p="p50"]')
    assert cell.get_attribute("data-verdict") == "regressed"
    assert "regressed" in pg.locator("#overall-verdict").inner_text()
    wait_js(pg, "() => !!document.getElementById('plot-cdf_ttft_ms').data")
    assert _points(pg, "plot-cdf_ttft_ms") > 100  # two overlaid CDFs
    assert int(pg.evaluate("document.getElementById('plot-cdf_ttft_ms').data.length")) == 2
    # a huge threshold turns every verdict into "no significant change"
    pg.fill("#threshold", "500")
    pg.click("#compare-options button[type=submit]")
    pg.wait_for_load_state("load")
    assert "threshold_pct=500" in pg.url
    assert pg.locator('td.verdict-cell[data-verdict="regressed"]').count() == 0
    assert errors == []


def test_comparability_warning_comes_before_verdicts(page: tuple[Page, str], runs: Runs) -> None:
    pg, base = page
    _, fast, _, other, _ = runs
    pg.goto(f"{base}/compare?ids={fast}&ids={other}")
    msg = pg.locator("#comparability-message").inner_text()
    assert "not a one-variable comparison" in msg and "dtype" in msg and "seed" in msg
    order = pg.evaluate(
        "() => document.getElementById('comparability').compareDocumentPosition("
        "document.getElementById('compare-table'))"
    )
    assert int(order) & 4  # DOCUMENT_POSITION_FOLLOWING: the table comes after
    rows = pg.locator("#key-diff tbody tr").all_inner_texts()
    assert any("dtype" in r and "fp8" in r for r in rows)


def _heading(pg: Page) -> str:
    return " ".join(pg.locator("#compare-heading").inner_text().split())


def test_the_user_chooses_the_baseline(page: tuple[Page, str], runs: Runs) -> None:
    """Ticked in table order (newest first) the new run used to become the baseline and
    every verdict flipped. The oldest is the default; a radio button picks another."""
    pg, base = page
    _, fast, slow, _, _ = runs
    errors: list[str] = []
    pg.on("console", lambda m: errors.append(m.text) if m.type == "error" else None)
    pg.goto(f"{base}/compare?ids={slow}&ids={fast}")  # slow listed first, fast is older
    assert _heading(pg).startswith("fast (baseline) vs slow")
    cell = 'td.verdict-cell[data-metric="ttft_ms"][data-p="p50"]'
    assert pg.locator(cell).get_attribute("data-verdict") == "regressed"
    pg.check(f"#base-{slow}")
    with pg.expect_navigation():
        pg.click("#compare-options button[type=submit]")
    assert f"base={slow}" in pg.url
    assert _heading(pg).startswith("slow (baseline) vs fast")
    assert pg.locator(cell).get_attribute("data-verdict") == "improved"
    assert pg.locator(f"#base-{slow}").is_checked()
    # from the runs list: tick two runs and the baseline's radio button
    pg.goto(base + "/")
    pg.check(f"input.pick[value='{fast}']")
    pg.check(f"input.base-pick[value='{slow}']")  # ticks its compare box too
    assert pg.locator(f"input.pick[value='{slow}']").is_checked()
    assert "baseline: slow" in pg.locator("#compare-count").inner_text()
    with pg.expect_navigation():
        pg.click("#compare-btn")
    assert _heading(pg).startswith("slow (baseline) vs fast")
    assert pg.locator(cell).get_attribute("data-verdict") == "improved"
    assert errors == []


def test_a_client_limited_run_is_flagged_wherever_it_is_shown(
    page: tuple[Page, str], runs: Runs
) -> None:
    pg, base = page
    _, fast, _, _, limited = runs
    pg.goto(f"{base}/compare?ids={fast}&ids={limited}")
    warn = pg.locator("#compare-warnings")
    assert warn.count() == 1 and "client-limited" in warn.inner_text()
    assert "limited" in warn.locator(f"li[data-run-id='{limited}']").inner_text()
    assert warn.locator(f"li[data-run-id='{fast}']").count() == 0
    assert "not to be trusted" in pg.locator("#verdict-caveat").inner_text()
    assert pg.locator("td.pair-verdict").get_attribute("data-untrusted") == "yes"
    order = pg.evaluate(
        "() => document.getElementById('compare-warnings').compareDocumentPosition("
        "document.getElementById('compare-table'))"
    )
    assert int(order) & 4  # the warning comes before the verdicts
    pg.goto(f"{base}/compare?ids={fast}&ids={runs[2]}")  # two trustworthy runs: no warning
    assert pg.locator("#compare-warnings").count() == 0
    assert pg.locator("td.pair-verdict").get_attribute("data-untrusted") == "no"
    pg.goto(base + "/")
    row = pg.locator(f"#runs-table tr[data-run-id='{limited}']")
    assert "⚠ client-limited" in row.inner_text()
    assert pg.locator(f"#runs-table tr[data-run-id='{fast}'] .trust-warning").count() == 0
    pg.goto(f"{base}/runs/{limited}")
    assert "client-limited" in pg.locator("#trust-warnings").inner_text()
    assert pg.locator("#card-validity .value").inner_text() == "client-limited"


def _message(pg: Page) -> str:
    return " ".join(pg.locator("#comparability-message").inner_text().split())


def test_runs_against_another_server_say_the_target_differs(
    page: tuple[Page, str], runs: Runs, sweeps: Sweeps, sim_port: int
) -> None:
    """Two runs of one workload against two servers: not "every key field matches" but the
    target differs, each shown; the user can name the target as the variable under test,
    or another field (then the target is the unexpected difference)."""
    pg, base = page
    con = Console(pg)
    fast = runs[1]
    here = f"http://127.0.0.1:{sim_port} · vllm /metrics · serves tokentrace-sim"
    there = f"http://127.0.0.1:{sweeps.other_port} · vllm /metrics · serves tokentrace-sim"
    pg.goto(f"{base}/compare?ids={fast}&ids={sweeps.elsewhere}")
    assert _message(pg) == (
        f"one variable under test: target (URL and server identity); target differs: {here} "
        f"vs {there}"
    )
    row = pg.locator("#key-diff tr[data-field='target']")
    assert row.locator("td").all_inner_texts() == [
        "target (URL and server identity)", here, there
    ]  # fmt: skip
    assert "bad" not in (row.get_attribute("class") or "")
    pg.select_option("#compare-options select[name=variable]", "seed")
    with pg.expect_navigation():
        pg.click("#compare-options button[type=submit]")
    assert "variable=seed" in pg.url
    assert _message(pg).startswith("not a one-variable comparison: the runs also differ in target")
    assert f"target differs: {here} vs {there}" in _message(pg)
    assert "bad" in (pg.locator("#key-diff tr[data-field='target']").get_attribute("class") or "")
    pg.select_option("#compare-options select[name=variable]", "target")
    with pg.expect_navigation():
        pg.click("#compare-options button[type=submit]")
    assert _message(pg).startswith("one variable under test: target")
    # the same server twice: nothing differs
    pg.goto(f"{base}/compare?ids={fast}&ids={runs[2]}")
    assert _message(pg) == "same workload and setup: every key field matches"
    assert con.problems() == []


def _legend(pg: Page, div: str) -> list[str]:
    """The names drawn in a chart's legend (its SVG text)."""
    texts: list[str] = pg.evaluate(
        "(id) => Array.from(document.querySelectorAll('#' + id + ' .legend text'))"
        ".map((t) => t.textContent)",
        div,
    )
    return texts


def _sweep_heading(pg: Page) -> str:
    return " ".join(pg.locator("#sweep-compare-heading").inner_text().split())


def test_sweep_comparison_baseline_picker_labels_and_flags(
    page: tuple[Page, str], sweeps: Sweeps
) -> None:
    """Listed newest first, the oldest sweep is the baseline all the same; it is labelled
    in the heading, the list, the legends and the tables; the client-limited step is
    flagged as run comparisons flag runs; the picker makes the other sweep the baseline
    and every verdict reads the other way."""
    pg, base = page
    con = Console(pg)
    limited = sweeps.limited
    pg.goto(f"{base}/compare?sweeps={sweeps.slow}&sweeps={sweeps.fast}")
    assert_drawn(pg)
    assert _sweep_heading(pg).startswith("sweep fast (baseline) vs sweep slow")
    assert pg.locator(f"#sweep-base-{sweeps.fast}").is_checked()
    assert "(baseline)" in pg.locator(f"#sweep-list li[data-sweep-id='{sweeps.fast}']").inner_text()
    assert (
        "(baseline)"
        not in pg.locator(f"#sweep-list li[data-sweep-id='{sweeps.slow}']").inner_text()
    )
    assert "sweep fast (baseline)" in _legend(pg, "plot-sweep_tput")
    assert "sweep fast (baseline) p50" in _legend(pg, "plot-sweep_load_ttft_ms")
    assert "sweep slow" in _legend(pg, "plot-sweep_tput")
    head = " ".join(pg.locator("#sweep-table-0 thead").inner_text().split())
    assert "baseline run sweep fast" in head and "candidate run sweep slow" in head
    assert (
        pg.locator("#sweep-pair-0 h3")
        .inner_text()
        .startswith("sweep slow vs sweep fast (baseline)")
    )
    one, two = "#sweep-table-0 tr[data-load='1']", "#sweep-table-0 tr[data-load='2']"
    ttft = "td[data-metric='ttft_ms']"
    assert pg.locator(f"{one} {ttft}").get_attribute("data-verdict") == "regressed"
    assert pg.locator(f"{one} td.pair-verdict").get_attribute("data-untrusted") == "no"
    assert pg.locator(f"{two} td.pair-verdict").get_attribute("data-untrusted") == "yes"
    assert "not trustworthy" in pg.locator(f"{two} td.pair-verdict").inner_text()
    cell = pg.locator(f"{two} td.step-run[data-run-id='{limited}']")
    assert "⚠ client-limited" in cell.inner_text()
    warn = pg.locator("#compare-warnings")
    assert warn.count() == 1 and warn.locator("li").count() == 1
    item = warn.locator(f"li[data-run-id='{limited}']").inner_text()
    assert "limited step" in item and "load 2 of sweep fast (baseline)" in item
    assert "client-limited" in item
    assert "not to be trusted" in pg.locator("#verdict-caveat").inner_text()
    order = pg.evaluate(
        "() => document.getElementById('compare-warnings').compareDocumentPosition("
        "document.getElementById('sweep-table-0'))"
    )
    assert int(order) & 4  # the warning comes before the verdicts
    # the picker: the slow sweep as the baseline
    pg.check(f"#sweep-base-{sweeps.slow}")
    with pg.expect_navigation():
        pg.click("#sweep-base-apply")
    assert f"base={sweeps.slow}" in pg.url
    assert_drawn(pg)
    assert _sweep_heading(pg).startswith("sweep slow (baseline) vs sweep fast")
    assert pg.locator(f"#sweep-base-{sweeps.slow}").is_checked()
    legend = _legend(pg, "plot-sweep_tput")
    assert "sweep slow (baseline)" in legend and "sweep fast (baseline)" not in legend
    assert pg.locator(f"{one} {ttft}").get_attribute("data-verdict") == "improved"
    assert pg.locator(f"{two} td.pair-verdict").get_attribute("data-untrusted") == "yes"
    item = pg.locator(f"#compare-warnings li[data-run-id='{limited}']").inner_text()
    assert "load 2 of sweep fast" in item and "(baseline)" not in item
    assert con.problems() == []
