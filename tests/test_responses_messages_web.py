"""The Responses API and Anthropic Messages surfaces in the launch form (their own typed
option fields, stored typed, shown back by "launch again", a bad one named beside its input
with nothing created) and on the REST + worker path (a run queued through the API, run by a
``tokentrace worker`` subprocess against the simulator: every stored request's tokens are
the simulator's, its TTFT within a generous bound of the simulator's own)."""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path

import pytest
from fastapi.testclient import TestClient
from sqlalchemy.orm import Session, sessionmaker

from app.services import auth
from app.services.runs import open_database
from app.storage import repository as repo
from app.storage.db import session_scope
from app.targets.sim_config import SimConfig
from app.targets.simulator import start_simulator_thread
from app.web import endpoint_fields, launch_form
from tests.live_server import LiveServerFactory
from tests.test_web_dataset_options import BASE, _counts, _errors, _value
from tests.web_support import post_form, sign_in, web_app
from tests.worker_helpers import api, sim_spec, start_worker_process, submit, wait_job

name = endpoint_fields.option_name


@pytest.fixture
def sessions(tmp_path: Path) -> sessionmaker[Session]:
    return open_database(f"sqlite:///{tmp_path / 'forms.db'}")


@pytest.fixture
def client(sessions: sessionmaker[Session], tmp_path: Path) -> Iterator[TestClient]:
    with session_scope(sessions) as s:
        _, secret = auth.create_token(s, scopes=["run"], name="runner")
    with TestClient(web_app(f"sqlite:///{tmp_path / 'forms.db'}")) as c:
        assert sign_in(c, secret).status_code == 303
        yield c


CASES = {
    "responses": (
        {"reasoning_effort": "low", "reasoning_summary": "auto"},
        {"reasoning_effort": "low", "reasoning_summary": "auto"},
    ),
    "anthropic-messages": (
        {"anthropic_version": "2024-01-01", "thinking_budget": "2048"},
        {"anthropic_version": "2024-01-01", "thinking_budget": 2048},
    ),
}


def test_the_form_shows_each_surfaces_own_fields(client: TestClient) -> None:
    groups = {g.endpoint: g for g in launch_form.ENDPOINT_GROUPS}
    assert [f.option for f in groups["responses"].fields] == [
        "reasoning_effort", "reasoning_summary",
    ]  # fmt: skip
    assert [f.option for f in groups["anthropic-messages"].fields] == [
        "anthropic_version", "thinking_budget",
    ]  # fmt: skip
    html = client.get("/launch").text
    for endpoint in CASES:
        assert f'data-endpoint-options="{endpoint}"' in html
        assert f'<option value="{endpoint}"' in html
    sel = re.search(r'<select name="eopt-responses-reasoning_effort"[^>]*>(.*?)</select>', html,
                    re.DOTALL)  # fmt: skip
    assert sel is not None
    for choice in ("none", "minimal", "low", "medium", "high"):
        assert f'<option value="{choice}"' in sel.group(1)
    assert re.search(
        r'<input type="number" name="eopt-anthropic-messages-thinking_budget" '
        r'id="f-eopt-anthropic-messages-thinking_budget" value="" step="1"\s+min="1024"',
        html,
    )
    assert _value(html, "eopt-anthropic-messages-anthropic_version") == "2023-06-01"


@pytest.mark.parametrize("endpoint", list(CASES))
def test_the_form_stores_them_typed_and_launch_again_shows_them(
    client: TestClient, sessions: sessionmaker[Session], endpoint: str
) -> None:
    options, want = CASES[endpoint]
    form = launch_form.defaults() | BASE | {"endpoint": endpoint, "output_len": "4096"}
    form |= {name(endpoint, k): v for k, v in options.items()}
    other = "embeddings"  # another surface's field: ignored
    form[endpoint_fields.BY_ENDPOINT[other].fields[0].name] = "7"
    r = post_form(client, "/launch", form, follow_redirects=False)
    assert r.status_code == 303, _errors(r.text)
    run_id = r.headers["location"].removeprefix("/runs/")
    with session_scope(sessions) as s:
        run = repo.find_run(s, run_id)
        assert run is not None
        assert run.spec["endpoint"] == endpoint and run.spec["endpoint_options"] == want
        assert run.spec["stream"] is True
    again = client.get(f"/launch?again={run_id}").text
    assert re.search(rf'<option value="{endpoint}" selected>', again)
    if endpoint == "anthropic-messages":
        assert _value(again, name(endpoint, "anthropic_version")) == "2024-01-01"
        assert _value(again, name(endpoint, "thinking_budget")) == "2048"


def test_a_bad_option_is_named_beside_its_input_and_creates_nothing(
    client: TestClient, sessions: sessionmaker[Session]
) -> None:
    before = _counts(sessions)
    form = launch_form.defaults() | BASE | {"endpoint": "anthropic-messages"}
    form[name("anthropic-messages", "thinking_budget")] = "10"
    r = post_form(client, "/launch", form, follow_redirects=False)
    assert r.status_code == 422
    errors = _errors(r.text)
    field = name("anthropic-messages", "thinking_budget")
    assert list(errors) == [field], errors
    assert errors[field].startswith("endpoint_options.thinking_budget: ")
    assert _counts(sessions) == before


def test_rest_and_worker_path_against_the_simulator(
    live_server: LiveServerFactory, sqlite_url: str, tmp_path: Path
) -> None:
    srv = live_server(sqlite_url)
    sim = start_simulator_thread(SimConfig(ttft_ms=3, itl_ms=0.5, seed=2, reasoning_tokens=2))
    worker = start_worker_process(srv.url, srv.worker_token, tmp_path / "state")
    try:
        with api(srv) as c:
            spec = sim_spec(sim.base_url, endpoint="responses", num_prompts=6, max_concurrency=2,
                            endpoint_options={"reasoning_effort": "low"})  # fmt: skip
            bad = c.post("/runs", json=spec | {"endpoint_options": {"batch_size": 2}})
            assert bad.status_code == 422 and "endpoint_options.batch_size" in bad.text
            run_id, job_id = submit(c, spec)
            done = wait_job(c, job_id, ("succeeded", "failed", "cancelled"), 60)
            assert done["state"] == "succeeded", done
            rows = c.get(f"/runs/{run_id}/requests", params={"limit": 100}).json()["items"]
        truth = sim.ground_truth()["requests"]
    finally:
        worker.terminate()
        worker.wait(20)
        sim.stop()
    assert len(rows) == 6
    for row in rows:
        g = truth[f"{run_id}-{row['index']}"]
        assert g["endpoint"] == "responses" and row["status"] == "ok"
        assert row["output_tokens"] == g["output_tokens"] == 8
        assert row["input_tokens"] == g["input_tokens"]
        ev = g["events"]
        first = next(
            t for t, k in zip(ev["t_ns"], ev["kind"], strict=True) if k in ("reasoning", "content")
        )
        server_ttft_ms = (int(first) - int(g["received_ns"])) / 1e6
        assert row["ttft_ms"] >= server_ttft_ms - 5  # the send precedes the server's receipt
        assert abs(row["ttft_ms"] - server_ttft_ms) < 100  # generous: a shared CI machine
