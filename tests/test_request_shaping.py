"""Request shaping: sampling parameters and headers on the wire, secret headers refused,
vLLM's ramp-up schedule against the formula by hand, and --no-stream against the simulator
(TTFT = E2E, no ITL/TPOT, the report says so)."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import numpy as np
import pytest
from pydantic import ValidationError

from app.analysis.metrics import compute_metrics
from app.api.app import create_app  # noqa: F401  (the web package's import order)
from app.cli.args import Parser, UsageError, add_bench_arguments, spec_from_args
from app.client.execute import NO_STREAM_NOTE, execute
from app.client.runner import run_load
from app.client.shapes import ramp_rates, schedule_for
from app.client.spec import RunSpec
from app.domain import trace_from_records
from app.web import launch_form
from tests.endpoint_support import body_of
from tests.test_client import Server, stream

S = 1_000_000_000


def spec(**kw: Any) -> RunSpec:
    base: dict[str, Any] = {"base_url": "http://127.0.0.1:9", "model": "m", "num_prompts": 5}
    base.update(kw)
    return RunSpec(**base)


def parse(args: list[str]) -> RunSpec:
    p = Parser(prog="bench")
    add_bench_arguments(p)
    return spec_from_args(p.parse_args(["--base-url", "http://h:1", "--model", "m", *args]))


# --------------------------------------------------------------------------- ramp-up


def test_linear_ramp_schedule_by_hand() -> None:
    s = spec(arrival="constant", ramp_up_strategy="linear", ramp_up_start_rps=1, ramp_up_end_rps=5)
    # rates 1, 2, 3, 4, 5 (i / 4 of the way); the gap before request i is 1 / rate_i
    want = [0, 1 / 2, 1 / 2 + 1 / 3, 1 / 2 + 1 / 3 + 1 / 4, 1 / 2 + 1 / 3 + 1 / 4 + 1 / 5]
    assert schedule_for(s).times_ns.tolist() == [round(t * S) for t in want]


def test_exponential_ramp_schedule_by_hand() -> None:
    s = spec(
        arrival="constant",
        ramp_up_strategy="exponential",
        ramp_up_start_rps=1,
        ramp_up_end_rps=16,
    )
    # rates 1 * 16^(i/4) = 1, 2, 4, 8, 16
    assert ramp_rates(5, "exponential", 1, 16).tolist() == pytest.approx([1, 2, 4, 8, 16])
    want = [0, 0.5, 0.75, 0.875, 0.9375]
    assert schedule_for(s).times_ns.tolist() == [round(t * S) for t in want]


def test_poisson_ramp_gaps_have_the_ramped_mean() -> None:
    n = 20_001
    s = spec(num_prompts=n, ramp_up_strategy="linear", ramp_up_start_rps=2, ramp_up_end_rps=50)
    gaps = np.diff(schedule_for(s).times_ns) / S
    rates = 2 + 48 * np.arange(1, n) / (n - 1)
    scaled = gaps * rates  # exponential(1) each if each gap is drawn at its own rate
    assert abs(scaled.mean() - 1) < 0.03 and abs(scaled.std() - 1) < 0.05
    # the first half (rates 2..26) is slower than the second (26..50)
    half = (n - 1) // 2
    assert gaps[:half].sum() > 2 * gaps[half:].sum()


def test_ramp_up_needs_all_three_and_no_request_rate() -> None:
    with pytest.raises(ValidationError, match="a ramp-up needs ramp_up_strategy"):
        spec(ramp_up_strategy="linear", ramp_up_start_rps=1)
    with pytest.raises(ValidationError, match="request_rate: give request_rate or a ramp-up"):
        spec(request_rate=5, ramp_up_strategy="linear", ramp_up_start_rps=1, ramp_up_end_rps=2)
    with pytest.raises(ValidationError):
        spec(ramp_up_strategy="linear", ramp_up_start_rps=0, ramp_up_end_rps=2)
    s = parse(["--ramp-up-strategy", "exponential", "--ramp-up-start-rps", "1",
               "--ramp-up-end-rps", "20"])  # fmt: skip
    assert (s.ramp_up_strategy, s.ramp_up_start_rps, s.ramp_up_end_rps) == ("exponential", 1, 20)
    with pytest.raises(UsageError, match=r"^--request-rate: give"):
        parse(["--request-rate", "3", "--ramp-up-strategy", "linear", "--ramp-up-start-rps",
               "1", "--ramp-up-end-rps", "2"])  # fmt: skip


# --------------------------------------------------------------------------- body, headers


def test_sampling_parameters_go_into_the_body() -> None:
    s = parse(["--temperature", "0.7", "--top-p", "0.9", "--top-k", "40", "--min-p", "0.05",
               "--repetition-penalty", "1.1", "--frequency-penalty", "0.5",
               "--presence-penalty", "-0.5", "--extra-body", '{"seed": 3}'])  # fmt: skip
    body = json.loads(body_of(prompt="hi", output_len=4, extra_body=s.sampling_body()))
    assert {k: body[k] for k in ("temperature", "top_p", "top_k", "min_p")} == {
        "temperature": 0.7, "top_p": 0.9, "top_k": 40, "min_p": 0.05,
    }  # fmt: skip
    assert body["repetition_penalty"] == 1.1 and body["frequency_penalty"] == 0.5
    assert body["presence_penalty"] == -0.5 and body["seed"] == 3
    plain = body_of(prompt="hi", output_len=4, extra_body=spec().sampling_body())
    assert "temperature" not in json.loads(plain)
    with pytest.raises(ValidationError, match="temperature: given both as a field and in"):
        spec(temperature=0.1, extra_body={"temperature": 0.2})
    with pytest.raises(ValidationError):
        spec(top_p=0)


@pytest.mark.parametrize(
    "name", ["Authorization", "X-Api-Key", "api-key", "X-Auth-Token", "Cookie", "my_secret"]
)
def test_secret_looking_headers_are_refused(name: str) -> None:
    with pytest.raises(ValidationError, match=f"headers: {name} looks like a secret"):
        spec(headers={name: "s3cr3t"})
    with pytest.raises(UsageError, match="looks like a secret") as e:
        parse(["--header", f"{name}: s3cr3t"])
    assert "s3cr3t" not in str(e.value)


def test_bad_headers_are_refused() -> None:
    for headers, msg in (
        ({"Host": "x"}, "headers: Host is set by the client itself"),
        ({"X-A": "1\r\nX-B: 2"}, "value must be one line"),
        ({"X-A": "caf\u00e9"}, "value must be one line of printable ASCII"),
        ({"Bad Name": "1"}, "is not a valid header name"),
        ({"X-A": "1", "x-a": "2"}, "is given twice"),
    ):
        with pytest.raises(ValidationError, match=msg):
            spec(headers=headers)
    with pytest.raises(UsageError, match="--header: expected K:V"):
        parse(["--header", "novalue"])


def test_headers_and_sampling_sent_on_every_request() -> None:
    async def main() -> tuple[Any, list[Any]]:
        async with Server(stream(n=3)) as srv:
            s = spec(
                base_url=srv.url,
                num_prompts=3,
                input_len=4,
                output_len=3,
                headers={"X-Tenant": "lab-1", "X-Trace": "a:b"},
                temperature=0.0,
                scrape_metrics=False,
            )
            res = await run_load(s, run_tag="h")
            return res, list(srv.requests)

    res, reqs = asyncio.run(main())
    assert res.counts["ok"] == 3 and len(reqs) == 3
    for r in reqs:
        assert r.headers["x-tenant"] == "lab-1" and r.headers["x-trace"] == "a:b"
        assert r.body["temperature"] == 0.0 and r.body["stream"] is True
    stored = parse(["--header", "X-Tenant: lab-1"]).model_dump()
    assert stored["headers"] == {"X-Tenant": "lab-1"}


def test_launch_form_reads_headers_and_sampling() -> None:
    form = launch_form.defaults()
    form.update(
        {
            "headers": "X-Tenant: lab-1\n\nX-Other:  two ",
            "temperature": "0.5",
            "ramp_up_strategy": "linear",
            "ramp_up_start_rps": "1",
            "ramp_up_end_rps": "4",
            "stream": "",
        }
    )
    created, errors = launch_form.parse(form)
    assert errors == {} and created is not None
    s = created.to_spec()
    assert s.headers == {"X-Tenant": "lab-1", "X-Other": "two"}
    assert s.temperature == 0.5 and s.stream is False and s.ramp_up_end_rps == 4
    again = launch_form.values_from_spec(s.model_dump(), "r")
    assert again["headers"] == "X-Tenant: lab-1\nX-Other: two" and again["stream"] == ""
    _, errors = launch_form.parse(form | {"headers": "Authorization: Bearer x"})
    assert "looks like a secret" in errors["headers"]
    _, errors = launch_form.parse(form | {"headers": "no colon here"})
    assert errors["headers"] == "line 1 is not 'Name: value'"


# --------------------------------------------------------------------------- no stream


def test_no_stream_against_the_simulator() -> None:
    sim_mod = pytest.importorskip("app.targets.simulator")
    from app.targets.sim_config import SimConfig

    handle = sim_mod.start_simulator_thread(SimConfig(ttft_ms=30.0, itl_ms=5.0, seed=1))
    try:
        s = spec(
            base_url=handle.base_url,
            num_prompts=3,
            input_len=8,
            output_len=10,
            stream=False,
            scrape_metrics=False,
        )
        assert parse(["--no-stream"]).stream is False
        done = asyncio.run(execute(s, lambda: run_load(s, run_tag="ns")))
        gt = handle.ground_truth()["requests"]
    finally:
        handle.stop()
    assert done.result is not None and done.meta is not None
    res = done.result
    assert res.counts["ok"] == 3
    for r in res.records:
        g = gt[f"ns-{r.index}"]
        assert g["stream"] is False
        assert r.output_tokens == 10 and r.token_source == "usage"
        assert len(r.event_t_ns) == 1  # one JSON body, one event
        assert r.event_t_ns[0] == r.end_ns  # its first token is its last
        # the simulator answered after ttft + 9 gaps of 5 ms: about 75 ms in all
        assert r.end_ns is not None and r.sent_ns is not None
        assert (r.end_ns - r.sent_ns) / 1e6 >= 30 + 9 * 5 - 1
    m = compute_metrics(trace_from_records(res.records))
    assert m.dist("ttft_ms").mean == pytest.approx(m.dist("e2el_ms").mean)
    assert m.dist("itl_ms").count == 0 and m.dist("tpot_ms").count == 0
    assert NO_STREAM_NOTE in done.meta.validity
    assert done.meta.load_stats["stream"] is False
