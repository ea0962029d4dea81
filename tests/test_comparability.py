"""The comparability key, field by field."""

from __future__ import annotations

import math
from typing import Any

import pytest

from app.analysis.comparability import KEY_FIELDS, check, comparability_key, load_shape
from app.client.spec import RunSpec


def _spec(**over: Any) -> dict[str, Any]:
    base = {"base_url": "http://h:1", "model": "m", "input_len": 512, "output_len": 128}
    return RunSpec.model_validate(base | over).model_dump(mode="json")


def _key(spec: dict[str, Any] | None = None, **kw: Any) -> dict[str, Any]:
    measured = {
        "measured_input_p50": 512.0,
        "measured_output_p50": 128.0,
        "hardware": "H200",
        "dataset_source": "sha256:aa",
    }
    return comparability_key(spec or _spec(), **(measured | kw))


# field -> (spec changes or key keyword changes) that make only that field differ
CHANGES: dict[str, dict[str, Any]] = {
    "target": {"spec": {"base_url": "http://h:2"}},
    "model": {"spec": {"model": "other"}},
    "engine": {"spec": {"engine": "sglang"}},
    "engine_version": {"spec": {"engine_version": "0.11"}},
    "dtype": {"spec": {"dtype": "fp8"}},
    "input_len": {"spec": {"input_len": 1024}},
    "output_len": {"spec": {"output_len": 256}},
    "ignore_eos": {"spec": {"ignore_eos": False}},
    "measured_input_p50": {"kw": {"measured_input_p50": 700.0}},
    "measured_output_p50": {"kw": {"measured_output_p50": 90.0}},
    "dataset": {"spec": {"dataset": "jsonl", "dataset_path": "/d.jsonl"}},
    "dataset_options": {"spec": {"dataset_options": {"range_ratio": 0.5}}},
    "dataset_source": {"kw": {"dataset_source": "sha256:bb"}},
    "seed": {"spec": {"seed": 9}},
    "load_shape": {"spec": {"request_rate": 4.0}},
    "sampling": {"spec": {"temperature": 0.7}},
    "stream": {"spec": {"stream": False}},
    "endpoint": {"spec": {"endpoint": "completions"}},
    "connections": {"spec": {"connection_mode": "new"}},
    "hardware": {"kw": {"hardware": "A100"}},
}


def test_every_key_field_has_a_case() -> None:
    assert set(CHANGES) == set(KEY_FIELDS)


@pytest.mark.parametrize("field", list(KEY_FIELDS))
def test_each_field_alone_is_the_variable_under_test(field: str) -> None:
    change = CHANGES[field]
    other = _key(_spec(**change.get("spec", {})), **change.get("kw", {}))
    differing = {d.field for d in check([_key(), other]).differing}
    if field == "dataset":  # a jsonl dataset has no fixed spec input length
        assert differing == {"dataset", "input_len"}
        return
    assert differing == {field}
    result = check([_key(), other])
    assert result.comparable and result.variable == field
    assert KEY_FIELDS[field] in result.message()


@pytest.mark.parametrize("field", [f for f in KEY_FIELDS if f != "dataset"])
def test_field_plus_another_is_not_comparable(field: str) -> None:
    change = CHANGES[field]
    spec = _spec(**(change.get("spec", {}) | ({"seed": 77} if field != "seed" else {"model": "x"})))
    other = _key(spec, **change.get("kw", {}))
    result = check([_key(), other])
    assert not result.comparable and len(result.differing) == 2
    assert "not a one-variable comparison" in result.message()
    # naming the variable under test leaves the other field as the unexpected one
    named = check([_key(), other], variable=field)
    expected = "seed" if field != "seed" else "model"
    assert [d.field for d in named.unexpected] == [expected] and not named.comparable


def test_identical_keys_and_tolerances() -> None:
    assert check([_key(), _key()]).differing == []
    assert check([_key()]).comparable
    near = _key(measured_input_p50=520.0)  # within 5%
    assert check([_key(), near]).differing == []
    unknown = _key(measured_output_p50=None)  # unknown on one side: not a difference
    assert check([_key(), unknown]).differing == []
    three = check([_key(), _key(), _key(_spec(dtype="fp8"))])
    assert [d.values for d in three.differing] == [[None, None, "fp8"]]
    with pytest.raises(ValueError, match="unknown key field"):
        check([_key(), _key()], variable="colour")


def test_load_shape_text() -> None:
    assert load_shape(_spec()) == "all at once"
    assert load_shape({"request_rate": None}) == "all at once"
    assert load_shape({"request_rate": math.inf}) == "all at once"
    assert load_shape(_spec(request_rate=4, arrival="gamma", burstiness=0.5)) == (
        "4 req/s gamma burstiness 0.5"
    )
    assert load_shape(_spec(max_concurrency=8)) == "all at once, concurrency <= 8"


def test_keep_alive_and_new_connection_runs_are_not_silently_compared() -> None:
    """A keep-alive run against a new-connection one: the key names the difference, and a
    comparison of another variable says it is not a one-variable comparison."""
    ka, new = _key(_spec()), _key(_spec(connection_mode="new"))
    assert ka["connections"] == "keep-alive" and new["connections"] == "new"
    result = check([ka, new], variable="model")
    assert not result.comparable
    assert "connections (kept alive, or new per request)" in result.message()


def test_runs_saved_before_keep_alive_count_as_new_connection_runs() -> None:
    old = _spec()
    del old["connection_mode"]  # stored before the setting existed: one connection a request
    assert _key(old)["connections"] == "new"
    assert [d.field for d in check([_key(old), _key(_spec())]).differing] == ["connections"]
    imported = {"model": "m", "input_len": 512, "output_len": 128}  # an import: unknown
    assert _key(imported)["connections"] is None
    assert "connections" not in {d.field for d in check([_key(imported), _key()]).differing}


def test_different_workloads_of_one_dataset_type_are_not_silently_compared() -> None:
    """dataset_options and the file read are key fields: a range ratio, a shared prefix or
    another ShareGPT file makes another workload; options left at their defaults do not."""
    plain = _key(_spec())
    assert plain["dataset_options"] == ""
    explicit_defaults = _key(_spec(dataset_options={"range_ratio": 0.0, "prefix_len": 0}))
    assert check([plain, explicit_defaults]).differing == []
    prefixed = _key(_spec(dataset_options={"prefix_len": 64, "range_ratio": 0.25}))
    assert prefixed["dataset_options"] == "prefix_len=64, range_ratio=0.25"
    result = check([plain, prefixed], variable="model")
    assert not result.comparable and "dataset options" in result.message()
    sg = {"dataset": "sharegpt", "dataset_path": "/d/sg.json"}
    a = _key(_spec(**sg), dataset_source="sha256:aa")
    b = _key(_spec(**sg), dataset_source="sha256:bb")  # same path, another file
    assert [d.field for d in check([a, b]).differing] == ["dataset_source"]
    unknown = _key(_spec(**sg), dataset_source=None)  # a run saved before: nothing to contradict
    assert check([a, unknown]).differing == []


def test_load_shape_names_a_ramp_up_and_a_trace() -> None:
    from app.analysis.comparability import sampling_text

    ramp = {"ramp_up_strategy": "linear", "ramp_up_start_rps": 1.0, "ramp_up_end_rps": 20.0}
    assert load_shape(ramp) == "linear ramp 1->20 req/s poisson"
    assert load_shape(ramp | {"ramp_up_end_rps": 10.0}) != load_shape(ramp)
    trace = {"dataset": "mooncake", "max_concurrency": 8}
    assert load_shape(trace) == "the trace's schedule, concurrency <= 8"
    assert sampling_text({"top_k": 5, "temperature": 0.0, "min_p": None}) == (
        "temperature=0.0, top_k=5"
    )
    assert sampling_text({}) == ""


# ------------------------------------------------------------------ the target


@pytest.mark.parametrize(
    ("url", "expected"),
    [
        ("http://127.0.0.1:8000", "http://127.0.0.1:8000"),
        ("http://127.0.0.1:8000/", "http://127.0.0.1:8000"),
        ("http://127.0.0.1:8000/v1", "http://127.0.0.1:8000"),  # the client adds /v1 itself
        ("http://127.0.0.1:8000/v1/", "http://127.0.0.1:8000"),
        ("HTTP://Gpu-Box.Example:8000/V1", "http://gpu-box.example:8000/V1"),  # paths keep case
        ("http://h", "http://h:80"),
        ("https://h/", "https://h:443"),
        ("https://h:443/serve/v1?x=1#f", "https://h:443/serve"),
        ("http://user:secret@h:9000/v1", "http://h:9000"),  # never credentials
        ("localhost:8000", "http://localhost:8000"),  # AIPerf's form: http
        ("http://[::1]:8000/v1", "http://[::1]:8000"),
        ("http://h:99999/v1", "http://h:99999/v1"),  # not parsed: kept as written
        ("http://u:p@h:99999/", "http://h:99999/"),  # ... less any credentials
        ("", None),
        (None, None),
    ],
)
def test_target_url_is_normalised(url: Any, expected: str | None) -> None:
    from app.analysis.comparability import target_url

    assert target_url(url) == expected


def _stats(series: list[str] | None = None, models: list[Any] | None = None) -> dict[str, Any]:
    out: dict[str, Any] = {}
    if series is not None:
        out["server_metrics"] = {"status": "ok", "series": series}
    if models is not None:
        out["served_models"] = models
    return out


def test_the_server_identity_comes_from_what_the_run_recorded() -> None:
    from app.analysis.comparability import target_key, target_text

    vllm = _stats(["vllm:num_requests_running", "vllm:prompt_tokens_total"], ["b", "a", "a"])
    key = target_key("http://h:8000/v1", vllm)
    assert key == {"url": "http://h:8000", "engine": "vllm", "models": ["a", "b"],
                   "models_count": 2}  # fmt: skip
    assert target_text(key) == "http://h:8000 · vllm /metrics · serves a, b"
    llama = target_key("http://h:8000", _stats(["llamacpp:prompt_tokens_total"], []))
    assert target_text(llama) == "http://h:8000 · llama.cpp /metrics · serves no model"
    nothing = target_key("http://h:8000", {"server_metrics": {"status": "no /metrics"}})
    assert nothing == {"url": "http://h:8000", "engine": None, "models": None,
                       "models_count": None}  # fmt: skip
    assert target_key(None, None) is None and target_text(None) is None
    many = target_key("http://h:1", _stats(None, [f"m{i:03d}" for i in range(300)]))
    assert many is not None and len(many["models"]) == 256 and many["models_count"] == 300
    assert target_text(many) == "http://h:1 · serves m000, m001, m002, m003, m004 (+295 more)"
    hostile = _stats([1, None, "sglang:token_usage"], "not a list")  # type: ignore[list-item]
    assert target_key(None, hostile) == {"url": None, "engine": "sglang", "models": None,
                                         "models_count": None}  # fmt: skip


def test_runs_against_different_targets_say_so() -> None:
    here, there = _key(), _key(_spec(base_url="http://other:8000/v1"))
    result = check([here, there])
    assert [d.field for d in result.differing] == ["target"]
    assert result.comparable and result.variable == "target"
    assert result.message() == (
        "one variable under test: target (URL and server identity); "
        "target differs: http://h:1 vs http://other:8000"
    )
    assert "every key field matches" not in result.message()
    # another variable named: the target is the unexpected difference, said with its values
    seed = check([here, there], variable="seed")
    assert not seed.comparable and [d.field for d in seed.unexpected] == ["target"]
    assert seed.message() == (
        "not a one-variable comparison: the runs also differ in target (URL and server "
        "identity); target differs: http://h:1 vs http://other:8000; read the verdicts with care"
    )
    assert seed.to_dict()["differing"] == [
        {"field": "target", "label": "target (URL and server identity)",
         "values": ["http://h:1", "http://other:8000"], "expected": False}
    ]  # fmt: skip
    # the same server written two ways is one target
    assert check([here, _key(_spec(base_url="http://H:1/v1/"))]).differing == []


def test_the_same_url_serving_another_engine_or_models_is_another_target() -> None:
    spec = _spec(base_url="http://h:8000")
    a = _key(spec, load_stats=_stats(["vllm:num_requests_running"], ["m"]))
    sglang = _key(spec, load_stats=_stats(["sglang:num_queue_reqs"], ["m"]))
    more = _key(spec, load_stats=_stats(["vllm:num_requests_running"], ["m", "lora"]))
    unknown = _key(spec, load_stats={})  # no scrape, no model list: nothing to contradict
    assert check([a, unknown]).differing == []
    diff = check([a, sglang]).differing
    assert [d.field for d in diff] == ["target"]
    assert diff[0].values == [
        "http://h:8000 · vllm /metrics · serves m",
        "http://h:8000 · sglang /metrics · serves m",
    ]
    assert [d.field for d in check([a, more]).differing] == ["target"]


@pytest.mark.parametrize("field", ["model", "engine", "engine_version", "dtype", "hardware"])
def test_another_server_under_test_lets_the_target_differ_and_says_so(field: str) -> None:
    change = CHANGES[field]
    moved = _spec(**(change.get("spec", {}) | {"base_url": "http://other:9"}))
    other = _key(moved, **change.get("kw", {}))
    result = check([_key(), other])  # inferred: the server field, the target beside it
    assert result.comparable and result.variable == field
    assert result.message() == (
        f"one variable under test: {KEY_FIELDS[field]}; "
        "with it the target differs: http://h:1 vs http://other:9"
    )
    assert {d["field"]: d["expected"] for d in result.to_dict()["differing"]} == {
        "target": True,
        field: True,
    }
    # a workload field under test does not excuse another server
    seed = check([_key(), _key(_spec(seed=9, base_url="http://other:9"))])
    assert not seed.comparable and seed.variable is None
    named = check([_key(), _key(_spec(seed=9, base_url="http://other:9"))], variable="seed")
    assert [d.field for d in named.unexpected] == ["target"]


def test_an_import_without_a_spec_uses_its_target_url() -> None:
    imported = comparability_key({"model": "m"}, url="http://user:pw@h:1/v1")
    assert imported["target"]["url"] == "http://h:1"
    assert comparability_key({"model": "m"})["target"] is None  # unknown: contradicts nothing
    assert check([comparability_key({"model": "m"}), imported]).differing == []
