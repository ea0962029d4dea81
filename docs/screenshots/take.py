"""Take the README's screenshots (runs, a run, its requests table sorted by TTFT, a sweep,
the workers page): real runs and a sweep against the simulator, the dashboard served by
uvicorn with its embedded worker, pictures by headless Chromium (Playwright,
/usr/bin/chromium).

    .venv/bin/python docs/screenshots/take.py
"""

from __future__ import annotations

import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parents[1]))

from app.services.runs import open_database  # noqa: E402
from app.targets.sim_config import SimConfig  # noqa: E402
from tests.browser_support import CHROMIUM, DashboardServer  # noqa: E402
from tests.web_support import bench  # noqa: E402


def sweep(sessions: object) -> str:
    """A rate sweep against the simulator, run here (its steps are stored runs)."""
    from app.client.spec import RunSpec
    from app.client.sweep_plan import SweepPlan
    from app.services.sweeps import execute_sweep
    from app.targets.simulator import start_simulator_thread

    sim = start_simulator_thread(
        SimConfig(ttft_ms=30, itl_ms=3, itl_per_active_ms=0.2, seed=11)
    )
    try:
        spec = RunSpec(
            base_url=sim.base_url,
            model="tokentrace-sim",
            num_prompts=80,
            input_len=128,
            output_len=48,
            seed=11,
            goodput={"ttft": 120.0, "e2el": 1500.0},
        )
        plan = SweepPlan("rates", (5.0, 10.0, 20.0, 40.0))
        out = execute_sweep(spec, plan, sessions=sessions, name="rates 5-40 req/s")  # type: ignore[arg-type]
    finally:
        sim.stop()
    return out.sweep_id


def seed(tmp: Path) -> tuple[str, str, str]:
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
    return url, main, sweep(sessions)


def main() -> None:
    from playwright.sync_api import sync_playwright

    with tempfile.TemporaryDirectory() as tmp:
        url, run_id, sweep_id = seed(Path(tmp))
        srv = DashboardServer(url, Path(tmp) / "server.log", local_worker=True)
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
                page.set_viewport_size({"width": 1440, "height": 900})
                page.goto(f"{srv.url}/runs/{run_id}/requests?sort=ttft&dir=desc")
                page.screenshot(path=str(HERE / "requests.png"))
                page.set_viewport_size({"width": 1440, "height": 1800})
                page.goto(f"{srv.url}/sweeps/{sweep_id}")
                page.wait_for_function("document.querySelector('.js-plotly-plot .main-svg')")
                page.wait_for_timeout(500)
                page.screenshot(path=str(HERE / "sweep.png"))
                page.set_viewport_size({"width": 1440, "height": 700})
                page.goto(f"{srv.url}/workers")
                page.wait_for_timeout(300)
                page.screenshot(path=str(HERE / "workers.png"))
                browser.close()
        finally:
            srv.stop()
    print(f"wrote {', '.join(SHOTS)} in {HERE}")


SHOTS = ("runs.png", "run.png", "requests.png", "sweep.png", "workers.png")


if __name__ == "__main__":
    main()
