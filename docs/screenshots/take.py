"""Take docs/screenshots/runs.png and run.png: real runs against the simulator, the
dashboard served by uvicorn, pictures by headless Chromium (Playwright, /usr/bin/chromium).

    .venv/bin/python docs/screenshots/take.py
"""

from __future__ import annotations

import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parents[1]))

from app.targets.sim_config import SimConfig  # noqa: E402
from app.services.runs import open_database  # noqa: E402
from tests.browser_support import CHROMIUM, DashboardServer  # noqa: E402
from tests.web_support import bench  # noqa: E402


def seed(tmp: Path) -> tuple[str, str]:
    url = f"sqlite:///{tmp / 'shots.db'}"
    sessions = open_database(url)
    sim = SimConfig(ttft_ms=40, per_input_token_ms=0.05, itl_ms=4, itl_jitter_ms=1, seed=7)
    slos = {"ttft": 80.0, "e2el": 1500.0}
    common = {"input_len": 256, "output_len": 128, "goodput": slos, "seed": 7}
    bench(
        sessions,
        sim,
        "baseline 10 req/s",
        num_prompts=100,
        request_rate=10.0,
        tags=["baseline"],
        **common,
    )
    bench(sessions, sim, "20 req/s", num_prompts=150, request_rate=20.0, tags=["sweep"], **common)
    bench(
        sessions,
        SimConfig(ttft_ms=40, itl_ms=4, itl_per_active_ms=0.15, error_rate=0.03, seed=8),
        "50 req/s, loaded",
        num_prompts=200,
        request_rate=50.0,
        tags=["sweep"],
        **common,
    )
    main = bench(
        sessions,
        SimConfig(
            ttft_ms=40,
            per_input_token_ms=0.05,
            itl_ms=4,
            itl_jitter_ms=1.5,
            itl_per_active_ms=0.05,
            error_rate=0.02,
            seed=9,
        ),
        "sim 30 req/s, 256 in / 128 out",
        num_prompts=300,
        request_rate=30.0,
        tags=["sweep", "docs"],
        **common,
    )
    return url, main


def main() -> None:
    from playwright.sync_api import sync_playwright

    with tempfile.TemporaryDirectory() as tmp:
        url, run_id = seed(Path(tmp))
        srv = DashboardServer(url, Path(tmp) / "server.log", local_worker=False)
        try:
            with sync_playwright() as p:
                browser = p.chromium.launch(executable_path=CHROMIUM, args=["--no-sandbox"])
                page = browser.new_page(viewport={"width": 1440, "height": 900})
                page.goto(srv.url + "/")
                page.screenshot(path=str(HERE / "runs.png"))
                page.set_viewport_size({"width": 1440, "height": 2200})
                page.goto(f"{srv.url}/runs/{run_id}")
                page.wait_for_function("document.getElementById('plot-throughput').data")
                page.wait_for_timeout(500)
                page.screenshot(path=str(HERE / "run.png"))
                browser.close()
        finally:
            srv.stop()
    print(f"wrote {HERE / 'runs.png'} and {HERE / 'run.png'}")


if __name__ == "__main__":
    main()
