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
