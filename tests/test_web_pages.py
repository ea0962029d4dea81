"""Dashboard pages over HTTP (TestClient): real runs, empty states, SLO edit, launch form."""

from __future__ import annotations

import csv
import io
import json
import re
from collections.abc import Iterator
from pathlib import Path

import pytest
from fastapi.testclient import TestClient

from app.services import auth
from app.services.runs import open_database
from app.storage import workers as worker_repo
from app.storage.db import session_scope
from tests.web_support import Seeded, post_form, seed, sign_in, web_app


@pytest.fixture(scope="module")
def seeded(tmp_path_factory: pytest.TempPathFactory) -> Seeded:
    return seed(tmp_path_factory.mktemp("web"))


@pytest.fixture(scope="module")
def client(seeded: Seeded) -> Iterator[TestClient]:
    with TestClient(web_app(seeded.url)) as c:
        yield c


def _figures(html: str) -> dict[str, dict]:
    blocks = re.findall(
        r'<script type="application/json" id="fig-([a-z0-9_]+)">(.*?)</script>', html
    )
    return {k: json.loads(v) for k, v in blocks}


def _token(seeded: Seeded, *scopes: str) -> str:
    with session_scope(seeded.sessions) as s:
        _, secret = auth.create_token(s, scopes=list(scopes), name="web-test")
    return secret


def test_empty_database_says_what_to_do(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'empty.db'}"
    open_database(url)
    with TestClient(web_app(url)) as c:
        page = c.get("/")
        assert page.status_code == 200
        assert "No runs yet" in page.text and 'href="/launch"' in page.text
        assert "tokentrace bench" in page.text
        workers = c.get("/workers")
        assert "No workers registered" in workers.text
        assert "Select two or more runs" in c.get("/compare").text


def test_runs_table_lists_runs_escaped_and_filters(client: TestClient, seeded: Seeded) -> None:
    page = c = client.get("/")
    assert page.status_code == 200
    for run_id in (seeded.normal, seeded.all_errors, seeded.one, seeded.imported):
        assert f'data-run-id="{run_id}"' in page.text
    assert "&lt;b&gt;normal&lt;/b&gt; &amp; co" in page.text
    assert "<b>normal</b>" not in page.text and "<i>x</i>" not in page.text
    assert "client-limited" in page.text or "valid" in page.text
    rows = dict(re.findall(r'<tr data-run-id="([0-9a-f]+)">(.*?)</tr>', page.text, re.S))
    assert re.search(
        r'class="trust-warning small"[^>]*>⚠ errors \d+\.\d% &gt; 5%', rows[seeded.normal]
    )
    assert "⚠ errors" not in rows[seeded.one]  # no failed request (client-limited: load-bound)
    assert 'type="radio" name="base" value="' + seeded.one + '"' in rows[seeded.one]
    failed = client.get("/?status=failed").text
    assert seeded.all_errors in failed and seeded.normal not in failed
    tagged = client.get("/?tag=web").text
    assert seeded.normal in tagged and seeded.one not in tagged
    none = client.get("/?model=nope").text
    assert "No run matches these filters" in none
    assert c.status_code == 200


@pytest.mark.parametrize("which", ["normal", "all_errors", "one", "imported"])
def test_run_page_renders_every_kind_of_run(client: TestClient, seeded: Seeded, which: str) -> None:
    run_id = getattr(seeded, which)
    r = client.get(f"/runs/{run_id}")
    assert r.status_code == 200, r.text[:500]
    figs = _figures(r.text)
    charts = {"cdf_ttft", "hist_e2el", "timeline", "throughput"}
    if which == "all_errors":  # nothing succeeded: the errors first, no empty charts
        assert not (charts | {"send_lag"}) & set(figs) and 'id="plot-' not in r.text
        first = r.text.index('id="errors-first"')
        assert first < r.text.index('id="pct-table"') and first < r.text.index('class="cards"')
        assert r.text.count('id="error-table"') == 1
        # 5 of 5 failed (the simulator's error_rate=1.0 answers HTTP 500)
        assert re.search(r"5 of 5 requests failed \(100%\), mostly [^<]+, from \d+\.\d s", r.text)
    else:
        assert charts <= set(figs)
        assert ("send_lag" in figs) == (which != "imported")  # an import has no schedule
    assert re.search(r'src="/static/plotly\.min\.[0-9a-f]{12}\.js"', r.text)  # hashed URL
    assert "cdn" not in r.text.lower()
    assert 'id="pct-table"' in r.text
    if which == "normal":
        assert figs["cdf_ttft"]["data"] and figs["timeline"]["data"]
        assert "TTFT ≤ 30 ms" in r.text or "ttft ≤ 30 ms" in r.text
        assert 'id="error-table"' in r.text
        assert "&lt;b&gt;normal" in r.text
        health = re.search(r'id="client-health">(.*?)</p>', r.text, re.S)
        assert health is not None, "the run page shows the client's own health"
        assert "scheduling normal" in health.group(1) and "event-loop lag p99" in health.group(1)
    if which == "all_errors":
        assert "no data" in r.text and 'id="error-table"' in r.text
    if which == "one":
        assert len(figs["cdf_ttft"]["data"][0]["x"]) == 1
    if which == "imported":
        assert "no per-token data" in json.dumps(figs["cdf_itl"])
        assert "summary-only" in r.text.lower()
        assert 'id="client-health"' not in r.text  # an import has no client of ours
        assert "no spec at" not in r.text and " at —" not in r.text
        header = re.search(r'id="run-header">(.*?)</p>', r.text, re.S)
        assert header is not None and "imported from CSV request log file" in header.group(1)
        assert 'id="plot-send_lag"' not in r.text
        assert 'id="trust-warnings"' not in r.text
    if which == "normal":  # the simulator fails 10% of its requests: over the 5% bound
        warn = re.search(r'id="trust-warnings">(.*?)</section>', r.text, re.S)
        assert warn is not None and re.search(r"error rate \d+\.\d% \(\d+ failed", warn.group(1))
        assert "bound 5%" in warn.group(1)
    if which == "one":  # it failed nothing (whether its client kept up depends on the box)
        warn = re.search(r'id="trust-warnings">(.*?)</section>', r.text, re.S)
        assert warn is None or "error rate" not in warn.group(1)


def _goodput(html: str) -> str:
    m = re.search(r'id="card-goodput">.*?<div class="value">(.*?)</div>', html, re.S)
    assert m, "goodput card missing"
    return m.group(1).strip()


def test_slo_edit_recomputes_goodput_server_side(client: TestClient, seeded: Seeded) -> None:
    base = client.get(f"/runs/{seeded.normal}").text
    strict = client.get(f"/runs/{seeded.normal}?slo=1&slo_ttft=0.001").text
    loose = client.get(f"/runs/{seeded.normal}?slo=1&slo_ttft=100000&slo_e2el=100000").text
    assert _goodput(strict) == "0.00 req/s"
    assert _goodput(loose) != _goodput(strict)
    assert 'value="0.001"' in strict
    none = client.get(f"/runs/{seeded.normal}?slo=1&slo_ttft=&slo_tpot=&slo_e2el=").text
    assert _goodput(none) == "—" and "no SLOs set" in none
    bad = client.get(f"/runs/{seeded.normal}?slo=1&slo_ttft=-3").text
    assert "positive number of ms" in bad and _goodput(bad) == _goodput(base)
    report = client.get(f"/runs/{seeded.normal}/report.json?slo=1&slo_ttft=0.001").json()
    assert report["metrics"]["goodput_req_s"] == 0.0 and report["slos_ms"] == {"ttft": 0.001}


@pytest.mark.parametrize("profile", ["vllm", "guidellm", "aiperf"])
def test_profile_switch_shows_theirs_beside_ours(
    client: TestClient, seeded: Seeded, profile: str
) -> None:
    r = client.get(f"/runs/{seeded.normal}?profile={profile}")
    assert r.status_code == 200 and 'id="profile-table"' in r.text
    assert "tokentrace (ours)" in r.text
    assert client.get(f"/runs/{seeded.all_errors}?profile={profile}").status_code == 200
    assert client.get(f"/runs/{seeded.imported}?profile={profile}").status_code == 200


def test_downloads(client: TestClient, seeded: Seeded) -> None:
    r = client.get(f"/runs/{seeded.normal}/requests.csv")
    assert r.status_code == 200 and r.headers["content-type"].startswith("text/csv")
    rows = list(csv.DictReader(io.StringIO(r.text)))
    assert len(rows) == 60
    ok = [row for row in rows if row["status"] == "ok"]
    assert ok and float(ok[0]["ttft_ms"]) > 0
    report = client.get(f"/runs/{seeded.normal}/report.json").json()
    assert report["run_id"] == seeded.normal and "ttft_ms" in report["metrics"]
    assert client.get("/runs/nope/report.json").status_code == 404


def test_requests_and_request_detail(client: TestClient, seeded: Seeded) -> None:
    page = client.get(f"/runs/{seeded.normal}/requests")
    assert page.status_code == 200 and f"/runs/{seeded.normal}/requests/0" in page.text
    r = client.get(f"/runs/{seeded.normal}/requests/0")
    assert r.status_code == 200
    fig = _figures(r.text)["events"]
    assert fig["data"]
    assert 'id="events-table"' in r.text and "content" in r.text
    assert client.get(f"/runs/{seeded.normal}/requests/99999").status_code == 404
    assert client.get("/runs/nope").status_code == 404
    imp = client.get(f"/runs/{seeded.imported}/requests/0")
    assert imp.status_code == 200 and "no per-token data" in imp.text


def test_compare_side_by_side(client: TestClient, seeded: Seeded) -> None:
    r = client.get(f"/compare?ids={seeded.normal}&ids={seeded.one}&ids=missing")
    assert r.status_code == 200 and 'id="compare-table"' in r.text
    assert "no run with id missing" in r.text


def test_workers_page_shows_gpus_labels_and_heartbeat(client: TestClient, seeded: Seeded) -> None:
    caps = {
        "hostname": "gpu-box",
        "tokentrace_version": "0.1.0",
        "gpus": [{"index": 0, "name": "NVIDIA H200", "memory_total_mb": 143771}],
    }
    with session_scope(seeded.sessions) as s:
        worker_repo.insert_worker(
            s, name="w1", hostname="gpu-box", capabilities=caps, labels={"rack": "a"}, token_id=None
        )
    r = client.get("/workers")
    assert "NVIDIA H200" in r.text and "rack=a" in r.text and "gpu-box" in r.text


def test_launch_needs_sign_in_then_validates_then_queues(
    client: TestClient, seeded: Seeded
) -> None:
    form = client.get("/launch")
    assert form.status_code == 200 and 'id="signin-needed"' in form.text
    # blank: 100 requests, or a trace's every line (tests/test_trace_defaults.py)
    assert 'name="num_prompts"' in form.text and "blank: 100" in form.text
    data = {"base_url": "http://127.0.0.1:9", "model": "m", "num_prompts": "3", "endpoint": "chat"}
    denied = client.post("/launch", data=data)
    assert denied.status_code == 403 and "run" in denied.text

    assert post_form(client, "/signin", {"token": "tt_wrong"}).status_code == 401
    read_only = _token(seeded, "read")
    sign_in(client, read_only, "/launch")
    assert post_form(client, "/launch", data).status_code == 403

    secret = _token(seeded, "run")
    r = sign_in(client, secret, "/launch")
    assert r.status_code == 303 and r.headers["location"] == "/launch"
    cookie = r.headers["set-cookie"].lower()
    assert "httponly" in cookie and "samesite=strict" in cookie
    assert secret.lower() not in cookie  # the cookie holds a session, not the token
    assert 'id="signin-needed"' not in client.get("/launch").text

    bad = post_form(client, "/launch", data | {"num_prompts": "0", "base_url": "ftp://x"})
    assert bad.status_code == 422 and 'id="form-error"' in bad.text
    assert 'id="err-num_prompts"' in bad.text and 'id="err-base_url"' in bad.text
    bad_slo = post_form(client, "/launch", data | {"goodput_ttft": "-1", "extra_body": "[1]"})
    assert 'id="err-goodput_ttft"' in bad_slo.text and 'id="err-extra_body"' in bad_slo.text

    ok = post_form(
        client,
        "/launch",
        data | {"name": "from the form", "tags": "ui, web", "goodput_ttft": "200"},
        follow_redirects=False,
    )
    assert ok.status_code == 303, ok.text[:1000]
    run_id = ok.headers["location"].rsplit("/", 1)[1]
    page = client.get(f"/runs/{run_id}")
    assert page.status_code == 200
    assert 'class="live"' in page.text and "data-job-id" in page.text
    progress = client.get(f"/runs/{run_id}/progress.json").json()
    assert progress["status"] == "queued" and progress["state"] == "queued"
    listing = client.get("/").text
    assert run_id in listing and "from the form" in listing
    again = client.get(f"/launch?again={run_id}").text
    assert 'value="from the form (again)"' in again and 'value="200"' in again
    post_form(client, "/signout", {})
    assert 'id="signin-needed"' in client.get("/launch").text


def test_large_run_page_is_downsampled_and_bounded(tmp_path: Path) -> None:
    """150k events: every plot stays within the point budget and says it was downsampled."""
    from benchmarks.bench_pages import build_records, store

    url = f"sqlite:///{tmp_path / 'big.db'}"
    run_id = store(url, build_records(300, 500, seed=1))
    with TestClient(web_app(url)) as c:
        r = c.get(f"/runs/{run_id}")
    assert r.status_code == 200
    figs = _figures(r.text)
    assert "downsampled: 2,000 of" in json.dumps(figs["cdf_itl"])
    shown = re.search(r"downsampled: ([\d,]+) of", json.dumps(figs["itl_position"]))
    assert shown is not None and 1900 <= int(shown.group(1).replace(",", "")) <= 2000
    for key, fig in figs.items():
        points = sum(len(t.get("x") or []) for t in fig["data"])
        assert points <= 6 * 1000, key  # timeline: 2 segments x 3 points per bar, <= 1000 bars
    assert len(r.content) < 600_000


def test_protected_reads_redirect_to_sign_in(seeded: Seeded) -> None:
    from app.api.app import create_app
    from app.settings import Settings

    app = create_app(Settings(database_url=seeded.url, local_worker=False, auth_reads=True))
    with TestClient(app) as c:
        r = c.get(f"/runs/{seeded.normal}", follow_redirects=False)
        assert r.status_code == 303 and r.headers["location"].startswith("/signin?next=/runs/")
        assert c.get(f"/runs/{seeded.normal}/report.json").status_code == 401
        sign_in(c, _token(seeded, "read"))
        assert c.get(f"/runs/{seeded.normal}").status_code == 200
        assert c.get(f"/runs/{seeded.normal}/progress.json").status_code == 200


def test_imported_file_run_shows_the_files_setup(tmp_path: Path) -> None:
    from app.services.file_imports import import_path

    url = f"sqlite:///{tmp_path / 'gl.db'}"
    sessions = open_database(url)
    fixture = Path(__file__).parent / "fixtures" / "interop" / "guidellm-benchmarks.json"
    run_ids = import_path(sessions, "guidellm", fixture, name="gl")
    with TestClient(web_app(url)) as c:
        html = c.get(f"/runs/{run_ids[0]}").text
    header = re.search(r'id="run-header">(.*?)</p>', html, re.S)
    assert header is not None
    assert "imported from GuideLLM 0.8.1 file guidellm-benchmarks.json" in header.group(1)
    assert "no spec at" not in html and " at —" not in html
    assert "send_lag" not in _figures(html) and 'id="plot-send_lag"' not in html
    table = re.search(r'id="import-setup">(.*?)</table>', html, re.S)
    assert table is not None
    assert "concurrent streams 1" in table.group(1) and "load kind" in table.group(1)
    assert 'id="launch-again"' not in html


def _err(html: str, key: str) -> str | None:
    m = re.search(rf'<span class="error" id="err-{key}">(.*?)</span>', html, re.S)
    return m.group(1) if m else None


def test_capacity_page_fit_tp_custom_model_and_errors_beside_fields(client: TestClient) -> None:
    from app.analysis.device_presets import DEVICE_PRESETS
    from tests.test_capacity import DEEPSEEK_V2_LITE_CONFIG, LLAMA3_8B_CONFIG

    big = client.get("/capacity?model=llama-3-70b&device=h100-sxm&context=4096")
    assert big.status_code == 200
    assert 'id="capacity-nofit"' in big.text and 'id="max-concurrency"' not in big.text
    short = re.search(r'id="capacity-shortfall">(.*?) GiB<', big.text)
    h100 = DEVICE_PRESETS["h100-sxm"].memory_bytes
    assert short is not None and float(short.group(1)) == pytest.approx(
        (70_553_706_496 * 2 - h100 * 0.9) / 2**30, abs=0.06
    )
    assert 'id="capacity-min-tp">2<' in big.text
    two = client.get("/capacity?model=llama-3-70b&device=h100-sxm&context=4096&tp=2")
    assert two.status_code == 200 and 'id="capacity-nofit"' not in two.text
    assert 'id="max-concurrency"' in two.text and "4 of 8 KV heads per GPU" in two.text
    bad = client.get("/capacity?utilization=abc&block_size=1.5&tp=0")
    assert bad.status_code == 422
    assert "memory utilization must be a number" in (_err(bad.text, "utilization") or "")
    assert "block size must be a whole number" in (_err(bad.text, "block_size") or "")
    assert "validation error" not in bad.text.lower() and "pydantic" not in bad.text.lower()
    over = client.get("/capacity?utilization=2&tp=0")
    assert over.status_code == 422
    assert "must be less than or equal to 1" in (_err(over.text, "utilization") or "")
    assert "must be greater than or equal to 1" in (_err(over.text, "tp") or "")
    custom = client.get(
        "/capacity", params={"model": "custom", "hf_config": json.dumps(LLAMA3_8B_CONFIG)}
    )
    assert custom.status_code == 200
    kv = re.search(r'id="kv-per-token">(.*?)<', custom.text)
    assert kv is not None and kv.group(1) == "128.0 KiB"
    assert "parameters estimated from config.json: 8.03 B" in custom.text
    junk = client.get("/capacity", params={"model": "custom", "hf_config": "{nope"})
    assert junk.status_code == 422 and "not valid JSON" in (_err(junk.text, "hf_config") or "")
    mla = client.get(
        "/capacity", params={"model": "custom", "hf_config": json.dumps(DEEPSEEK_V2_LITE_CONFIG)}
    )
    assert mla.status_code == 422 and "parameter count" in (_err(mla.text, "params_b") or "")
    mla_ok = client.get(
        "/capacity",
        params={
            "model": "custom",
            "hf_config": json.dumps(DEEPSEEK_V2_LITE_CONFIG),
            "params_b": "15.7",
            "tp": "2",
        },
    )
    assert mla_ok.status_code == 200 and "30.4 KiB" in mla_ok.text  # 31104 bytes, every GPU


def test_roofline_datasheet_without_measurements_and_mfu_only_on_known_hardware(
    tmp_path: Path,
) -> None:
    from app.services import probes as probe_svc
    from app.targets.sim_config import SimConfig
    from tests.web_support import bench

    url = f"sqlite:///{tmp_path / 'roof.db'}"
    sessions = open_database(url)
    sim_run = bench(sessions, SimConfig(ttft_ms=5, itl_ms=1, seed=1), "sim", num_prompts=8)
    annotated = bench(sessions, SimConfig(ttft_ms=5, itl_ms=1, seed=2), "ann", num_prompts=8)
    with session_scope(sessions) as s:
        probe_svc.annotate(
            s, annotated, probe_svc.Annotation(model="llama-3-8b", device="h100-sxm")
        )
    with TestClient(web_app(url)) as c:
        page = c.get("/roofline")  # nothing measured: the first datasheet's roofs
        assert page.status_code == 200
        fig = _figures(page.text)["roofline"]
        names = [t["name"] for t in fig["data"] if t["mode"] == "lines"]  # the roofs
        assert names and all(n.startswith("datasheet ") for n in names)
        assert any(n.startswith("datasheet h100-sxm") for n in names)
        assert "datasheet" in fig["layout"]["title"]["text"]
        assert 'id="datasheet-label"' in page.text and 'id="no-ceilings"' in page.text
        a100 = _figures(c.get("/roofline?device=a100-80gb").text)["roofline"]
        assert any(t["name"].startswith("datasheet a100-80gb") for t in a100["data"])
        # a simulator run on this CPU: operating points, but no MFU/MBU, whatever the form
        adhoc = c.get(f"/roofline?run={sim_run}&model=llama-3-8b&preset=h100-sxm").text
        ops = re.search(r'id="ops-table">(.*?)</table>', adhoc, re.S)
        assert ops is not None and "sim" in ops.group(1)
        assert "%" not in ops.group(1).split("</thead>")[1]  # MFU and MBU cells are "—"
        assert "MFU and MBU not quoted: the hardware this run used is unknown" in adhoc
        # annotated with its device: MFU and MBU quoted against that datasheet
        known = c.get(f"/roofline?run={annotated}").text
        ops_known = re.search(r'id="ops-table">(.*?)</table>', known, re.S)
        assert ops_known is not None and "%" in ops_known.group(1).split("</thead>")[1]
