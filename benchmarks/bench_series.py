"""Series and report benchmark (issue 28's targets):

    python benchmarks/bench_series.py [--runs 1000] [--repeat 7] [--requests 2050]
        [--tokens 500] [--out benchmarks/results/series.json]

(a) A series of ``runs`` runs (each imported from a 20-request CSV log, as
    ``tokentrace import csv --series`` does, with TTFT shifts at 60% and 85% of the
    series), then ``repeat`` times: the series page (``GET /series/{name}``, rendered by the
    app through TestClient: server time, no network), its JSON (``GET
    /api/v1/series/{name}``), and the change points recomputed (``e_divisive`` on the
    trend's values, and the whole trend: read, values, change points described). Targets:
    page <= 1 s, change points <= 200 ms.
(b) The single-file report of a 1M-event run (bench_pages.py's run: 2,050 requests x 500
    tokens): its size, the time to write it, and in headless Chromium, opened from disk
    with every network request aborted, the time to its first chart (from the
    navigation's start until the renderer marked a chart drawn; median of ``repeat``).
    Targets: <= 10 MB, first chart <= 2 s.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))
sys.path.insert(0, str(HERE))

from bench_pages import build_records, store  # noqa: E402
from fastapi.testclient import TestClient  # noqa: E402

from app.analysis import change_points as cp  # noqa: E402
from app.analysis import series as sa  # noqa: E402
from app.api.app import create_app  # noqa: E402
from app.services import series as series_svc  # noqa: E402
from app.services.runs import open_database  # noqa: E402
from app.settings import Settings  # noqa: E402
from app.storage.db import session_scope  # noqa: E402
from app.web import report_html  # noqa: E402
from tests.browser_support import CHROMIUM, browser_missing  # noqa: E402
from tests.series_support import import_run  # noqa: E402

PAGE_TARGET_S = 1.0
CP_TARGET_S = 0.2
REPORT_TARGET_BYTES = 10 * 1000 * 1000
FIRST_CHART_TARGET_S = 2.0
NAME = "bench-series"


def stats(xs: list[float]) -> dict[str, float]:
    return {"median": statistics.median(xs), "max": max(xs), "min": min(xs)}


def build_series(url: str, tmp: Path, n: int) -> tuple[float, list[str]]:
    sessions = open_database(url)
    rng = np.random.default_rng(0)
    t0 = time.perf_counter()
    ids = []
    for i in range(n):
        level = 100.0 + (25.0 if i >= 0.6 * n else 0.0) - (15.0 if i >= 0.85 * n else 0.0)
        ttfts = [round(float(x), 2) for x in rng.normal(level, 3.0, 20)]
        rid = import_run(sessions, tmp, ttfts, name=f"r{i}")
        with session_scope(sessions) as s:
            series_svc.join_run(s, NAME, rid)
        series_svc.settle_run(sessions, rid)
        ids.append(rid)
    return time.perf_counter() - t0, ids


def series_case(n: int, repeat: int) -> dict[str, Any]:
    with tempfile.TemporaryDirectory() as tmp:
        url = f"sqlite:///{tmp}/series.db"
        build_s, _ids = build_series(url, Path(tmp), n)
        app = create_app(
            Settings(database_url=url, local_worker=False, alert_poll_s=3600,
                     allowed_hosts=["testserver"])
        )  # fmt: skip
        page_s, api_s, cp_s, trend_s = [], [], [], []
        with TestClient(app) as c:
            page_bytes = 0
            for _ in range(repeat):
                t0 = time.perf_counter()
                r = c.get(f"/series/{NAME}", params={"metric": "ttft:p99"})
                page_s.append(time.perf_counter() - t0)
                assert r.status_code == 200, r.text[:300]
                page_bytes = len(r.content)
                t0 = time.perf_counter()
                r = c.get(f"/api/v1/series/{NAME}", params={"metric": "ttft:p99"})
                api_s.append(time.perf_counter() - t0)
                assert r.status_code == 200
            trend = r.json()["trend"]
            values = [p["value"] for p in trend["points"] if p["counted"]]
            sessions = app.state.sessions
            for _ in range(repeat):
                t0 = time.perf_counter()
                found = cp.e_divisive(values)
                cp_s.append(time.perf_counter() - t0)
                t0 = time.perf_counter()
                series_svc.load_view(sessions, NAME, sa.DEFAULT_REF)
                trend_s.append(time.perf_counter() - t0)
    return {
        "runs": n,
        "build_s": build_s,
        "page_s": stats(page_s),
        "page_bytes": page_bytes,
        "api_s": stats(api_s),
        "change_points_s": stats(cp_s),
        "trend_with_change_points_s": stats(trend_s),
        "change_points_found": [c.index for c in found],
        "change_points_planted": [int(0.6 * n), int(0.85 * n)],
        "targets": {"page_s": PAGE_TARGET_S, "change_points_s": CP_TARGET_S},
        "met": {
            "page": statistics.median(page_s) <= PAGE_TARGET_S,
            "change_points": statistics.median(cp_s) <= CP_TARGET_S,
        },
    }


FIRST = "() => Number(document.body.dataset.firstChartMs || 0)"


def report_case(n_req: int, n_tok: int, repeat: int) -> dict[str, Any]:
    with tempfile.TemporaryDirectory() as tmp:
        url = f"sqlite:///{tmp}/report.db"
        records = build_records(n_req, n_tok)
        n_events = sum(int(r.event_t_ns.shape[0]) for r in records)
        run_id = store(url, records)
        del records
        sessions = open_database(url)
        write_s = []
        text = ""
        for _ in range(3):
            t0 = time.perf_counter()
            text = report_html.run_report(sessions, run_id)
            write_s.append(time.perf_counter() - t0)
        path = Path(tmp) / "report.html"
        path.write_text(text, encoding="utf-8")
        size = path.stat().st_size
        out: dict[str, Any] = {
            "events": n_events,
            "requests": n_req,
            "bytes": size,
            "plotly_js_bytes": len(
                (report_html.asset_dir("static") / "plotly.min.js").read_bytes()
            ),
            "write_s": stats(write_s),
            "charts": text.count("data-figure="),
        }
        missing = browser_missing()
        if missing:
            out["first_chart"] = f"not measured: {missing}"
            return out
        from playwright.sync_api import sync_playwright

        uri = path.as_uri()
        firsts, drawn_all = [], []
        with sync_playwright() as pw:
            browser = pw.chromium.launch(executable_path=CHROMIUM, args=["--no-sandbox"])
            version = browser.version
            for _ in range(repeat):
                ctx = browser.new_context(offline=True)
                aborted: list[str] = []

                def cut(route: Any, request: Any, aborted: list[str] = aborted) -> None:
                    if request.url == uri:
                        route.continue_()
                    else:
                        aborted.append(request.url)
                        route.abort()

                ctx.route("**/*", cut)
                page = ctx.new_page()
                page.goto(uri, wait_until="commit")
                page.wait_for_function(FIRST, polling="raf", timeout=60_000)
                firsts.append(float(page.evaluate(FIRST)) / 1000)
                page.wait_for_function("() => document.body.dataset.plotsDrawn === '1'")
                drawn_all.append(float(page.evaluate("() => performance.now()")) / 1000)
                assert aborted == [], aborted
                ctx.close()
            browser.close()
        out |= {
            "browser": f"Chromium {version} (headless), network cut",
            "first_chart_s": stats(firsts),
            "all_charts_s": stats(drawn_all),
        }
        out["targets"] = {"bytes": REPORT_TARGET_BYTES, "first_chart_s": FIRST_CHART_TARGET_S}
        out["met"] = {
            "bytes": size <= REPORT_TARGET_BYTES,
            "first_chart": statistics.median(firsts) <= FIRST_CHART_TARGET_S,
        }
        return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=int, default=1000)
    ap.add_argument("--repeat", type=int, default=7)
    ap.add_argument("--requests", type=int, default=2050)
    ap.add_argument("--tokens", type=int, default=500)
    ap.add_argument("--out", type=Path, default=HERE / "results" / "series.json")
    args = ap.parse_args()
    result = {
        "python": platform.python_version(),
        "machine": platform.machine(),
        "cpus": os.cpu_count(),
        "series": series_case(args.runs, args.repeat),
        "report": report_case(args.requests, args.tokens, args.repeat),
        "load_average_1m_after": os.getloadavg()[0],  # timings are noisy when this is high
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=2) + "\n")
    print(json.dumps(result, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
