"""Issue 16 in the dashboard's forms (TestClient, temp SQLite): each dataset type's own
options are typed fields of the run and sweep forms, generated from its option model;
posting them stores them typed in the run's (sweep's) spec, "launch again" shows them back,
a bad one is named beside its input (value kept, nothing created). The sweep API takes every
run-workload field and refuses, naming the field, what each step sets itself."""

from __future__ import annotations

import re
from collections.abc import Iterator
from html import unescape
from pathlib import Path
from typing import Any

import pytest
from fastapi.testclient import TestClient
from sqlalchemy.orm import Session, sessionmaker

from app.client.datasets import DATASETS
from app.services import auth
from app.services.runs import open_database
from app.storage import compare_repo
from app.storage import jobs as job_repo
from app.storage import repository as repo
from app.storage.db import session_scope
from app.web import dataset_fields, launch_form, sweeps_form
from tests.web_support import post_form, sign_in, web_app

ERR = re.compile(r'id="err-([a-z_-]+)">([^<]*)<')
BASE = {"base_url": "http://127.0.0.1:9", "model": "m", "num_prompts": "10"}
# per dataset type: the form's extra fields, its option inputs (non-default values), and the
# dataset_options the stored spec must hold (typed)
CASES: dict[str, tuple[dict[str, str], dict[str, str], dict[str, Any]]] = {
    "random": (
        {},
        {"range_ratio": "0.25", "prefix_len": "8"},
        {"range_ratio": 0.25, "prefix_len": 8},
    ),
    "jsonl": ({"dataset_path": "/data/prompts.jsonl"}, {}, {}),
    "sharegpt": (
        {"dataset_path": "/data/sharegpt.json"},
        {
            "output_len": "32",
            "min_len": "2",
            "max_prompt_len": "512",
            "max_total_len": "900",
            "pairing": "first_human",
        },
        {
            "output_len": 32,
            "min_len": 2,
            "max_prompt_len": 512,
            "max_total_len": 900,
            "pairing": "first_human",
        },
    ),
    "prefix_repetition": (
        {},
        {"prefix_len": "64", "suffix_len": "32", "num_prefixes": "4", "output_len": "16"},
        {"prefix_len": 64, "suffix_len": 32, "num_prefixes": 4, "output_len": 16},
    ),
    "mooncake": (
        {"dataset_path": "/data/trace.jsonl"},
        {"block_size": "16", "speedup": "2.5"},
        {"block_size": 16, "speedup": 2.5},
    ),
    "timed_jsonl": ({"dataset_path": "/data/timed.jsonl"}, {"speedup": "4"}, {"speedup": 4.0}),
    "random-mm": (
        {},
        {"image_count": "2", "image_size": "256x128"},
        {"image_count": 2, "image_size": "256x128"},
    ),
}


@pytest.fixture
def sessions(tmp_path: Path) -> sessionmaker[Session]:
    return open_database(f"sqlite:///{tmp_path / 'forms.db'}")


@pytest.fixture
def token(sessions: sessionmaker[Session]) -> str:
    with session_scope(sessions) as s:
        _, secret = auth.create_token(s, scopes=["run"], name="runner")
    return secret


@pytest.fixture
def client(token: str, tmp_path: Path) -> Iterator[TestClient]:
    with TestClient(web_app(f"sqlite:///{tmp_path / 'forms.db'}")) as c:
        assert sign_in(c, token).status_code == 303
        yield c


def _errors(html: str) -> dict[str, str]:
    return {k: unescape(v) for k, v in ERR.findall(html)}


def _value(html: str, name: str) -> str:
    m = re.search(rf'id="f-{re.escape(name)}"\s*value="([^"]*)"', html)
    assert m is not None, name
    return unescape(m.group(1))


def _shown(html: str, name: str, want: str) -> bool:
    """The form shows ``want`` for option input ``name`` (a number, or a select's choice)."""
    sel = re.search(rf'<select name="{re.escape(name)}" id="f-{re.escape(name)}">(.*?)</select>',
                    html, re.DOTALL)  # fmt: skip
    if sel is not None:
        return f'<option value="{want}" selected>' in sel.group(1)
    if not want.replace(".", "").isdigit():  # a text option (an image size)
        return _value(html, name) == want
    return float(_value(html, name)) == float(want)


def _counts(sessions: sessionmaker[Session]) -> tuple[int, int]:
    with session_scope(sessions) as s:
        runs = repo.count_runs(s)
        jobs = job_repo.count_jobs(s, state=None, kind=None)
    return runs, jobs


def _form(dataset: str, sweep: bool = False) -> dict[str, str]:
    extra, options, _ = CASES[dataset]
    out = (sweeps_form.defaults() if sweep else launch_form.defaults()) | BASE | extra
    out["dataset"] = dataset
    out |= {dataset_fields.option_name(dataset, k): v for k, v in options.items()}
    # another type's option set too: ignored (only the chosen type's fields are read)
    other = "timed_jsonl" if dataset != "timed_jsonl" else "random"
    other_field = dataset_fields.BY_DATASET[other].fields[0]
    out[other_field.name] = "0.5"
    return out


def test_every_dataset_type_has_a_group_of_typed_fields() -> None:
    assert [g.dataset for g in launch_form.DATASET_GROUPS] == list(DATASETS)
    for g in launch_form.DATASET_GROUPS:
        model = DATASETS[g.dataset].options
        assert [f.option for f in g.fields] == list(model.model_fields)
        for f in g.fields:
            assert f.name == f"opt-{g.dataset}-{f.option}"
            if f.kind == "select":  # a Literal option: its values, blank for the default
                assert f.choices == ("", "vllm", "first_human") and f.default == "vllm"
            elif model.model_fields[f.option].annotation is str:  # random-mm's image_size
                assert f.kind == "text"
            else:
                assert f.kind == "number" and f.step in ("1", "any")
            assert f.help.startswith(model.model_fields[f.option].description or "?")
    rr = dataset_fields.BY_DATASET["random"].fields[0]
    assert (rr.option, rr.minimum, rr.maximum, rr.step) == ("range_ratio", "0", "1", "any")
    assert "dataset_options" not in {f.name for f in launch_form.FIELDS}  # no JSON textarea


def test_the_form_renders_each_group_with_bounds_and_defaults(client: TestClient) -> None:
    for path in ("/launch", "/launch/sweep"):
        html = client.get(path).text
        for name in DATASETS:
            assert f'data-dataset-options="{name}"' in html, (path, name)
        assert re.search(
            r'<input type="number" name="opt-random-range_ratio" id="f-opt-random-range_ratio"'
            r' value="0" step="any"\s+min="0" max="1">',
            html,
        ), path
        assert _value(html, "opt-mooncake-block_size") == "512"
        assert _value(html, "opt-sharegpt-output_len") == ""  # None: blank
        assert re.search(r"/static/dataset-options\.[0-9a-f]{12}\.js", html)
        assert 'name="dataset_options"' not in html


@pytest.mark.parametrize("dataset", list(CASES))
def test_run_form_stores_the_typed_options_and_launch_again_shows_them(
    client: TestClient, sessions: sessionmaker[Session], dataset: str
) -> None:
    r = post_form(client, "/launch", _form(dataset), follow_redirects=False)
    assert r.status_code == 303, _errors(r.text)
    run_id = r.headers["location"].removeprefix("/runs/")
    want = CASES[dataset][2]
    with session_scope(sessions) as s:
        run = repo.find_run(s, run_id)
        assert run is not None
        assert run.spec["dataset"] == dataset
        assert run.spec["dataset_options"] == want
        for k, v in want.items():
            assert type(run.spec["dataset_options"][k]) is type(v)
    again = client.get(f"/launch?again={run_id}").text
    assert re.search(rf'<option value="{dataset}" selected>', again)
    for k, v in CASES[dataset][1].items():
        assert _shown(again, dataset_fields.option_name(dataset, k), v), k


@pytest.mark.parametrize("dataset", list(CASES))
def test_sweep_form_stores_the_typed_options_and_launch_again_shows_them(
    client: TestClient, sessions: sessionmaker[Session], dataset: str
) -> None:
    timed = DATASETS[dataset].timed  # a trace gives send times: sweep concurrencies
    mode = {"sweep_mode": "concurrencies", "loads": "1, 2"} if timed else {"loads": "2, 4"}
    r = post_form(
        client, "/launch/sweep", _form(dataset, sweep=True) | mode, follow_redirects=False
    )
    assert r.status_code == 303, _errors(r.text)
    sweep_id = r.headers["location"].removeprefix("/sweeps/")
    with session_scope(sessions) as s:
        sweep = compare_repo.find_sweep(s, sweep_id)
        assert sweep is not None
        assert sweep.spec["dataset_options"] == CASES[dataset][2]
    again = client.get(f"/launch/sweep?again={sweep_id}").text
    for k, v in CASES[dataset][1].items():
        assert _shown(again, dataset_fields.option_name(dataset, k), v), k


BAD = [
    ("random", "range_ratio", "1.5", "less than 1"),
    ("random", "prefix_len", "-3", "greater than or equal to 0"),
    ("random", "prefix_len", "lots", "valid integer"),
    ("sharegpt", "min_len", "2000", "larger than max_prompt_len"),
    ("prefix_repetition", "num_prefixes", "50", "at least as many prompts"),
    ("mooncake", "speedup", "0", "greater than 0"),
    ("timed_jsonl", "speedup", "x", "valid number"),
    ("random-mm", "image_size", "9000x9000", "1 to 4096 pixels"),
    ("random-mm", "image_size", "large", "WIDTHxHEIGHT"),
    ("random-mm", "image_count", "0", "greater than or equal to 1"),
]


@pytest.mark.parametrize(("dataset", "option", "bad", "text"), BAD)
@pytest.mark.parametrize("path", ["/launch", "/launch/sweep"])
def test_a_bad_option_is_named_beside_its_input_and_creates_nothing(
    client: TestClient,
    sessions: sessionmaker[Session],
    path: str,
    dataset: str,
    option: str,
    bad: str,
    text: str,
) -> None:
    sweep = path == "/launch/sweep"
    form = _form(dataset, sweep=sweep) | {dataset_fields.option_name(dataset, option): bad}
    if sweep:
        form |= {"sweep_mode": "concurrencies", "loads": "1, 2"}
    before = _counts(sessions)
    r = post_form(client, path, form, follow_redirects=False)
    assert r.status_code == 422
    name = dataset_fields.option_name(dataset, option)
    errors = _errors(r.text)
    assert list(errors) == [name], errors
    assert errors[name].startswith(f"dataset_options.{option}: ") and text in errors[name]
    assert 'id="form-error"' in r.text
    assert _value(r.text, name) == bad  # the form keeps what was typed
    assert re.search(rf'<option value="{dataset}" selected>', r.text)
    assert _counts(sessions) == before


def test_run_form_without_the_textarea_still_ignores_a_stray_json_field() -> None:
    base = launch_form.defaults() | BASE
    created, errors = launch_form.parse(base | {"dataset_options": '{"range_ratio": 0.9}'})
    assert errors == {} and created is not None and created.dataset_options == {}


# ----------------------------------------------------------------------- the sweep API


def _api_sweep(client: TestClient, token: str, **body: Any) -> Any:
    fields = {"base_url": "http://127.0.0.1:9", "model": "m", "num_prompts": 6} | body
    return client.post("/api/v1/sweeps", json=fields, headers={"Authorization": f"Bearer {token}"})


def test_the_sweep_api_takes_every_workload_field(
    client: TestClient, token: str, sessions: sessionmaker[Session]
) -> None:
    workload = {
        "dataset": "sharegpt",
        "dataset_path": "/data/sharegpt.json",
        "dataset_options": {"max_prompt_len": 512},
        "multi_turn": True,
        "max_turns": 3,
        "turn_delay_ms": 50.0,
        "temperature": 0.2,
        "top_p": 0.9,
        "top_k": 20,
        "min_p": 0.05,
        "repetition_penalty": 1.1,
        "frequency_penalty": 0.1,
        "presence_penalty": 0.2,
        "stream": False,
        "headers": {"X-Tenant": "lab"},
    }
    r = _api_sweep(client, token, rates=[1, 2], **workload)
    assert r.status_code == 201, r.text
    ramp = {"ramp_up_strategy": "linear", "ramp_up_start_rps": 1.0, "ramp_up_end_rps": 8.0}
    r2 = _api_sweep(client, token, concurrencies=[1, 2], **ramp)
    assert r2.status_code == 201, r2.text
    trace = {"dataset": "mooncake", "dataset_path": "/t.jsonl", "dataset_options": {"speedup": 2}}
    r3 = _api_sweep(client, token, concurrencies=[2, 4], **trace)
    assert r3.status_code == 201, r3.text
    with session_scope(sessions) as s:
        spec = compare_repo.find_sweep(s, r.json()["sweep_id"]).spec  # type: ignore[union-attr]
        assert {k: spec[k] for k in workload} == workload
        spec2 = compare_repo.find_sweep(s, r2.json()["sweep_id"]).spec  # type: ignore[union-attr]
        assert {k: spec2[k] for k in ramp} == ramp
        spec3 = compare_repo.find_sweep(s, r3.json()["sweep_id"]).spec  # type: ignore[union-attr]
        assert spec3["dataset_options"] == {"speedup": 2.0}


@pytest.mark.parametrize(
    ("body", "field", "text"),
    [
        ({"rates": [1, 2], "request_rate": 5}, "request_rate", "sets each step's load"),
        ({"auto": True, "request_rate": 5}, "request_rate", "sets each step's load"),
        ({"concurrencies": [1, 2], "max_concurrency": 4}, "max_concurrency", "concurrency"),
        (
            {"rates": [1, 2], "ramp_up_strategy": "linear", "ramp_up_start_rps": 1,
             "ramp_up_end_rps": 4},
            "ramp_up_strategy",
            "concurrency sweep",
        ),
        (
            {"auto": True, "dataset": "timed_jsonl", "dataset_path": "/t.jsonl"},
            "dataset",
            "sweep concurrencies instead",
        ),
        (
            {"rates": [1, 2], "dataset": "random", "dataset_options": {"speedup": 2}},
            "body",
            "dataset_options.speedup",
        ),
    ],
)  # fmt: skip
def test_the_sweep_api_refuses_what_a_step_sets_itself(
    client: TestClient, token: str, sessions: sessionmaker[Session], body: dict[str, Any],
    field: str, text: str,
) -> None:  # fmt: skip
    r = _api_sweep(client, token, **body)
    assert r.status_code == 422, r.text
    detail = r.json()["detail"]
    assert any(field in e["loc"] and text in e["msg"] for e in detail), detail
    assert _counts(sessions) == (0, 0)


def test_the_sweep_form_names_a_load_field_that_a_step_sets(client: TestClient) -> None:
    base = sweeps_form.defaults() | BASE | {"loads": "2, 4"}
    ramp = {"ramp_up_strategy": "linear", "ramp_up_start_rps": "1", "ramp_up_end_rps": "4"}
    r = post_form(client, "/launch/sweep", base | ramp)
    assert r.status_code == 422
    assert "a rate sweep sets each step's request rate" in _errors(r.text)["ramp_up_strategy"]
    timed = {"dataset": "mooncake", "dataset_path": "/t.jsonl"}
    r = post_form(client, "/launch/sweep", base | timed)
    assert "sweep concurrencies instead" in _errors(r.text)["dataset"]
    r = post_form(
        client,
        "/launch/sweep",
        base | {"sweep_mode": "concurrencies", "loads": "1, 2", "max_concurrency": "3"},
    )
    assert "sets each step's concurrency" in _errors(r.text)["max_concurrency"]


def test_the_sweep_form_has_every_run_workload_field_and_stores_them(
    client: TestClient, sessions: sessionmaker[Session]
) -> None:
    run_names = {f.name for f in launch_form.FIELDS}
    sweep_names = {f.name for f in sweeps_form.FIELDS}
    assert run_names - sweep_names == {"request_rate"}  # each step sets its own
    form = (
        sweeps_form.defaults()
        | BASE
        | {
            "sweep_mode": "concurrencies",
            "loads": "1, 2",
            "dataset": "sharegpt",
            "dataset_path": "/data/sharegpt.json",
            "multi_turn": "on",
            "max_turns": "3",
            "turn_delay_ms": "25",
            "ramp_up_strategy": "exponential",
            "ramp_up_start_rps": "1",
            "ramp_up_end_rps": "16",
            "temperature": "0.5",
            "top_p": "0.8",
            "top_k": "40",
            "stream": "",
            "headers": "X-Tenant: lab\nX-Trace: 1",
        }
    )
    r = post_form(client, "/launch/sweep", form, follow_redirects=False)
    assert r.status_code == 303, _errors(r.text)
    sweep_id = r.headers["location"].removeprefix("/sweeps/")
    with session_scope(sessions) as s:
        sweep = compare_repo.find_sweep(s, sweep_id)
        assert sweep is not None
        spec = dict(sweep.spec)
    want = {
        "multi_turn": True,
        "max_turns": 3,
        "turn_delay_ms": 25.0,
        "ramp_up_strategy": "exponential",
        "ramp_up_start_rps": 1.0,
        "ramp_up_end_rps": 16.0,
        "temperature": 0.5,
        "top_p": 0.8,
        "top_k": 40,
        "stream": False,
        "headers": {"X-Tenant": "lab", "X-Trace": "1"},
    }
    assert {k: spec[k] for k in want} == want
    again = client.get(f"/launch/sweep?again={sweep_id}").text
    assert _value(again, "max_turns") == "3" and _value(again, "ramp_up_end_rps") == "16"
