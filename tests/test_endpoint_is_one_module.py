"""A new API surface is one module (``app.client.endpoints``) plus its simulator handler
(``app.targets.simulator.surfaces``): registering both, as their modules would, is all a
spec, its checks, the CLI's flags, the launch forms' fields, the load generator, the
simulator and the report need. The surface here is vLLM's classification API
(``POST /classify``: inputs in, one label a input out), with an option of its own."""

from __future__ import annotations

import json
from typing import Any

import pytest
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from app.analysis.metrics import compute_metrics
from app.cli.args import Parser, UsageError, add_bench_arguments, spec_from_args
from app.client import endpoints
from app.client.datasets.base import Prompt, Workload
from app.client.endpoints.base import (
    BodyParams,
    ClassifyFn,
    ResultRule,
    SpecFacts,
    decode_answer,
    dumps,
    usage_of,
    wrong_shape,
)
from app.client.events import Classified
from app.client.runner import run_load
from app.client.spec import RunSpec
from app.domain import EventKind, RequestStatus, trace_from_records
from app.targets.sim_config import SimConfig
from app.targets.simulator import start_simulator_thread, surfaces
from app.targets.simulator.http import json_bytes
from app.targets.simulator.plan import Plan, count_prompt
from app.web import endpoint_fields
from tests.test_client import run

# ---------------------------------------------------------------- the surface's module


class ClassifyOptions(BaseModel):
    model_config = ConfigDict(extra="forbid")
    inputs_per_request: int = Field(1, ge=1, le=64, description="texts per request")


class Classify:
    name = "classify"
    summary = "classification (/classify): a label per input"
    options: type[BaseModel] = ClassifyOptions
    answer = "a classification answer (data[].label)"
    streams = False
    generates = False
    conversation = False
    parts = False
    items = "texts"
    paths: tuple[str, ...] = ("/classify",)

    def path(self, options: BaseModel) -> str:
        return self.paths[0]

    def check(self, facts: SpecFacts, options: BaseModel) -> None:
        if facts.dataset != "random":
            raise ValueError("dataset: endpoint 'classify' takes dataset 'random' here")

    def batch(self, options: BaseModel) -> int:
        assert isinstance(options, ClassifyOptions)
        return options.inputs_per_request

    def requests(self, workload: Workload, options: BaseModel) -> Workload:
        n = self.batch(options)

        def group(ps: list[Prompt]) -> list[Prompt]:
            return [
                Prompt(None, None, 0, 0, tuple(p.prompt or "" for p in ps[i : i + n]))
                for i in range(0, len(ps), n)
            ]

        return Workload(group(workload.warmup), group(workload.measured), workload.source)

    def body(self, prompt: Prompt, params: BodyParams, options: BaseModel) -> bytes:
        return dumps({"model": params.model, "input": list(prompt.inputs or ())})

    def classifier(self, options: BaseModel) -> ClassifyFn:
        def classify(data: bytes | None) -> Classified:
            obj, other = decode_answer(data, self.answer)
            if other is not None:
                return other
            rows = obj.get("data") if isinstance(obj, dict) else None
            if not isinstance(rows, list):
                return Classified(EventKind.OTHER, "", None, wrong_shape(self.answer, data))
            return Classified(EventKind.ANSWER, "", usage_of(obj), None, len(rows))

        return classify

    def result(self, prompt: Prompt, options: BaseModel) -> ResultRule | None:
        n = len(prompt.inputs or ())
        return ResultRule(results=n, items=n)


# ----------------------------------------------------------------- its simulator handler


class ClassifyHandler:
    endpoint = "classify"

    def plan(self, body: dict[str, Any], path: str, config: SimConfig) -> Plan:
        texts = body["input"]
        tokens = sum(count_prompt(t) for t in texts)
        answer = {
            "data": [{"index": i, "label": "yes", "num_classes": 2} for i in range(len(texts))],
            "usage": {"prompt_tokens": tokens},
        }
        return Plan(
            "classify", False, config.model, tokens, 0, 0, "stop", True, "",
            path=path, items=len(texts), answer=json_bytes(answer),
        )  # fmt: skip

    def prompt_tokens(self, body: dict[str, Any]) -> list[str] | None:
        return None


@pytest.fixture
def registered(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(endpoints.ENDPOINTS, "classify", Classify())
    monkeypatch.setitem(surfaces.HANDLERS, "classify", ClassifyHandler())


def test_the_spec_checks_it(registered: None) -> None:
    s = RunSpec(
        base_url="http://h:1", model="m", endpoint="classify",
        endpoint_options={"inputs_per_request": 3},
    )  # fmt: skip
    assert s.stream is False and s.workload_params().num_prompts == 300
    with pytest.raises(ValidationError, match=r"endpoint_options\.inputs_per_request"):
        RunSpec(base_url="http://h:1", model="m", endpoint="classify",
                endpoint_options={"inputs_per_request": 0})  # fmt: skip
    with pytest.raises(ValidationError, match="dataset: endpoint 'classify'"):
        RunSpec(base_url="http://h:1", model="m", endpoint="classify", dataset="sharegpt")
    with pytest.raises(ValidationError, match="multi_turn"):
        RunSpec(base_url="http://h:1", model="m", endpoint="classify", multi_turn=True,
                dataset="sharegpt")  # fmt: skip


def test_the_cli_and_the_forms_get_its_fields(registered: None) -> None:
    p = Parser(prog="tokentrace bench")
    add_bench_arguments(p)
    base = ["--base-url", "http://h:1", "--model", "m"]
    ns = p.parse_args([*base, "--endpoint", "classify", "--inputs-per-request", "4"])
    assert spec_from_args(ns).endpoint_options == {"inputs_per_request": 4}
    with pytest.raises(UsageError, match="--inputs-per-request: an option of --endpoint classify"):
        spec_from_args(p.parse_args([*base, "--inputs-per-request", "4"]))
    group = {g.endpoint: g for g in endpoint_fields.endpoint_groups()}["classify"]
    (field,) = group.fields
    assert (field.name, field.kind, field.minimum, field.maximum) == (
        "eopt-classify-inputs_per_request", "number", "1", "64",
    )  # fmt: skip


def test_a_run_against_the_simulator(registered: None) -> None:
    sim = start_simulator_thread(SimConfig(ttft_ms=1, seed=9))
    try:
        s = RunSpec(
            base_url=sim.base_url, model="sim", endpoint="classify", num_prompts=5,
            input_len=6, endpoint_options={"inputs_per_request": 2}, scrape_metrics=False,
        )  # fmt: skip
        res = run(run_load(s, run_tag="c"))
        truth = sim.ground_truth()["requests"]
    finally:
        sim.stop()
    assert [r.status for r in res.records] == [RequestStatus.OK] * 5
    for r in res.records:
        g = truth[f"c-{r.index}"]
        assert g["endpoint"] == "classify" and g["events"]["tokens"] == [2]
        assert r.input_tokens == g["input_tokens"] == 12
    m = compute_metrics(trace_from_records(res.records)).to_dict()
    assert m["items_total"] == 10 and m["e2el_ms"]["count"] == 5
    assert json.dumps(m["ttft_ms"]["reason"]).startswith('"not applicable')


def test_every_registered_surface_has_a_simulator_handler() -> None:
    for name, kind in endpoints.ENDPOINTS.items():
        assert name in surfaces.HANDLERS, name
        routes = surfaces.routes(surfaces.HANDLERS)
        for path in kind.paths:
            assert routes[path].endpoint == name
