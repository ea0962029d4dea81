"""Browser paint benchmark: how long headless Chromium takes to draw the first chart of a run
page, on the first visit (plotly.js downloaded) and on later visits (plotly.js from the
browser cache: it is served under a content-hashed URL with an immutable Cache-Control).

    python benchmarks/bench_browser_paint.py [--requests 2050] [--tokens 500] [--repeat 7]
        [--out benchmarks/results/browser_paint.json]

Builds the same 1M-event run as bench_pages.py (a temporary SQLite file), serves it with
uvicorn on loopback (tests/browser_support.DashboardServer) and opens /runs/{id} in
Debian's Chromium through Playwright. The time of a visit: from the navigation's start
(``performance.timeOrigin``) until the first chart div holds Plotly's SVG with a drawn
trace (``.main-svg g.trace``), polled every animation frame. Each later visit goes to the
runs page first, then back to the run page, in the same browser context (its HTTP cache).
Also recorded: the bytes plotly.min.js took over the network on each visit
(``transferSize``: 0 when it came from the cache), and where the time goes (navigation
timing, from the start of the navigation): the server's first byte, the whole HTML
received, and the page's scripts run (``domContentLoadedEventStart``: plotly.js and
app.js evaluated; the charts are drawn after it). Target: a cached visit paints in <= 1 s.
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

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))
sys.path.insert(0, str(HERE))

from bench_pages import build_records, store  # noqa: E402

from tests.browser_support import CHROMIUM, DashboardServer, browser_missing  # noqa: E402

TARGET_S = 1.0
FIRST_CHART = """() => {
  const d = document.querySelector('[data-figure]');
  return !!(d && d.querySelector('.main-svg g.trace'));
}"""
NAV_TIMES = """() => {
  const n = performance.getEntriesByType('navigation')[0];
  return {server_first_byte_ms: n.responseStart, html_received_ms: n.responseEnd,
          scripts_run_ms: n.domContentLoadedEventStart};
}"""
PLOTLY_BYTES = """() => performance.getEntriesByType('resource')
  .filter((e) => e.name.includes('/static/plotly.min.'))
  .map((e) => e.transferSize)"""


def visit(page: Any, url: str) -> dict[str, Any]:
    page.goto(url, wait_until="commit")
    page.wait_for_function(FIRST_CHART, polling="raf", timeout=60_000)
    paint_ms = float(page.evaluate("() => performance.now()"))
    page.wait_for_load_state("load")
    return {
        "first_chart_ms": paint_ms,
        **page.evaluate(NAV_TIMES),
        "plotly_transfer_bytes": page.evaluate(PLOTLY_BYTES),
    }


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--requests", type=int, default=2050)  # ~1.0M events, as bench_pages.py
    ap.add_argument("--tokens", type=int, default=500)
    ap.add_argument("--repeat", type=int, default=7, help="cached visits")
    ap.add_argument("--out", type=Path, default=HERE / "results" / "browser_paint.json")
    args = ap.parse_args()
    missing = browser_missing()
    if missing:
        sys.stderr.write(f"bench_browser_paint: {missing}\n")
        return 2
    from playwright.sync_api import sync_playwright

    with tempfile.TemporaryDirectory() as tmp:
        url = f"sqlite:///{tmp}/paint.db"
        t0 = time.perf_counter()
        records = build_records(args.requests, args.tokens)
        n_events = sum(int(r.event_t_ns.shape[0]) for r in records)
        run_id = store(url, records)
        del records
        build_s = time.perf_counter() - t0
        server = DashboardServer(url, Path(tmp) / "server.log", local_worker=False)
        try:
            page_url = f"{server.url}/runs/{run_id}"
            with sync_playwright() as p:
                browser = p.chromium.launch(executable_path=CHROMIUM, args=["--no-sandbox"])
                ctx = browser.new_context(viewport={"width": 1400, "height": 1000})
                page = ctx.new_page()
                first = visit(page, page_url)
                cached = []
                for _ in range(args.repeat):
                    page.goto(server.url + "/")
                    cached.append(visit(page, page_url))
                browser_version = browser.version
                browser.close()
        finally:
            server.stop()

    times = [c["first_chart_ms"] for c in cached]
    result: dict[str, Any] = {
        "python": platform.python_version(),
        "machine": platform.machine(),
        "cpus": os.cpu_count(),
        "load_average_1m_after": os.getloadavg()[0],  # timings are noisy when this is high
        "browser": f"Chromium {browser_version} (headless)",
        "requests": args.requests,
        "tokens_per_request": args.tokens,
        "events": n_events,
        "build_and_store_s": build_s,
        "target_s": TARGET_S,
        "first_visit": first,
        "cached_visits": {
            "first_chart_median_ms": statistics.median(times),
            "first_chart_max_ms": max(times),
            "breakdown_median_ms": {
                k: statistics.median(c[k] for c in cached)
                for k in ("server_first_byte_ms", "html_received_ms", "scripts_run_ms")
            },
            "n": len(times),
            "plotly_transfer_bytes": sorted(
                {b for c in cached for b in c["plotly_transfer_bytes"]}
            ),
        },
        "within_target": statistics.median(times) <= TARGET_S * 1000,
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=2) + "\n")
    print(f"run of {args.requests} requests x {args.tokens} tokens = {n_events:,} events")
    print(
        f"first visit: first chart at {first['first_chart_ms']:.0f} ms "
        f"(plotly.js {first['plotly_transfer_bytes']} bytes over the network)"
    )
    c = result["cached_visits"]
    print(
        f"cached visits: first chart median {c['first_chart_median_ms']:.0f} ms, "
        f"max {c['first_chart_max_ms']:.0f} ms over {c['n']} "
        f"(plotly.js bytes over the network: {c['plotly_transfer_bytes']}); "
        f"target <= {TARGET_S * 1000:.0f} ms: {'met' if result['within_target'] else 'NOT met'}"
    )
    print(json.dumps(result))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
