"""Issue 17, server side (TestClient, temp SQLite): the sweep and probe forms (bad input:
messages naming the field, nothing created; good input: what POST /api/v1/sweeps or
/api/v1/probes would queue), the sweep page's progress JSON and cancel, the launch form's
defaults from the settings (``serve --demo``: its simulator), the workers page (heartbeat
age, current job, the queue and why a job waits), and the nav links."""

from __future__ import annotations

import datetime as dt
import re
from collections.abc import Iterator
from dataclasses import dataclass
from html import unescape
from pathlib import Path
from typing import Any

import pytest
from fastapi.testclient import TestClient
from sqlalchemy.orm import Session, sessionmaker

from app.api.app import create_app
from app.client.limits import ClientLimits
from app.client.spec import RunSpec
from app.domain import RunStatus
from app.services import auth
from app.services.file_imports import import_path
from app.services.runs import open_database
from app.settings import Settings
from app.storage import compare_repo
from app.storage import jobs as job_repo
from app.storage import probes as probe_repo
from app.storage import repository as repo
from app.storage import workers as worker_repo
from app.storage.db import session_scope
from app.storage.models import Job, utcnow
from app.storage.models_compare import Sweep
from app.web import launch_form, workers_view
from tests.web_support import CSV_LOG, post_form, sign_in, web_app

ERR = re.compile(r'id="err-([a-z_]+)">([^<]*)<')


@dataclass
class Lab:
    url: str
    sessions: sessionmaker[Session]
    run_token: str
    read_token: str


@pytest.fixture
def lab(tmp_path: Path) -> Lab:
    url = f"sqlite:///{tmp_path / 'journeys.db'}"
    sessions = open_database(url)
    with session_scope(sessions) as s:
        _, run_token = auth.create_token(s, scopes=["run"], name="runner")
        _, read_token = auth.create_token(s, scopes=["read"], name="reader")
    return Lab(url, sessions, run_token, read_token)


@pytest.fixture
def client(lab: Lab) -> Iterator[TestClient]:
    with TestClient(web_app(lab.url)) as c:
        assert sign_in(c, lab.run_token).status_code == 303
        yield c


def _counts(lab: Lab) -> tuple[int, int, int]:
    """(sweeps, jobs, probes) in the database."""
    with session_scope(lab.sessions) as s:
        sweeps = len(compare_repo.list_sweeps(s, limit=1000))
        jobs = job_repo.count_jobs(s, state=None, kind=None)
        probes = probe_repo.count_probes(s)
    return sweeps, jobs, probes


def _errors(html: str) -> dict[str, str]:
    return {k: unescape(v) for k, v in ERR.findall(html)}


def _value(html: str, name: str) -> str:
    m = re.search(rf'id="f-{name}"\s*value="([^"]*)"', html)
    assert m is not None, name
    return m.group(1)


SWEEP_BASE = {
    "base_url": "http://127.0.0.1:9",
    "model": "m",
    "num_prompts": "10",
    "sweep_mode": "rates",
    "loads": "2, 4, 8",
    "min_ratio": "0.8",
    "auto_steps": "5",
}


# ----------------------------------------------------------------------- sweep form


@pytest.mark.parametrize(
    ("change", "field", "text"),
    [
        ({"loads": "8, 4"}, "loads", "increasing order"),
        ({"loads": ""}, "loads", "give 1 to"),
        ({"loads": "2, x"}, "loads", "valid number"),
        ({"sweep_mode": "concurrencies", "loads": "1, 2.5"}, "loads", "integer"),
        ({"sweep_mode": "auto", "loads": "2"}, "loads", "chooses its own loads"),
        ({"sweep_mode": "auto", "loads": "", "auto_steps": "0"}, "auto_steps", "greater than"),
        ({"sweep_mode": "sideways"}, "sweep_mode", "choose one of"),
        ({"min_ratio": "2"}, "min_ratio", "less than or equal to 1"),
        ({"num_prompts": "0"}, "num_prompts", "greater than or equal to 1"),
        ({"base_url": "ftp://x"}, "base_url", "http://"),
        ({"req_labels": "rack"}, "req_labels", "not key=value"),
        ({"loads": ", ".join(str(i) for i in range(1, 40))}, "loads", "at most 32"),
    ],
)
def test_sweep_form_bad_input_names_the_field_and_creates_nothing(
    client: TestClient, lab: Lab, change: dict[str, str], field: str, text: str
) -> None:
    before = _counts(lab)
    r = post_form(client, "/launch/sweep", SWEEP_BASE | change)
    assert r.status_code == 422
    errors = _errors(r.text)
    assert field in errors, errors
    assert text in errors[field], errors
    assert 'id="form-error"' in r.text
    assert _counts(lab) == before


def test_sweep_form_refuses_without_the_run_scope_or_csrf(lab: Lab) -> None:
    with TestClient(web_app(lab.url)) as c:
        r = post_form(c, "/launch/sweep", SWEEP_BASE)  # signed out
        assert r.status_code == 403 and "'run' scope" in unescape(r.text)
        assert sign_in(c, lab.read_token).status_code == 303
        r = post_form(c, "/launch/sweep", SWEEP_BASE)
        assert r.status_code == 403
    with TestClient(web_app(lab.url)) as c:
        assert sign_in(c, lab.run_token).status_code == 303
        r = c.post("/launch/sweep", data=SWEEP_BASE | {"csrf": "forged"})
        assert r.status_code == 403 and "CSRF" in r.text
        headers = {"Origin": "http://evil.example"}
        r = post_form(c, "/launch/sweep", SWEEP_BASE, headers=headers)
        assert r.status_code == 403
    assert _counts(lab) == (0, 0, 0)


def test_sweep_form_queues_what_the_api_would(client: TestClient, lab: Lab) -> None:
    form = SWEEP_BASE | {
        "name": "from the form",
        "sweep_mode": "concurrencies",
        "loads": "1 2, 4",
        "min_ratio": "0.5",
        "goodput_ttft": "150",
        "req_labels": "rack=a",
        "metrics_series": "vllm:foo, vllm:bar",
    }
    r = post_form(client, "/launch/sweep", form, follow_redirects=False)
    assert r.status_code == 303, _errors(r.text)
    sweep_id = r.headers["location"].removeprefix("/sweeps/")
    with session_scope(lab.sessions) as s:
        sweep = s.get(Sweep, sweep_id)
        assert sweep is not None and sweep.status == "queued" and sweep.name == "from the form"
        assert sweep.mode == "concurrencies" and sweep.loads == [1.0, 2.0, 4.0]
        job = s.get(Job, sweep.job_id)
        assert job is not None and job.kind == "sweep" and job.state == "queued"
        assert job.requirements["labels"] == {"rack": "a"}
        plan = job.spec["plan"]
        assert plan == {
            "mode": "concurrencies",
            "loads": [1.0, 2.0, 4.0],
            "auto_steps": 5,
            "min_ratio": 0.5,
            "max_error_rate": 0.05,
            "find_max": None,  # a plain sweep: no SLO search
        }
        bench = job.spec["bench"]
    assert bench["num_prompts"] == 10 and bench["goodput"] == {"ttft": 150.0}
    assert bench["metrics_series"] == ["vllm:foo", "vllm:bar"]
    assert bench["base_url"] == "http://127.0.0.1:9"
    # "launch again" from the sweep's page fills the form with this sweep
    assert f'href="/launch/sweep?again={sweep_id}"' in client.get(f"/sweeps/{sweep_id}").text
    again = client.get(f"/launch/sweep?again={sweep_id}").text
    assert _value(again, "name") == "from the form (again)"
    assert re.search(r'<option value="concurrencies" selected>', again)
    assert _value(again, "loads") == "1, 2, 4"
    assert _value(again, "min_ratio") == "0.5" and _value(again, "num_prompts") == "10"
    assert _value(again, "goodput_ttft") == "150" and _value(again, "req_labels") == "rack=a"
    assert _value(again, "metrics_series") == "vllm:foo, vllm:bar"


def test_sweep_form_defaults_come_from_the_settings(lab: Lab) -> None:
    settings = Settings(
        database_url=lab.url,
        local_worker=False,
        default_target_url="http://127.0.0.1:9555",
        default_target_model="demo-model",
    )
    with TestClient(create_app(settings)) as c:
        html = c.get("/launch/sweep").text
    assert _value(html, "base_url") == "http://127.0.0.1:9555"
    assert _value(html, "model") == "demo-model"
    assert 'id="f-request_rate"' not in html  # each step sets its own rate
    assert 'id="signin-needed"' in html


# ----------------------------------------------------------------- live sweep and cancel


def _sweep_with_steps(lab: Lab, statuses: list[RunStatus], loads: list[float]) -> str:
    with session_scope(lab.sessions) as s:
        spec = RunSpec(base_url="http://127.0.0.1:9", model="m")
        sweep_id = compare_repo.create_sweep(
            s, spec=spec.model_dump(mode="json"), mode="rates", loads=loads, status="running"
        )
        job = job_repo.create_job(
            s,
            kind="sweep",
            spec={"sweep_id": sweep_id, "plan": {"mode": "rates", "loads": loads}},
            requirements={},
            run_id=None,
            max_attempts=1,
        )
        job_repo.transition(s, job.id, from_states=("queued",), state="running")
        compare_repo.update_sweep(s, sweep_id, job_id=job.id)
        for i, st in enumerate(statuses):
            rid = repo.create_run(s, spec, name=f"step {i}", status=st)
            compare_repo.add_step(
                s, sweep_id, step_idx=i, run_id=rid, load=loads[i], load_kind="rate"
            )
    return sweep_id


def test_sweep_progress_json_counts_steps(client: TestClient, lab: Lab) -> None:
    sweep_id = _sweep_with_steps(
        lab, [RunStatus.SUCCEEDED, RunStatus.PARTIAL, RunStatus.RUNNING], [1.0, 2.0, 4.0, 8.0]
    )
    live = client.get(f"/sweeps/{sweep_id}/progress.json").json()
    # 3 step runs so far, 2 of them ended (succeeded, partial); the plan has 4 loads
    assert live["steps"] == 3 and live["finished_steps"] == 2 and live["planned"] == 4
    assert live["status"] == "running" and live["active"] is True
    assert live["cancellable"] is True and live["job_state"] == "running"
    assert live["text"].startswith("running step 3 of 4")
    page = client.get(f"/sweeps/{sweep_id}").text
    assert 'id="sweep-live"' in page and 'data-active="1"' in page
    assert 'data-steps="3"' in page and 'data-finished="2"' in page
    assert "2 of 4 step(s) finished" in page
    assert client.get("/sweeps/nope/progress.json").status_code == 404


def test_cancel_from_the_sweep_page(client: TestClient, lab: Lab) -> None:
    r = post_form(client, "/launch/sweep", SWEEP_BASE, follow_redirects=False)
    sweep_id = r.headers["location"].removeprefix("/sweeps/")
    page = client.get(f"/sweeps/{sweep_id}").text
    assert 'id="sweep-cancel-form"' in page and f'action="/sweeps/{sweep_id}/cancel"' in page
    bad = client.post(f"/sweeps/{sweep_id}/cancel", data={"csrf": "forged"})
    assert bad.status_code == 403
    assert client.get(f"/sweeps/{sweep_id}/progress.json").json()["status"] == "queued"
    r = post_form(client, f"/sweeps/{sweep_id}/cancel", {}, follow_redirects=False)
    assert r.status_code == 303 and r.headers["location"] == f"/sweeps/{sweep_id}"
    live = client.get(f"/sweeps/{sweep_id}/progress.json").json()
    assert live["status"] == "cancelled" and live["active"] is False
    assert live["stop_reason"] == "cancelled before it started"
    assert 'id="sweep-cancel-form"' not in client.get(f"/sweeps/{sweep_id}").text
    again = post_form(client, f"/sweeps/{sweep_id}/cancel", {})
    assert again.status_code == 409
    # a running sweep: flagged; the worker stops at its next heartbeat
    running = _sweep_with_steps(lab, [RunStatus.RUNNING], [1.0, 2.0])
    r = post_form(client, f"/sweeps/{running}/cancel", {}, follow_redirects=False)
    assert r.status_code == 303
    live = client.get(f"/sweeps/{running}/progress.json").json()
    assert live["cancel_requested"] is True and live["cancellable"] is False
    assert "cancel requested" in live["text"]


def test_sweeps_list_picks_two_sweeps_for_compare(client: TestClient, lab: Lab) -> None:
    a = _sweep_with_steps(lab, [], [1.0])
    b = _sweep_with_steps(lab, [], [2.0])
    html = client.get("/sweeps").text
    assert '<form method="get" action="/compare" id="sweep-compare-form">' in html
    for sid in (a, b):
        assert f'<input type="checkbox" name="sweeps" value="{sid}"' in html
    assert 'href="/launch/sweep"' in html


# ------------------------------------------------------------------------ probe form


PROBE_BASE = {"kind": "linear", "device": "cpu", "linear_width": "16", "linear_trace": "on"}


@pytest.mark.parametrize(
    ("change", "field", "text"),
    [
        ({"linear_width": "0"}, "linear_width", "greater than or equal to 1"),
        ({"linear_dtype": "int3"}, "linear_dtype", "'fp32', 'bf16' or 'fp16'"),
        ({"kind": "batch_scaling"}, "batch_scaling_model_path", "Field required"),
        (
            {
                "kind": "batch_scaling",
                "batch_scaling_model_path": "m",
                "batch_scaling_batches": "4, 2",
            },
            "batch_scaling_batches",
            "increasing order",
        ),
        ({"kind": "ceilings", "ceilings_copy_mib": "0"}, "ceilings_copy_mib", ">= 1"),
        ({"params_json": "[1]"}, "params_json", "JSON object"),
        ({"params_json": '{"bogus": 1}'}, "params_json", "bogus: Extra inputs"),
        ({"kind": "nope"}, "kind", "choose one of"),
        ({"device": "tpu"}, "device", "'cuda' or 'cpu'"),
        ({"device_index": "-1"}, "device_index", "greater than or equal to 0"),
        ({"req_labels": "x"}, "req_labels", "not key=value"),
        ({"req_min_gpu_memory_mb": "-5"}, "req_min_gpu_memory_mb", "greater than or equal"),
    ],
)
def test_probe_form_bad_input_names_the_field_and_creates_nothing(
    client: TestClient, lab: Lab, change: dict[str, str], field: str, text: str
) -> None:
    r = post_form(client, "/launch/probe", PROBE_BASE | change)
    assert r.status_code == 422
    errors = _errors(r.text)
    assert field in errors, errors
    assert text in errors[field], errors
    assert _counts(lab) == (0, 0, 0)


def test_probe_form_queues_a_probe_job(client: TestClient, lab: Lab) -> None:
    form = PROBE_BASE | {
        "name": "form probe",
        "linear_batch": "2",
        "linear_seq": "4",
        "linear_iters": "3",
        "linear_trace": "",  # unticked
        "req_labels": "gpu=h100, rack=b",
        "req_gpu_name": "H100",
        "ceilings_iters": "99",  # another kind's field: ignored
    }
    r = post_form(client, "/launch/probe", form, follow_redirects=False)
    assert r.status_code == 303, _errors(r.text)
    probe_id = r.headers["location"].removeprefix("/probes/")
    with session_scope(lab.sessions) as s:
        probe = probe_repo.get_probe(s, probe_id)
        assert probe is not None and probe.kind == "linear" and probe.device == "cpu"
        assert probe.name == "form probe"
        job = s.get(Job, probe.job_id)
        assert job is not None and job.kind == "probe" and job.state == "queued"
        assert job.requirements == {
            "labels": {"gpu": "h100", "rack": "b"},
            "gpu_name": "H100",
            "min_gpu_memory_mb": None,
        }
        params = job.spec["probe"]["params"]
    assert params == {
        "width": 16, "batch": 2, "seq": 4, "dtype": "bf16", "sweep_max": None,
        "warmup": 3, "iters": 3, "trace": False,
    }  # fmt: skip
    page = client.get(f"/probes/{probe_id}").text
    assert 'id="probe-live"' in page and "Waiting for a worker" in page
    assert client.get(f"/probes/{probe_id}/status.json").json()["status"] == "queued"
    assert "form probe" in client.get("/probes").text


def test_probe_form_refuses_without_the_run_scope(lab: Lab) -> None:
    with TestClient(web_app(lab.url)) as c:
        assert 'id="signin-needed"' in c.get("/launch/probe").text
        r = post_form(c, "/launch/probe", PROBE_BASE)
        assert r.status_code == 403
    assert _counts(lab) == (0, 0, 0)


# ----------------------------------------------------------------------- launch form


def test_launch_form_covers_every_run_spec_field() -> None:
    names = {f.name for f in launch_form.FIELDS}
    covered = {
        "goodput": any(n.startswith("goodput_") for n in names),
        "dataset_options": bool(launch_form.DATASET_GROUPS),  # typed, per dataset type
        "limits": {f"limits_{k}" for k in ClientLimits.model_fields} <= names,
        "endpoint_options": bool(launch_form.ENDPOINT_GROUPS),  # typed, per endpoint
        # written in the model field ("a:0.7,b:0.3") and the base URL field (comma-separated)
        "model_mix": "model" in names,
        "base_urls": "base_url" in names,
    }
    for field in RunSpec.model_fields:
        assert field in names or covered.get(field), f"the launch form has no {field} field"
    form = launch_form.defaults() | {
        "model": "a:0.7, b:0.3", "base_url": "http://127.0.0.1:9001, http://127.0.0.1:9002",
    }  # fmt: skip
    created, errors = launch_form.parse(form)
    assert not errors and created is not None, errors
    mix = [(m.model, m.weight) for m in created.model_mix]
    assert mix == [("a", 0.7), ("b", 0.3)]
    assert [str(u).rstrip("/") for u in created.base_urls] == [
        "http://127.0.0.1:9001", "http://127.0.0.1:9002",
    ]  # fmt: skip
    assert {"req_labels", "req_gpu_name", "req_min_gpu_memory_mb"} <= names


def test_launch_form_defaults_are_the_servers_target(lab: Lab) -> None:
    with TestClient(web_app(lab.url)) as c:  # nothing configured: the documented defaults
        html = c.get("/launch").text
    assert _value(html, "base_url") == "http://127.0.0.1:9000"
    assert _value(html, "model") == "tokentrace-sim"
    settings = Settings(
        database_url=lab.url,
        local_worker=False,
        default_target_url="http://10.1.2.3:8080",
        default_target_model="llama",
    )
    with TestClient(create_app(settings)) as c:
        html = c.get("/launch").text
    assert _value(html, "base_url") == "http://10.1.2.3:8080"
    assert _value(html, "model") == "llama"
    assert re.search(r'id="f-scrape_metrics"\s+checked', html)  # on unless unticked


def test_launch_form_server_metrics_fields_and_launch_again(client: TestClient, lab: Lab) -> None:
    form = {
        "base_url": "http://127.0.0.1:9",
        "model": "m",
        "name": "metrics off",
        "metrics_url": "http://127.0.0.1:9100/metrics",
        "metrics_series": "a:b, c:d",
        # scrape_metrics unticked: absent from the form
    }
    r = post_form(client, "/launch", form, follow_redirects=False)
    assert r.status_code == 303, _errors(r.text)
    run_id = r.headers["location"].removeprefix("/runs/")
    with session_scope(lab.sessions) as s:
        spec = dict(repo.get_run(s, run_id).spec or {})
    assert spec["scrape_metrics"] is False
    assert spec["metrics_url"] == "http://127.0.0.1:9100/metrics"
    assert spec["metrics_series"] == ["a:b", "c:d"]
    again = client.get(f"/launch?again={run_id}").text
    assert _value(again, "base_url") == "http://127.0.0.1:9"  # the run's, not the default
    assert _value(again, "metrics_series") == "a:b, c:d"
    assert _value(again, "name") == "metrics off (again)"
    assert re.search(r'id="f-scrape_metrics"\s*>', again)  # not checked
    bad = post_form(client, "/launch", form | {"metrics_url": "http://elsewhere:9100/metrics"})
    assert _errors(bad.text).get("metrics_url", "").startswith("metrics_url must be on the same")


def test_launch_form_limits_reach_the_spec_and_a_bad_one_is_named(
    client: TestClient, lab: Lab
) -> None:
    """The client's limits (``ClientLimits``) from the form's Limits group: a value given
    reaches the spec, the others keep their defaults; one under its minimum is refused beside
    its own field; "launch again" shows them."""
    form = {"base_url": "http://127.0.0.1:9", "model": "m", "limits_max_event_bytes": "2048"}
    r = post_form(client, "/launch", form, follow_redirects=False)
    assert r.status_code == 303, _errors(r.text)
    run_id = r.headers["location"].removeprefix("/runs/")
    with session_scope(lab.sessions) as s:
        spec = dict(repo.get_run(s, run_id).spec or {})
    assert spec["limits"]["max_event_bytes"] == 2048
    assert spec["limits"]["max_response_bytes"] == ClientLimits().max_response_bytes
    assert _value(client.get(f"/launch?again={run_id}").text, "limits_max_event_bytes") == "2048"
    bad = post_form(client, "/launch", form | {"limits_max_response_bytes": "10"})
    assert bad.status_code == 422
    assert "limits_max_response_bytes" in _errors(bad.text)


def test_serve_demo_makes_its_simulator_the_default_target(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from app.cli import main as cli_main
    from app.cli import serve_cmd
    from tests.live_server import free_port

    url = f"sqlite:///{tmp_path / 'demo.db'}"
    sessions = open_database(url)
    f = tmp_path / "log.csv"
    f.write_text(CSV_LOG)
    import_path(sessions, "csv", f, name="already here")[0]  # the demo seeds no run then
    port = free_port()
    seen: dict[str, Any] = {}

    def fake_run(app: Any, settings: Any, ns: Any) -> None:
        seen["settings"] = settings
        with TestClient(app) as c:
            seen["html"] = c.get("/launch").text

    monkeypatch.setattr(serve_cmd, "_run", fake_run)
    argv = ["serve", "--demo", "--demo-port", str(port), "--database-url", url]
    assert cli_main.main([*argv, "--no-local-worker"]) == 0
    assert seen["settings"].default_target_url == f"http://127.0.0.1:{port}"
    assert _value(seen["html"], "base_url") == f"http://127.0.0.1:{port}"
    assert _value(seen["html"], "model") == "tokentrace-sim"


# ----------------------------------------------------------------------- workers page


def test_age_text() -> None:
    assert workers_view.age_text(0) == "0 s ago"
    assert workers_view.age_text(12.9) == "12 s ago"
    assert workers_view.age_text(119) == "119 s ago"
    assert workers_view.age_text(120) == "2 min ago"
    assert workers_view.age_text(7199) == "119 min ago"
    assert workers_view.age_text(7200) == "2 h ago"
    assert workers_view.age_text(3 * 86400) == "3 d ago"
    assert workers_view.age_text(-4) == "0 s ago"  # a clock a little ahead


def _worker(
    s: Session, name: str, *, age_s: float, labels: dict[str, str], torch: str | None = None
) -> str:
    caps = {"hostname": f"{name}.lab", "tokentrace_version": "1", "labels": labels,
            "torch_version": torch, "gpus": []}  # fmt: skip
    w = worker_repo.insert_worker(
        s, name=name, hostname=f"{name}.lab", capabilities=caps, labels=labels, token_id=None
    )
    worker_repo.seen(s, w.id, utcnow() - dt.timedelta(seconds=age_s))
    return w.id


def _row(html: str, attr: str, value: str) -> str:
    m = re.search(rf'<tr {attr}="{value}">(.*?)</tr>', html, re.S)
    assert m is not None, value
    return m.group(1)


def test_workers_page_online_current_job_and_the_queue(client: TestClient, lab: Lab) -> None:
    with session_scope(lab.sessions) as s:
        busy = _worker(s, "busy", age_s=12, labels={"rack": "a"})
        gone = _worker(s, "gone", age_s=3600, labels={"rack": "b"})
        run_id = repo.create_run(s, RunSpec(base_url="http://x:1", model="m"), name="r")
        bench = job_repo.create_job(
            s, kind="bench", spec={}, requirements={}, run_id=run_id, max_attempts=1
        )
        job_repo.transition(s, bench.id, from_states=("queued",), state="running")
        worker_repo.seen(s, busy, utcnow() - dt.timedelta(seconds=12), current_job_id=bench.id)
        sweep_job = job_repo.create_job(
            s, kind="sweep", spec={"sweep_id": "sw1"}, requirements={}, run_id=None,
            max_attempts=1,
        )  # fmt: skip
        job_repo.transition(s, sweep_job.id, from_states=("queued",), state="running")
        worker_repo.seen(
            s, gone, utcnow() - dt.timedelta(seconds=3600), current_job_id=sweep_job.id
        )
        nowhere = job_repo.create_job(
            s, kind="bench", spec={}, requirements={"labels": {"rack": "z"}}, run_id=None,
            max_attempts=3,
        )  # fmt: skip
        only_offline = job_repo.create_job(
            s, kind="bench", spec={}, requirements={"labels": {"rack": "b"}}, run_id=None,
            max_attempts=3,
        )  # fmt: skip
        anyone = job_repo.create_job(
            s, kind="probe", spec={"probe_id": "p1"}, requirements={}, run_id=None,
            max_attempts=3,
        )  # fmt: skip
    html = client.get("/workers").text
    row = _row(html, "data-worker-id", busy)
    assert ">online<" in row
    age = int(re.search(r'data-age-s="(\d+)">(\d+) s ago<', row).group(2))  # type: ignore[union-attr]
    assert 12 <= age <= 14  # 12 s before the request, plus the time the request took
    assert f'<a href="/runs/{run_id}">run {run_id}</a>' in row
    row = _row(html, "data-worker-id", gone)
    assert ">offline<" in row and "60 min ago" in row and "data-age-s" not in row
    assert '<a href="/sweeps/sw1">sweep sw1</a>' in row
    reason = re.compile(r'class="queue-reason">([^<]*)<')
    assert reason.findall(_row(html, "data-job-id", nowhere.id)) == [
        "no online worker matches its requirements (rack=z)"
    ]
    # rack=b exists, but only on a worker that stopped heartbeating
    assert reason.findall(_row(html, "data-job-id", only_offline.id)) == [
        "no online worker matches its requirements (rack=b)"
    ]
    probe_row = _row(html, "data-job-id", anyone.id)
    assert '<a href="/probes/p1">probe p1</a>' in probe_row
    assert "no matching online worker has torch" in probe_row
    assert "3 jobs waiting for a worker" in html
    # queue oldest first
    assert html.index(nowhere.id) < html.index(only_offline.id) < html.index(anyone.id)


def test_queue_reasons_when_a_worker_matches() -> None:
    now = utcnow()

    def worker(busy: bool, torch: str | None) -> Any:
        return type("W", (), {
            "capabilities": {"hostname": "h", "tokentrace_version": "1", "torch_version": torch},
            "labels": {"rack": "a"}, "hostname": "h", "last_seen_at": now,
            "current_job_id": "j" if busy else None,
        })()  # fmt: skip

    job = type("J", (), {"requirements": {"labels": {"rack": "a"}}, "kind": "bench"})()
    assert workers_view.waiting_reason(job, []) == "no worker is online"  # type: ignore[arg-type]
    idle, busy = worker(False, None), worker(True, "2.0")
    assert workers_view.waiting_reason(job, [idle]) == "waiting for a matching worker to lease it"  # type: ignore[arg-type]
    assert workers_view.waiting_reason(job, [busy]).startswith("every matching worker is busy")  # type: ignore[arg-type]


def test_nav_links_to_the_probe_pages(client: TestClient) -> None:
    html = client.get("/workers").text
    nav = re.search(r"<nav>(.*?)</nav>", html, re.S)
    assert nav is not None
    for href in ("/probes", "/roofline", "/throughput", "/capacity", "/sweeps", "/workers"):
        assert f'href="{href}"' in nav.group(1), href
    assert 'href="/roofline" class="on"' in client.get("/roofline").text
    assert 'href="/probes" class="on"' in client.get("/launch/probe").text
    assert 'href="/launch/probe"' in client.get("/probes").text


# ------------------------------------------------------------ latency vs offered load


def _step(load: float | None, role: str, ttft: tuple[float, float]) -> dict[str, Any]:
    return {
        "load": load,
        "load_kind": "rate",
        "role": role,
        "latency_ms": {"ttft_ms": {"p50": ttft[0], "p99": ttft[1]}},
    }


def test_latency_vs_offered_load_figure_one_pair_of_lines_per_sweep() -> None:
    from app.figures.compare import sweep_latency_load_figure

    a = {"id": "a", "label": "A", "steps": [
        _step(1.0, "probe", (1, 2)),  # an auto sweep's synchronous run: not a load step
        _step(None, "probe", (9, 9)),  # its max-throughput run (no offered load)
        _step(2.0, "step", (10, 30)),
        _step(4.0, "step", (12, 50)),
    ]}  # fmt: skip
    b = {"id": "b", "label": "B", "steps": [_step(2.0, "step", (20, 40))]}
    fig = sweep_latency_load_figure([a, b], "ttft_ms", title="TTFT vs offered load", slo_ms=45)
    got = [(t["name"], t["x"], t["y"]) for t in fig["data"]]
    assert got == [
        ("A p50", [2.0, 4.0], [10.0, 12.0]),
        ("A p99", [2.0, 4.0], [30.0, 50.0]),
        ("B p50", [2.0], [20.0]),
        ("B p99", [2.0], [40.0]),
    ]
    assert fig["layout"]["yaxis"]["title"]["text"] == "TTFT (ms)"
    assert fig["layout"]["shapes"]  # the SLO line
    empty = sweep_latency_load_figure([{"id": "c", "steps": []}], "ttft_ms", title="t")
    assert empty["data"] == [] and "no data: no steps" in empty["layout"]["annotations"][0]["text"]


def test_launch_form_dataset_options() -> None:
    """The dataset type's own fields are typed inputs (tests/test_web_dataset_options.py):
    only the chosen type's are read, a bad one named beside its input, "launch again"
    shows them back."""
    base = launch_form.defaults() | {"base_url": "http://127.0.0.1:9000", "model": "m"}
    created, errors = launch_form.parse(base)
    assert created is not None and errors == {} and created.dataset_options == {}
    created, errors = launch_form.parse(base | {"opt-random-range_ratio": "0.5"})
    assert created is not None and created.dataset_options == {"range_ratio": 0.5}
    _, errors = launch_form.parse(base | {"opt-random-prefix_len": "x"})
    assert list(errors) == ["opt-random-prefix_len"]
    assert errors["opt-random-prefix_len"].startswith("dataset_options.prefix_len: ")
    again = launch_form.values_from_spec(
        {"dataset": "random", "dataset_options": {"prefix_len": 7}}, "r"
    )
    assert again["opt-random-prefix_len"] == "7" and again["opt-random-range_ratio"] == "0"
