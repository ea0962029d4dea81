"""A run's model mix and its targets (``app.client.routing``), without a target: the spec's
checks (each bad input refused naming its field), the router's draws (seeded, shares close
to the weights, a session on one model and one target), a key bound to one target refused
for a run that also names another, and the comparability key's mix and targets."""

from __future__ import annotations

from collections import Counter
from typing import Any

import pytest
from pydantic import ValidationError

from app.analysis.comparability import check, comparability_key, model_text
from app.client.lanes import router_of
from app.client.routing import MAX_MODELS, MAX_TARGETS, Router, parse_mix_text
from app.client.spec import RunSpec
from app.client.target_keys import resolve_api_key

A, B = "http://127.0.0.1:8001", "http://127.0.0.1:8002"


def spec(**kw: Any) -> RunSpec:
    return RunSpec.model_validate({"base_url": A, "model": "m"} | kw)


def test_one_model_one_target_is_stored_as_before() -> None:
    s = spec()
    dumped = s.model_dump(mode="json")
    assert s.model == "m" and s.base_url == A and s.targets() == [A]
    assert dumped["model_mix"] == [] and dumped["base_urls"] == []
    # a model name with a colon is a name, not a mix of one
    assert spec(model="llama3:8b").model == "llama3:8b"
    assert spec(model="llama3:8b").model_mix == []
    # a mix of one model is that model; a list of one URL is base_url
    one = spec(model_mix=[{"model": "x", "weight": 2}], base_urls=[B])
    assert (one.model, one.model_mix, one.base_url, one.base_urls) == ("x", [], B, [])


def test_a_mix_and_several_targets_as_text_or_fields() -> None:
    text = spec(model="llama-8b:0.7,llama-8b-lora-sql:0.3", base_url=f"{A}, {B}/")
    fields = RunSpec.model_validate(
        {
            "model_mix": [
                {"model": "llama-8b", "weight": 0.7},
                {"model": "llama-8b-lora-sql", "weight": 0.3},
            ],
            "base_urls": [A, B],
        }
    )
    for s in (text, fields):
        assert s.model == "llama-8b"
        assert [(m.model, m.weight) for m in s.model_mix] == [
            ("llama-8b", 0.7),
            ("llama-8b-lora-sql", 0.3),
        ]
        assert s.base_url == A and s.targets() == [A, B]
    # a name holding colons: the weight is after the last one
    assert [(m.model, m.weight) for m in parse_mix_text("model", "q:8b:1,q:70b:3")] == [
        ("q:8b", 1.0),
        ("q:70b", 3.0),
    ]


BAD: list[tuple[dict[str, Any], str]] = [
    ({"model": "a:0,b:1"}, "model_mix"),
    ({"model": "a:-1,b:1"}, "model_mix"),
    ({"model": "a:x,b:1"}, "model"),
    ({"model": "a,b:1"}, "model"),
    ({"model": ":1,b:1"}, "model"),
    ({"model": "a:1,a:2"}, "model_mix"),
    ({"model": "a:inf,b:1"}, "model"),
    ({"model": "a:nan,b:1"}, "model"),
    ({"model_mix": [{"model": "", "weight": 1}, {"model": "b"}]}, "model_mix"),
    (
        {"model_mix": [{"model": "a", "weight": 1e308}, {"model": "b", "weight": 1e308}]},
        "model_mix",
    ),
    ({"model_mix": [{"model": f"m{i}"} for i in range(MAX_MODELS + 1)]}, "model_mix"),
    ({"model": "z", "model_mix": [{"model": "a"}, {"model": "b"}]}, "model"),
    ({"base_urls": [A, A]}, "base_urls"),
    ({"base_urls": [A, A + "/"]}, "base_urls"),
    ({"base_urls": [A, "ftp://x"]}, "base_urls"),
    ({"base_urls": [f"http://127.0.0.1:{9000 + i}" for i in range(MAX_TARGETS + 1)]}, "base_urls"),
    ({"base_url": B, "base_urls": [A, "http://127.0.0.1:8003"]}, "base_url"),
    ({"routing": "random"}, "routing"),
    ({"session_header": "Bad Header"}, "session_header"),
    ({"session_header": "Host"}, "session_header"),
    ({"base_urls": [A, B], "metrics_url": A + "/metrics"}, "metrics_url"),
]


@pytest.mark.parametrize(("fields", "field"), BAD, ids=[f"{f}-{i}" for i, (_, f) in enumerate(BAD)])
def test_bad_input_names_its_field(fields: dict[str, Any], field: str) -> None:
    with pytest.raises(ValidationError) as e:
        spec(**fields)
    err = e.value.errors()[0]
    loc = str(err["loc"][0]) if err["loc"] else ""
    msg = str(err["msg"]).removeprefix("Value error, ")
    assert loc == field or msg.startswith(field + ":") or msg.startswith(field + " "), (loc, msg)


def test_the_draw_is_seeded_and_follows_the_weights() -> None:
    s = spec(model="a:0.7,b:0.2,c:0.1", base_url=f"{A},{B}")
    r1, r2 = router_of(s, "x"), router_of(s, "y")  # the run's tag changes no draw
    draws = [r1.request(i).model for i in range(20_000)]
    assert draws == [r2.request(i).model for i in range(20_000)]
    other = router_of(s.model_copy(update={"seed": 1}), "x")
    assert draws != [other.request(i).model for i in range(20_000)]
    share = Counter(draws)
    for name, w in (("a", 0.7), ("b", 0.2), ("c", 0.1)):
        # 20 000 draws: the share's standard error is at most 0.0035; 5 of them
        assert abs(share[name] / 20_000 - w) < 0.018, share
    # round-robin: by request index (a session: by its number)
    assert [r1.request(i).target for i in range(4)] == [A, B, A, B]
    assert [r1.session(i).lane for i in range(4)] == [0, 1, 0, 1]
    assert r1.request(3).session is None  # no session header without session routing


def test_session_routing_is_a_stable_hash_with_a_named_session() -> None:
    s = spec(model="a:1,b:1", base_url=f"{A},{B}", routing="session", session_header="X-Sess")
    r = router_of(s, "run1")
    routes = [r.session(k) for k in range(400)]
    assert routes == [router_of(s, "run1").session(k) for k in range(400)]
    assert {x.session for x in routes} == {f"run1-s{k}" for k in range(400)}
    lanes = Counter(x.lane for x in routes)
    assert 120 < lanes[0] < 280 and lanes[0] + lanes[1] == 400, lanes  # both targets used
    assert r.request(5).session == "run1-r5"  # a single request is its own session
    # one target, one model: nothing routed, nothing named in the records
    plain = Router(["m"], [1.0], [A])
    assert plain.request(3) == plain.session(3)
    assert (plain.request(3).model, plain.request(3).target) == (None, None)


def test_a_key_bound_to_one_target_is_refused_for_another() -> None:
    var = "TOKENTRACE_TARGET_KEY_MIX"
    env = {var: "sk-mix", var + "_TARGETS": "127.0.0.1:8001"}
    one = spec(api_key_env=var)
    assert resolve_api_key(one, env).api_key == "sk-mix"
    both = spec(api_key_env=var, base_urls=[A, B])
    with pytest.raises(ValueError, match=r"may not be sent to http://127.0.0.1:8002"):
        resolve_api_key(both, env)
    env[var + "_TARGETS"] = "127.0.0.1:8001,127.0.0.1:8002"
    assert resolve_api_key(both, env).api_key == "sk-mix"


def test_the_mix_and_the_targets_are_part_of_the_key() -> None:
    def key(**kw: Any) -> dict[str, Any]:
        return comparability_key(spec(**kw).model_dump(mode="json"))

    same = check([key(model="a:7,b:3"), key(model="a:0.7,b:0.3")])
    assert not same.differing
    assert model_text(spec(model="a:7,b:3").model_dump()) == "a:0.7,b:0.3"
    mixed = check([key(model="a:0.7,b:0.3"), key(model="a:0.5,b:0.5")])
    assert [d.field for d in mixed.differing] == ["model"]
    plain = check([key(model="a"), key(model="a:0.7,b:0.3")])
    assert [d.field for d in plain.differing] == ["model"]
    targets = check([key(base_urls=[A, B]), key(base_urls=[A, B], routing="session")])
    assert [d.field for d in targets.differing] == ["target"]
    one_or_two = check([key(), key(base_urls=[A, B])])
    assert [d.field for d in one_or_two.differing] == ["target"]


def test_the_launch_and_sweep_forms_take_a_mix_and_several_urls() -> None:
    from app.web import launch_form, sweeps_form

    form = launch_form.defaults() | {
        "base_url": f"{A}, {B}",
        "model": "base:0.7,lora-sql:0.3",
        "routing": "session",
        "session_header": "X-Affinity",
    }
    created, errors = launch_form.parse(form)
    assert created is not None, errors
    s = created.to_spec()
    assert s.targets() == [A, B] and s.routing == "session" and s.session_header == "X-Affinity"
    assert [(m.model, m.weight) for m in s.model_mix] == [("base", 0.7), ("lora-sql", 0.3)]
    # launch again: the same text in the same fields
    again = launch_form.values_from_spec(s.model_dump(mode="json"), "x")
    assert again["base_url"] == f"{A}, {B}" and again["model"] == "base:0.7,lora-sql:0.3"
    assert again["routing"] == "session"
    # bad input: the message beside the field the user wrote it in
    for field, value, shown in (
        ("model", "base:0,lora:1", "model"),
        ("model", "base:x,lora:1", "model"),
        ("base_url", f"{A},{A}", "base_url"),
        ("routing", "nearest", "routing"),
    ):
        bad, errs = launch_form.parse(form | {field: value})
        assert bad is None and shown in errs, (field, value, errs)
    sweep = sweeps_form.FIELDS
    assert {"routing", "session_header"} <= {f.name for f in sweep}
