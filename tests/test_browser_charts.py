"""Every page that shows a chart, in headless Chromium behind the app's own strict CSP:
Plotly drew each chart as SVG (one ``g.trace`` per trace, or the "no data" reason), no
WebGL fallback, no console error, no CSP violation. Pages without charts load clean too."""

from __future__ import annotations

import importlib.util
import re
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from app.probes.spec import ProbeSpec
from app.services import probes as probe_svc
from app.services.file_imports import import_path
from app.storage import compare_repo
from app.storage import jobs as job_repo
from app.storage import probes as probe_repo
from app.storage import repository as repo
from app.storage.db import session_scope
from app.targets.sim_config import SimConfig
from tests.browser_support import CHROMIUM, Console, DashboardServer, assert_drawn, browser_missing
from tests.web_support import Seeded, bench, seed

pytestmark = pytest.mark.slow
_MISSING = browser_missing()
if _MISSING:
    pytest.skip(f"browser tests skipped: {_MISSING}", allow_module_level=True)

from playwright.sync_api import Browser, Page, sync_playwright  # noqa: E402

GUIDELLM = Path(__file__).parent / "fixtures" / "interop" / "guidellm-benchmarks.json"
HAS_TORCH = importlib.util.find_spec("torch") is not None
HAS_TRANSFORMERS = importlib.util.find_spec("transformers") is not None
NEEDS_TORCH = pytest.mark.skipif(not HAS_TORCH, reason="probes need torch (extra: probes)")

# what the worker's NVML sampler uploads, about 1 Hz
TELEMETRY = [
    {"t_s": float(t), "util_pct": 40.0 + t, "power_w": 250.0 + 3 * t, "mem_used_mb": 9000.0,
     "sm_clock_mhz": 1980.0 - t}
    for t in range(12)
]  # fmt: skip


@dataclass(frozen=True)
class Lab:
    seeded: Seeded
    scraped: str  # a run with the target's server metrics
    limited: str  # a client-limited run
    guidellm: str  # a run imported from a GuideLLM file (a sweep step)
    sweep_id: str
    telemetry_job: str
    probes: dict[str, str]  # kind -> probe id (empty without torch)


def _probe(sessions: object, kind: str, params: dict[str, object]) -> str:
    from app.probes.runner import run_probe

    spec = ProbeSpec(kind=kind, device="cpu", name=f"cpu {kind}", params=params)  # type: ignore[arg-type]
    out = run_probe(spec)
    with session_scope(sessions) as s:  # type: ignore[arg-type]
        return probe_svc.store_local(
            s,
            spec,
            fingerprint=out.fingerprint,
            result=out.result,
            telemetry=out.telemetry,
            artifacts=[(a.name, a.content_type, a.data) for a in out.artifacts],
            error=None,
            max_artifact_bytes=64 * 2**20,
        )


@pytest.fixture(scope="module")
def lab(tmp_path_factory: pytest.TempPathFactory) -> Lab:
    seeded = seed(tmp_path_factory.mktemp("charts"))
    sessions = seeded.sessions
    scraped = bench(
        sessions, SimConfig(ttft_ms=20, itl_ms=5, seed=1), "scraped", num_prompts=24,
        request_rate=16.0, input_len=16, output_len=20,
    )  # fmt: skip
    limited = bench(
        sessions, SimConfig(ttft_ms=5, itl_ms=1, seed=4), "limited", num_prompts=40,
        client_lag_bound_ms=0.001,  # any send lag at all is over this bound
    )  # fmt: skip
    gl_runs = import_path(sessions, "guidellm", GUIDELLM, name="gl")
    with session_scope(sessions) as s:
        sweep_id = compare_repo.list_sweeps(s, limit=1)[0].id
        job = job_repo.create_job(
            s, kind="bench", spec={}, requirements={}, run_id=scraped, max_attempts=1
        )
        probe_repo.add_telemetry(s, job.id, 0, TELEMETRY)
        job_id = job.id
    probes: dict[str, str] = {}
    if HAS_TORCH:
        probes["ceilings"] = _probe(
            sessions, "ceilings",
            {"copy_mib": [1, 2], "square": [32], "llm_shapes": [[8, 32, 64]],
             "dtypes": ["fp32", "bf16"], "warmup": 1, "iters": 3},
        )  # fmt: skip
        probes["linear"] = _probe(
            sessions, "linear",
            {"width": 32, "batch": 2, "seq": 8, "sweep_max": 8, "warmup": 1, "iters": 3,
             "dtype": "fp32"},
        )  # fmt: skip
        if HAS_TRANSFORMERS:
            probes["batch_scaling"] = _probe(
                sessions, "batch_scaling",
                {"model_path": "random:tiny-llama", "input_len": 8, "output_len": 3,
                 "batches": [1, 2, 4], "dtype": "fp32"},
            )  # fmt: skip
    return Lab(seeded, scraped, limited, gl_runs[0], sweep_id, job_id, probes)


@pytest.fixture(scope="module")
def server(lab: Lab, tmp_path_factory: pytest.TempPathFactory) -> Iterator[DashboardServer]:
    log = tmp_path_factory.mktemp("logs") / "server.log"
    srv = DashboardServer(lab.seeded.url, log, local_worker=False)
    yield srv
    srv.stop()


@pytest.fixture(scope="module")
def browser(server: DashboardServer) -> Iterator[Browser]:
    with sync_playwright() as p:
        b = p.chromium.launch(executable_path=CHROMIUM, args=["--no-sandbox"])
        yield b
        b.close()


@pytest.fixture
def page(browser: Browser) -> Iterator[Page]:
    ctx = browser.new_context(viewport={"width": 1400, "height": 1000})
    pg = ctx.new_page()
    yield pg
    ctx.close()


def _open(page: Page, server: DashboardServer, path: str) -> Console:
    con = Console(page)
    resp = page.goto(server.url + path)
    assert resp is not None and resp.status == 200, path
    m = re.search(r"script-src ([^;]*)", resp.headers.get("content-security-policy", ""))
    assert m is not None and m.group(1).strip() == "'self'"  # the app's strict CSP is on
    return con


def _ids(found: list[dict[str, object]]) -> set[str]:
    return {str(c["id"]) for c in found}


def test_pages_without_charts_load_clean(page: Page, server: DashboardServer, lab: Lab) -> None:
    for path in ("/", f"/runs/{lab.seeded.normal}/requests", "/capacity", "/sweeps", "/probes"):
        con = _open(page, server, path)
        assert_drawn(page, expect=0)
        assert con.problems() == [], f"{path}: {con.problems()}"


def test_run_page_draws_every_chart_in_every_tab(
    page: Page, server: DashboardServer, lab: Lab
) -> None:
    con = _open(page, server, f"/runs/{lab.seeded.normal}")
    found = assert_drawn(page)
    assert {"plot-timeline", "plot-throughput", "plot-send_lag", "plot-server_metrics"} <= _ids(
        found
    )
    assert all(not c["hidden"] for c in found if c["id"] == "plot-cdf_ttft")
    for key in ("ttfot", "tpot", "itl", "e2el"):
        page.click(f"#dist-tabs button[data-dist='{key}']")
        now = {c["id"]: c for c in assert_drawn(page)}
        assert not now[f"plot-hist_{key}"]["hidden"] and now[f"plot-hist_{key}"]["drawn"] >= 1
    assert con.problems() == []


def test_run_pages_of_every_kind_draw(page: Page, server: DashboardServer, lab: Lab) -> None:
    s = lab.seeded
    for run_id in (s.all_errors, s.one, s.imported, lab.limited, lab.guidellm):
        con = _open(page, server, f"/runs/{run_id}")
        found = _ids(assert_drawn(page))
        if run_id == s.all_errors:  # nothing succeeded: its errors first, no empty charts
            assert found == set() and page.locator("#errors-first").count() == 1
        else:
            assert ("plot-send_lag" in found) == (run_id not in (s.imported, lab.guidellm))
            assert "plot-timeline" in found
        if run_id == s.one:  # a run of this client: its phases are drawn stacked
            assert "plot-phases" in found
        assert con.problems() == [], f"{run_id}: {con.problems()}"


def test_server_metrics_chart_is_svg_not_webgl(
    page: Page, server: DashboardServer, lab: Lab
) -> None:
    con = _open(page, server, f"/runs/{lab.scraped}")
    found = {c["id"]: c for c in assert_drawn(page)}
    sm = found["plot-server_metrics"]
    assert sm["expected"] >= 4 and sm["drawn"] >= sm["expected"]  # client + server series
    assert "WebGL" not in page.inner_text("#plot-server_metrics")
    assert con.problems() == []


def test_request_page_draws_its_events(page: Page, server: DashboardServer, lab: Lab) -> None:
    with session_scope(lab.seeded.sessions) as s:
        (rec,) = repo.load_records(s, lab.seeded.one)
    con = _open(page, server, f"/runs/{lab.seeded.one}/requests/{rec.index}")
    found = assert_drawn(page, expect=1)
    assert found[0]["id"] == "plot-events" and found[0]["drawn"] >= 2
    assert con.problems() == []


def test_sweep_page_draws(page: Page, server: DashboardServer, lab: Lab) -> None:
    con = _open(page, server, f"/sweeps/{lab.sweep_id}")
    found = assert_drawn(page, expect=6)
    assert all(c["drawn"] >= 1 for c in found)
    assert con.problems() == []


def test_compare_page_draws(page: Page, server: DashboardServer, lab: Lab) -> None:
    s = lab.seeded
    con = _open(page, server, f"/compare?ids={s.normal}&ids={s.one}")
    found = assert_drawn(page)
    assert {"plot-cdf_ttft_ms", "plot-delta_0"} <= _ids(found)
    assert con.problems() == []


def test_telemetry_page_draws(page: Page, server: DashboardServer, lab: Lab) -> None:
    con = _open(page, server, f"/jobs/{lab.telemetry_job}/telemetry")
    found = assert_drawn(page, expect=1)
    assert found[0]["drawn"] == 4  # utilization, power, memory, clock
    assert con.problems() == []


def test_roofline_without_measured_ceilings_draws_the_datasheet(
    page: Page, server: DashboardServer, lab: Lab
) -> None:
    con = _open(page, server, "/roofline?device=h100-sxm")
    found = assert_drawn(page, expect=1)
    assert found[0]["drawn"] >= 1 and "datasheet" in found[0]["text"]
    assert con.problems() == []


@NEEDS_TORCH
def test_roofline_with_measured_ceilings_draws(
    page: Page, server: DashboardServer, lab: Lab
) -> None:
    con = _open(page, server, "/roofline")
    found = assert_drawn(page, expect=1)
    assert found[0]["drawn"] >= 3  # measured fp32 and bf16 roofs, linear-probe points
    assert "measured" in found[0]["text"]
    assert con.problems() == []


@NEEDS_TORCH
def test_probe_pages_draw(page: Page, server: DashboardServer, lab: Lab) -> None:
    for kind, pid in lab.probes.items():
        con = _open(page, server, f"/probes/{pid}")
        found = assert_drawn(page, expect=2 if kind == "batch_scaling" else 0)
        assert all(c["drawn"] >= 1 for c in found)
        assert con.problems() == [], f"{kind}: {con.problems()}"


@NEEDS_TORCH
@pytest.mark.skipif(not HAS_TRANSFORMERS, reason="batch_scaling needs transformers")
def test_throughput_vs_batch_draws(page: Page, server: DashboardServer, lab: Lab) -> None:
    con = _open(page, server, f"/throughput?probe={lab.probes['batch_scaling']}")
    found = {c["id"]: c for c in assert_drawn(page, expect=2)}
    assert found["plot-throughput"]["drawn"] == 2  # total and per request
    assert found["plot-latency"]["drawn"] == 1  # TPOT (a CPU probe measures no memory)
    assert con.problems() == []


def test_capacity_form_says_what_is_wrong_beside_the_field(
    page: Page, server: DashboardServer, lab: Lab
) -> None:
    con = _open(page, server, "/capacity")
    page.fill("#f-utilization", "abc")
    with page.expect_navigation():
        page.click("#capacity-submit")
    assert "memory utilization must be a number" in page.inner_text("#err-utilization")
    assert page.locator("#capacity-result").count() == 0
    page.fill("#f-utilization", "0.9")
    page.select_option("#f-model", "llama-3-70b")
    with page.expect_navigation():
        page.click("#capacity-submit")
    nofit = page.inner_text("#capacity-nofit")
    assert "does not fit" in nofit and "at least 2" in nofit
    assert page.locator("#max-concurrency").count() == 0  # no zero-filled cards
    page.fill("#f-tp", "2")
    with page.expect_navigation():
        page.click("#capacity-submit")
    assert page.locator("#capacity-nofit").count() == 0
    assert int(page.inner_text("#max-concurrency")) > 0
    # Chromium logs the 422 of a form with errors as a failed resource: nothing else
    assert [e for e in con.problems() if "status of 422" not in e] == []
    assert_drawn(page, expect=0)


def test_api_docs_work_offline_under_the_csp(page: Page, server: DashboardServer) -> None:
    """/docs is Swagger UI from the package's local files (no CDN), started by a static
    script under the strict CSP: it lists the API's operations and logs no problem."""
    requested: list[str] = []
    page.on("request", lambda req: requested.append(req.url))
    con = _open(page, server, "/docs")
    page.wait_for_selector(".opblock", timeout=20_000)
    assert page.locator(".opblock").count() >= 20
    assert all(u.startswith(server.url) for u in requested), requested  # nothing off-box
    assert con.problems() == [], con.problems()
