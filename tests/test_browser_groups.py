"""A run of a model mix over two targets, its page in headless Chromium: the tables by model
and by target show the stored figures (requests, ok, failed, TTFT p50/p99, TPOT p50, output
tokens/s; checked against the raw export in ``test_model_mix``), each target's ``/metrics``
scrape is named, and the console is clean."""

from __future__ import annotations

import contextlib
import io
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from app.cli.main import main as cli_main
from app.storage.db import upgrade_database
from app.targets.sim_config import SimConfig
from app.targets.simulator import start_simulator_thread
from app.web.context import fmt_num
from tests.browser_support import CHROMIUM, Console, DashboardServer, browser_missing

pytestmark = pytest.mark.slow
_MISSING = browser_missing()
if _MISSING:
    pytest.skip(f"browser tests skipped: {_MISSING}", allow_module_level=True)

from playwright.sync_api import sync_playwright  # noqa: E402

DIGITS = {"ttft_p50_ms": 2, "ttft_p99_ms": 2, "tpot_p50_ms": 2, "output_tok_s": 1}


@pytest.fixture(scope="module")
def served(
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[tuple[DashboardServer, dict[str, Any], list[str]]]:
    tmp: Path = tmp_path_factory.mktemp("browser-groups")
    url = f"sqlite:///{tmp / 'b.db'}"
    upgrade_database(url)
    sims = [
        start_simulator_thread(SimConfig(ttft_ms=1 + k, itl_ms=0.5, output_len=4, seed=k))
        for k in range(2)
    ]
    try:
        out = io.StringIO()
        argv = ["bench", "--model", "base:0.6,lora-a:0.4", "--num-prompts", "12",
                "--input-len", "8", "--output-len", "4", "--max-concurrency", "3",
                "--database-url", url, "--json"]  # fmt: skip
        for s in sims:
            argv += ["--base-url", s.base_url]
        with contextlib.redirect_stdout(out):
            assert cli_main(argv) == 0
        report = json.loads(out.getvalue())
    finally:
        for s in sims:
            s.stop()
    srv = DashboardServer(url, tmp / "server.log", local_worker=False)
    try:
        yield srv, report, [s.base_url for s in sims]
    finally:
        srv.stop()


def test_the_tables_by_model_and_by_target(
    served: tuple[DashboardServer, dict[str, Any], list[str]],
) -> None:
    srv, report, urls = served
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, args=["--no-sandbox"])
        try:
            page = browser.new_context(viewport={"width": 1400, "height": 1000}).new_page()
            con = Console(page)
            resp = page.goto(f"{srv.url}/runs/{report['run_id']}")
            assert resp is not None and resp.status == 200
            for dim in ("model", "target"):
                rows = report["groups"][dim]
                assert len(rows) == 2
                for g in rows:
                    sel = f"#group-{dim}-table tr[data-{dim}='{g[dim]}'] td"
                    cells = page.locator(sel).all_inner_texts()
                    want = [
                        str(g[dim]),
                        str(g["requests"]),
                        str(g["ok"]),
                        str(g["failed"]),
                        *(fmt_num(g[k], d) for k, d in DIGITS.items()),
                    ]
                    assert [c.strip() for c in cells] == want, (dim, cells, want)
            for u in urls:
                scrape = page.locator(f"[data-scrape-target='{u}']").inner_text()
                assert scrape.startswith(f"{u}: ok (")
            assert not con.problems(), con.problems()
        finally:
            browser.close()
