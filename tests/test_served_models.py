"""Issue 13.6: a run records the models the server lists (``GET /v1/models``) and warns when
the requested one is not among them; the bundled llama.cpp server advertises its model."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import httpx
import pytest

from app.client.served_models import models_url, parse_models
from app.client.spec import RunSpec
from app.services.runs import execute_bench, open_database, run_report
from app.targets.sim_config import SimConfig
from app.targets.simulator import start_simulator_thread


def test_parse_models_openai_and_llamacpp_shapes() -> None:
    assert parse_models({"object": "list", "data": [{"id": "a"}, {"id": "b"}]}) == ["a", "b"]
    # llama.cpp answers both lists
    body = {"models": [{"name": "m", "model": "m"}], "data": [{"id": "m"}]}
    assert parse_models(body) == ["m"]
    assert parse_models({"models": [{"model": "x"}]}) == ["x"]
    with pytest.raises(ValueError, match="no 'data' list"):
        parse_models({"error": "nope"})
    assert models_url("http://h:1/v1/") == "http://h:1/v1/models"
    assert models_url("http://h:1") == "http://h:1/v1/models"


def test_run_records_served_models_and_warns_on_another_model(tmp_path: Path) -> None:
    sessions = open_database(f"sqlite:///{tmp_path / 'm.db'}")
    sim = start_simulator_thread(SimConfig(ttft_ms=2, itl_ms=1, seed=1))
    try:
        listed = [m["id"] for m in httpx.get(f"{sim.base_url}/v1/models").json()["data"]]
        runs = {}
        for model in ("tokentrace-sim", "llama-3-70b"):
            spec = RunSpec(base_url=sim.base_url, model=model, num_prompts=3, input_len=8,
                           output_len=4, scrape_metrics=False)  # fmt: skip
            runs[model] = execute_bench(spec, sessions=sessions)
    finally:
        sim.stop()
    assert listed == ["tokentrace-sim"]
    same, other = runs["tokentrace-sim"], runs["llama-3-70b"]
    assert same.report["load"]["served_models"] == listed
    assert not any("model" in n for n in same.report["validity"]["notes"])
    assert other.report["load"]["served_models"] == listed
    assert other.run_id is not None
    stored = run_report(sessions, other.run_id)  # kept with the run
    assert (
        "the requested model 'llama-3-70b' is not among the models the server lists "
        "('tokentrace-sim'): the figures may be of another model"
    ) in stored["validity"]["notes"]


def test_unlisted_models_are_noted_not_fatal() -> None:
    spec = RunSpec(base_url="http://127.0.0.1:9", model="m", num_prompts=1, output_len=2,
                   scrape_metrics=False)  # fmt: skip
    out = execute_bench(spec, sessions=None)
    assert out.report["load"]["served_models"] is None
    notes = out.report["validity"]["notes"]
    assert any(
        n.startswith("could not list the served models (GET http://127.0.0.1:9/v1/models: Conn")
        for n in notes
    ), notes


def test_llamacpp_server_advertises_its_model_name() -> None:
    if importlib.util.find_spec("xllamacpp") is None:
        pytest.skip("xllamacpp is not installed (make install-realmodel)")
    from app.targets.llamacpp import MODEL_NAME, server_params

    params = server_params(Path("/m.gguf"), port=1, parallel=1, threads=1, ctx_size=64)
    assert params.model_alias == {MODEL_NAME}  # a str was split into characters: {"S", "m", ...}
