"""Issue 25 in the dashboard's forms (TestClient, temp SQLite): each endpoint's own options
are typed fields of the run and sweep forms, generated from its option model as dataset
options are; posting them stores them typed in the spec, "launch again" shows them back,
a bad one is named beside its input and creates nothing, and a surface that cannot take
the dataset is refused naming both."""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from fastapi.testclient import TestClient
from sqlalchemy.orm import Session, sessionmaker

from app.client.endpoints import ENDPOINTS
from app.services import auth
from app.services.runs import open_database
from app.storage import compare_repo
from app.storage import repository as repo
from app.storage.db import session_scope
from app.web import endpoint_fields, launch_form, sweeps_form
from tests.test_web_dataset_options import BASE, _counts, _errors, _shown, _value
from tests.web_support import post_form, sign_in, web_app


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


name = endpoint_fields.option_name
# per endpoint: the form's extra fields, its option inputs, the stored endpoint_options
CASES: dict[str, tuple[dict[str, str], dict[str, str], dict[str, Any]]] = {
    "embeddings": (
        {},
        {"batch_size": "16", "encoding_format": "base64", "dimensions": "256"},
        {"batch_size": 16, "encoding_format": "base64", "dimensions": 256},
    ),
    "rerank": (
        {"dataset": "jsonl", "dataset_path": "/data/pairs.jsonl"},
        {"rerank_api": "cohere", "top_n": "3"},
        {"rerank_api": "cohere", "top_n": 3},
    ),
}


def _form(endpoint: str, sweep: bool = False) -> dict[str, str]:
    extra, options, _ = CASES[endpoint]
    out = (sweeps_form.defaults() if sweep else launch_form.defaults()) | BASE | extra
    out["endpoint"] = endpoint
    out |= {name(endpoint, k): v for k, v in options.items()}
    other = "rerank" if endpoint != "rerank" else "embeddings"  # another's: ignored
    out[endpoint_fields.BY_ENDPOINT[other].fields[0].name] = "7"
    return out


def test_every_endpoint_has_a_group_of_typed_fields(client: TestClient) -> None:
    assert [g.endpoint for g in launch_form.ENDPOINT_GROUPS] == list(ENDPOINTS)
    for g in launch_form.ENDPOINT_GROUPS:
        assert [f.option for f in g.fields] == list(ENDPOINTS[g.endpoint].options.model_fields)
    for path in ("/launch", "/launch/sweep"):
        html = client.get(path).text
        assert re.search(
            r'<input type="number" name="eopt-embeddings-batch_size" '
            r'id="f-eopt-embeddings-batch_size" value="1" step="1"\s+min="1" max="4096">',
            html,
        ), path
        assert 'data-endpoint-options="rerank"' in html
        assert 'data-endpoint-options="chat"' not in html  # no options of its own: no group
        for e in ENDPOINTS:
            assert f'<option value="{e}"' in html


@pytest.mark.parametrize("endpoint", list(CASES))
def test_run_form_stores_the_typed_options_and_launch_again_shows_them(
    client: TestClient, sessions: sessionmaker[Session], endpoint: str
) -> None:
    r = post_form(client, "/launch", _form(endpoint), follow_redirects=False)
    assert r.status_code == 303, _errors(r.text)
    run_id = r.headers["location"].removeprefix("/runs/")
    want = CASES[endpoint][2]
    with session_scope(sessions) as s:
        run = repo.find_run(s, run_id)
        assert run is not None
        assert run.spec["endpoint"] == endpoint and run.spec["endpoint_options"] == want
        assert run.spec["stream"] is False  # one answer a request
    again = client.get(f"/launch?again={run_id}").text
    assert re.search(rf'<option value="{endpoint}" selected>', again)
    for k, v in CASES[endpoint][1].items():
        assert _shown(again, name(endpoint, k), v), k


@pytest.mark.parametrize("endpoint", list(CASES))
def test_sweep_form_stores_the_typed_options(
    client: TestClient, sessions: sessionmaker[Session], endpoint: str
) -> None:
    form = _form(endpoint, sweep=True) | {"loads": "2, 4"}
    r = post_form(client, "/launch/sweep", form, follow_redirects=False)
    assert r.status_code == 303, _errors(r.text)
    sweep_id = r.headers["location"].removeprefix("/sweeps/")
    with session_scope(sessions) as s:
        sweep = compare_repo.find_sweep(s, sweep_id)
        assert sweep is not None and sweep.spec["endpoint_options"] == CASES[endpoint][2]
    again = client.get(f"/launch/sweep?again={sweep_id}").text
    for k, v in CASES[endpoint][1].items():
        assert _shown(again, name(endpoint, k), v), k


@pytest.mark.parametrize(
    ("endpoint", "option", "bad", "text"),
    [
        ("embeddings", "batch_size", "0", "greater than or equal to 1"),
        ("embeddings", "batch_size", "many", "valid integer"),
        ("rerank", "top_n", "0", "greater than or equal to 1"),
    ],
)
@pytest.mark.parametrize("path", ["/launch", "/launch/sweep"])
def test_a_bad_option_is_named_beside_its_input_and_creates_nothing(
    client: TestClient,
    sessions: sessionmaker[Session],
    path: str,
    endpoint: str,
    option: str,
    bad: str,
    text: str,
) -> None:
    form = _form(endpoint, sweep=path.endswith("sweep")) | {name(endpoint, option): bad}
    form |= {"loads": "2, 4"} if path.endswith("sweep") else {}
    before = _counts(sessions)
    r = post_form(client, path, form, follow_redirects=False)
    assert r.status_code == 422
    errors = _errors(r.text)
    assert list(errors) == [name(endpoint, option)], errors
    assert errors[name(endpoint, option)].startswith(f"endpoint_options.{option}: ")
    assert text in errors[name(endpoint, option)]
    assert _value(r.text, name(endpoint, option)) == bad
    assert _counts(sessions) == before


def test_a_surface_that_cannot_take_the_dataset_is_refused_naming_both(
    client: TestClient, sessions: sessionmaker[Session]
) -> None:
    before = _counts(sessions)
    form = _form("rerank") | {"dataset": "random", "dataset_path": ""}
    r = post_form(client, "/launch", form, follow_redirects=False)
    assert r.status_code == 422
    errors = _errors(r.text)
    assert list(errors) == ["dataset"], errors
    assert "endpoint 'rerank'" in errors["dataset"] and "'random'" in errors["dataset"]
    r = post_form(client, "/launch", _form("embeddings") | {"temperature": "0.5"})
    assert r.status_code == 422
    assert "endpoint 'embeddings' generates no tokens" in _errors(r.text)["temperature"]
    assert _counts(sessions) == before
