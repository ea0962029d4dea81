"""Tests of ``tokentrace sim`` over real loopback sockets (httpx, raw sockets and h11 clients)."""

from __future__ import annotations

import asyncio
import json
import re
import socket
import statistics
from collections.abc import Iterator
from typing import Any

import h11
import httpx
import numpy as np
import pytest

from app.client.tokenizer import WORDS, BuiltinTokenizer
from app.targets.sim_config import Fault, SimConfig
from app.targets.simulator import (
    SimulatorThread,
    start_simulator_process,
    start_simulator_thread,
)
from app.targets.simulator.cli import build_arg_parser, config_from_args, main
from app.targets.simulator.plan import decide_fault
from app.targets.simulator.records import EVENT_KINDS

TOK = BuiltinTokenizer()
FAST = {"ttft_ms": 5.0, "itl_ms": 1.0}


@pytest.fixture
def sim_factory() -> Iterator[Any]:
    started: list[SimulatorThread] = []

    def make(**kw: Any) -> SimulatorThread:
        s = start_simulator_thread(SimConfig(**kw))
        started.append(s)
        return s

    yield make
    for s in started:
        s.stop()


def chat_body(max_tokens: int = 8, stream: bool = True, **extra: Any) -> dict[str, Any]:
    body: dict[str, Any] = {
        "model": "m",
        "messages": [{"role": "user", "content": "the measure of a stream"}],
        "max_tokens": max_tokens,
        "stream": stream,
        **extra,
    }
    return body


def sse_payloads(text: str) -> list[str]:
    return [line[len("data: ") :] for line in text.split("\n") if line.startswith("data: ")]


def stream(sim: SimulatorThread, path: str, body: dict[str, Any], **headers: str) -> list[str]:
    with (
        httpx.Client(base_url=sim.base_url, timeout=10) as c,
        c.stream("POST", path, json=body, headers=headers) as r,
    ):
        assert r.status_code == 200
        assert r.headers["content-type"] == "text/event-stream"
        assert r.headers["transfer-encoding"] == "chunked"
        assert "connection" not in r.headers  # keep-alive (HTTP/1.1 default)
        return sse_payloads(r.read().decode())


def content_text(payloads: list[str], field: str = "content") -> str:
    out = []
    for p in payloads:
        if p == "[DONE]":
            continue
        for ch in json.loads(p)["choices"]:
            v = ch.get("delta", {}).get(field) if "delta" in ch else ch.get("text")
            if v:
                out.append(v)
    return "".join(out)


def raw_request(port: int, path: str, body: dict[str, Any], rid: str = "") -> bytes:
    data = json.dumps(body).encode()
    extra = f"X-Request-Id: {rid}\r\n" if rid else ""
    return (
        f"POST {path} HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\nContent-Type: application/json\r\n"
        f"{extra}Content-Length: {len(data)}\r\n\r\n"
    ).encode() + data


def read_until(sock: socket.socket, timeout: float) -> tuple[bytes, str]:
    """Read until EOF / reset / timeout; returns (data, how it ended)."""
    sock.settimeout(timeout)
    buf = b""
    while True:
        try:
            chunk = sock.recv(65536)
        except TimeoutError:
            return buf, "timeout"
        except ConnectionResetError:
            return buf, "reset"
        if not chunk:
            return buf, "eof"
        buf += chunk


def gt_request(sim: SimulatorThread, rid: str) -> dict[str, Any]:
    req: dict[str, Any] = sim.ground_truth()["requests"][rid]
    return req


def token_events(req: dict[str, Any]) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    ev = req["events"]
    mask = np.array([k in ("content", "reasoning") for k in ev["kind"]], bool)
    t = np.array(ev["t_ns"], np.int64)[mask]
    due = np.array(ev["due_ns"], np.int64)[mask]
    tokens = np.array(ev["tokens"], np.int64)[mask]
    return t, due, tokens


# --------------------------------------------------------------------------- stream shape


def test_chat_stream_shape_usage_and_exact_token_count(sim_factory: Any) -> None:
    sim = sim_factory(**FAST)
    body = chat_body(max_tokens=17, stream_options={"include_usage": True})
    p = stream(sim, "/v1/chat/completions", body, **{"X-Request-Id": "a1"})
    first = json.loads(p[0])
    assert first["object"] == "chat.completion.chunk"
    assert first["choices"][0]["delta"] == {"role": "assistant", "content": None}
    assert p[-1] == "[DONE]"
    usage_chunk = json.loads(p[-2])
    assert usage_chunk["choices"] == []
    assert usage_chunk["usage"] == {
        "prompt_tokens": TOK.count("the measure of a stream"),
        "completion_tokens": 17,
        "total_tokens": 17 + 5,
    }
    finish = json.loads(p[-3])
    assert finish["choices"][0]["delta"] == {} and finish["choices"][0]["finish_reason"] == "length"
    text = content_text(p)
    assert TOK.count(text) == 17
    assert all(w in WORDS for w in text.split())
    for chunk in p[1:-3]:
        c = json.loads(chunk)
        assert set(c) == {"id", "object", "created", "model", "choices"}
        assert c["choices"][0]["finish_reason"] is None
    req = gt_request(sim, "a1")
    assert req["events"]["kind"][0] == "role"
    assert req["events"]["kind"][-3:] == ["finish", "usage", "done"]
    assert sum(req["events"]["tokens"]) == 17
    assert set(req["events"]["kind"]) <= set(EVENT_KINDS)


def test_completions_stream_and_no_usage_without_option(sim_factory: Any) -> None:
    sim = sim_factory(**FAST)
    body = {"model": "m", "prompt": "tell me", "max_tokens": 6, "stream": True}
    p = stream(sim, "/v1/completions", body)
    assert p[-1] == "[DONE]"
    objs = [json.loads(x) for x in p[:-1]]
    assert all(o["object"] == "text_completion" for o in objs)
    assert all(o["choices"] for o in objs)  # no usage chunk
    assert objs[-1]["choices"][0]["finish_reason"] == "length"
    assert "role" not in json.dumps(objs)  # completions have no role chunk
    assert TOK.count(content_text(p)) == 6


def test_role_chunk_can_be_turned_off(sim_factory: Any) -> None:
    sim = sim_factory(role_chunk=False, **FAST)
    p = stream(sim, "/v1/chat/completions", chat_body(max_tokens=3))
    assert json.loads(p[0])["choices"][0]["delta"].get("content")
    assert TOK.count(content_text(p)) == 3


def test_tokens_per_event_packs_tokens(sim_factory: Any) -> None:
    sim = sim_factory(tokens_per_event=3, **FAST)
    p = stream(sim, "/v1/chat/completions", chat_body(max_tokens=10), **{"X-Request-Id": "p"})
    deltas = [json.loads(x)["choices"][0]["delta"].get("content") for x in p[1:-2]]
    assert [TOK.count(d) for d in deltas] == [3, 3, 3, 1]
    _, _, tokens = token_events(gt_request(sim, "p"))
    assert tokens.tolist() == [3, 3, 3, 1]


def test_non_streaming_responses(sim_factory: Any) -> None:
    sim = sim_factory(**FAST)
    with httpx.Client(base_url=sim.base_url, timeout=10) as c:
        r = c.post("/v1/chat/completions", json=chat_body(max_tokens=9, stream=False))
        assert r.status_code == 200
        j = r.json()
        assert j["object"] == "chat.completion"
        assert TOK.count(j["choices"][0]["message"]["content"]) == 9
        assert j["usage"]["completion_tokens"] == 9
        r = c.post("/v1/completions", json={"prompt": [1, 2, 3], "max_tokens": 4})
        assert r.json()["usage"] == {"prompt_tokens": 3, "completion_tokens": 4, "total_tokens": 7}
        assert TOK.count(r.json()["choices"][0]["text"]) == 4


def test_default_output_len_eos_and_min_tokens(sim_factory: Any) -> None:
    sim = sim_factory(output_len=7, eos_len=4, **FAST)
    with httpx.Client(base_url=sim.base_url, timeout=10) as c:

        def completion(**kw: Any) -> dict[str, Any]:
            r = c.post("/v1/completions", json={"prompt": "x", **kw})
            out: dict[str, Any] = r.json()
            return out

        no_max = completion(ignore_eos=True)
        assert no_max["usage"]["completion_tokens"] == 7
        eos = completion(max_tokens=10)
        assert eos["usage"]["completion_tokens"] == 4
        assert eos["choices"][0]["finish_reason"] == "stop"
        assert completion(max_tokens=10, min_tokens=6)["usage"]["completion_tokens"] == 6
        ignored = completion(max_tokens=10, ignore_eos=True)
        assert ignored["usage"]["completion_tokens"] == 10
        assert ignored["choices"][0]["finish_reason"] == "length"


def test_reasoning_tokens_come_first(sim_factory: Any) -> None:
    sim = sim_factory(reasoning_tokens=3, **FAST)
    p = stream(sim, "/v1/chat/completions", chat_body(max_tokens=8), **{"X-Request-Id": "r"})
    assert TOK.count(content_text(p, "reasoning_content")) == 3
    assert TOK.count(content_text(p)) == 5
    kinds = [k for k in gt_request(sim, "r")["events"]["kind"] if k in ("reasoning", "content")]
    assert kinds == ["reasoning"] * 3 + ["content"] * 5


def test_bad_requests_and_other_routes(sim_factory: Any) -> None:
    sim = sim_factory(**FAST)
    with httpx.Client(base_url=sim.base_url, timeout=10) as c:
        assert c.post("/v1/chat/completions", content=b"{nope").status_code == 400
        assert c.post("/v1/chat/completions", json={"messages": []}).status_code == 400
        r = c.post("/v1/completions", json={"prompt": "x", "max_tokens": 0})
        assert r.status_code == 400 and "max_tokens" in r.json()["error"]["message"]
        assert c.get("/health").json() == {"status": "ok"}
        assert c.get("/v1/models").json()["data"][0]["id"] == "tokentrace-sim"
        assert c.get("/nowhere").status_code == 404
        assert c.get("/v1/completions").status_code == 405


# --------------------------------------------------------------------------- determinism


def test_same_seed_same_output_different_seed_different_output(sim_factory: Any) -> None:
    a, b, c = sim_factory(seed=1, **FAST), sim_factory(seed=1, **FAST), sim_factory(seed=2, **FAST)
    body = chat_body(max_tokens=20)
    ta = content_text(stream(a, "/v1/chat/completions", body))
    assert ta == content_text(stream(b, "/v1/chat/completions", body))
    assert ta != content_text(stream(c, "/v1/chat/completions", body))
    other = chat_body(max_tokens=20, messages=[{"role": "user", "content": "other"}])
    assert ta != content_text(stream(a, "/v1/chat/completions", other))
    assert ta == content_text(stream(a, "/v1/chat/completions", body))  # content, not counter


# --------------------------------------------------------------------------- timing


def test_ttft_and_itl_follow_the_model(sim_factory: Any) -> None:
    sim = sim_factory(ttft_ms=20.0, per_input_token_ms=0.5, itl_ms=4.0)
    body = chat_body(max_tokens=25)
    stream(sim, "/v1/chat/completions", body, **{"X-Request-Id": "t"})
    req = gt_request(sim, "t")
    t, due, _ = token_events(req)
    n_in = TOK.count("the measure of a stream")
    # the schedule is exact ...
    assert due[0] - req["received_ns"] == round((20.0 + 0.5 * n_in) * 1e6)
    assert set(np.diff(due).tolist()) == {4_000_000}
    # ... and the writes follow it (loose bounds: a shared CI machine)
    lateness_ms = (t - due) / 1e6
    assert lateness_ms.min() >= 0
    assert np.median(lateness_ms) < 2.0
    gaps_ms = np.diff(t) / 1e6
    assert abs(float(np.median(gaps_ms)) - 4.0) < 1.0
    assert req["headers_ns"] - req["received_ns"] < 20e6  # role chunk sent on receipt


def test_jitter_is_seeded_per_request(sim_factory: Any) -> None:
    cfg = {"ttft_ms": 5.0, "itl_ms": 3.0, "itl_jitter_ms": 2.0, "seed": 5}
    gaps = []
    for sim in (sim_factory(**cfg), sim_factory(**cfg)):
        stream(sim, "/v1/chat/completions", chat_body(max_tokens=30), **{"X-Request-Id": "j"})
        _, due, _ = token_events(gt_request(sim, "j"))
        gaps.append(np.diff(due))
    assert gaps[0].tolist() == gaps[1].tolist()
    assert gaps[0].min() >= 1_000_000 and gaps[0].max() <= 5_000_000
    assert len(set(gaps[0].tolist())) > 10


def test_itl_grows_with_active_streams(sim_factory: Any) -> None:
    # a first token 300 ms away: the three streams below are all in the server (waiting or
    # decoding) through b0's decode however late a loaded machine sends the last of them
    sim = sim_factory(ttft_ms=300.0, itl_ms=2.0, itl_per_active_ms=1.0)
    stream(sim, "/v1/chat/completions", chat_body(max_tokens=5), **{"X-Request-Id": "solo"})
    _, due, _ = token_events(gt_request(sim, "solo"))
    assert set(np.diff(due).tolist()) == {3_000_000}  # 2 + 1 x 1 active

    async def three() -> None:
        await asyncio.gather(
            *(
                fetch(
                    sim.port,
                    "/v1/completions",
                    {"prompt": "x", "max_tokens": 12, "stream": True},
                    f"b{i}",
                )
                for i in range(3)
            )
        )

    asyncio.run(three())
    _, due, _ = token_events(gt_request(sim, "b0"))
    assert statistics.median(np.diff(due).tolist()) == 5_000_000  # 2 + 1 x 3 active


# --------------------------------------------------------------------------- faults


def test_error_fault_is_http_500_json(sim_factory: Any) -> None:
    sim = sim_factory(error_rate=1.0, **FAST)
    r = httpx.post(sim.base_url + "/v1/chat/completions", json=chat_body(), timeout=10)
    assert r.status_code == 500
    assert r.json()["error"]["type"] == "server_error"
    assert sim.ground_truth()["requests"]["sim-1"]["fault"] == "error"


def test_disconnect_fault_resets_after_k_tokens(sim_factory: Any) -> None:
    sim = sim_factory(disconnect_rate=1.0, fault_after_tokens=3, role_chunk=False, **FAST)
    with socket.create_connection(("127.0.0.1", sim.port)) as s:
        s.sendall(
            raw_request(
                sim.port, "/v1/completions", {"prompt": "x", "max_tokens": 10, "stream": True}, "d"
            )
        )
        data, how = read_until(s, 5.0)
    assert how == "reset"
    assert TOK.count(content_text(sse_payloads(data.decode(errors="replace")))) == 3
    req = gt_request(sim, "d")
    assert req["fault"] == "disconnect" and req["fault_after_tokens"] == 3


def test_stall_fault_keeps_connection_open(sim_factory: Any) -> None:
    sim = sim_factory(stall_rate=1.0, fault_after_tokens=2, **FAST)
    with socket.create_connection(("127.0.0.1", sim.port)) as s:
        s.sendall(raw_request(sim.port, "/v1/chat/completions", chat_body(max_tokens=10), "s"))
        data, how = read_until(s, 0.5)
    assert how == "timeout"
    payloads = sse_payloads(data.decode())
    assert TOK.count(content_text(payloads)) == 2
    assert "[DONE]" not in payloads
    assert gt_request(sim, "s")["fault_after_tokens"] == 2


def test_hang_fault_never_answers(sim_factory: Any) -> None:
    sim = sim_factory(hang_rate=1.0, **FAST)
    with socket.create_connection(("127.0.0.1", sim.port)) as s:
        s.sendall(raw_request(sim.port, "/v1/chat/completions", chat_body(), "h"))
        data, how = read_until(s, 0.3)
    assert (data, how) == (b"", "timeout")
    req = gt_request(sim, "h")
    assert req["fault"] == "hang" and req["events"]["t_ns"] == []


def test_malformed_fault_inserts_a_non_json_line(sim_factory: Any) -> None:
    sim = sim_factory(malformed_rate=1.0, fault_after_tokens=4, **FAST)
    p = stream(sim, "/v1/chat/completions", chat_body(max_tokens=8), **{"X-Request-Id": "m"})
    bad = []
    for i, x in enumerate(p):
        try:
            json.loads(x) if x != "[DONE]" else None
        except ValueError:
            bad.append(i)
    assert len(bad) == 1
    good = [x for i, x in enumerate(p) if i not in bad]
    assert TOK.count(content_text(good)) == 8 and p[-1] == "[DONE]"
    kinds = gt_request(sim, "m")["events"]["kind"]
    assert kinds.index("malformed") == 1 + 4  # after the role chunk and 4 tokens


def test_fault_rates_are_deterministic_per_request_counter(sim_factory: Any) -> None:
    cfg = SimConfig(
        seed=11,
        error_rate=0.2,
        disconnect_rate=0.1,
        stall_rate=0.1,
        malformed_rate=0.1,
        hang_rate=0.1,
    )
    draws = [decide_fault(cfg, i) for i in range(1, 20_001)]
    for f in (Fault.ERROR, Fault.DISCONNECT, Fault.STALL, Fault.MALFORMED, Fault.HANG):
        assert abs(draws.count(f) / len(draws) - cfg.fault_rate(f)) < 0.015
    assert draws == [decide_fault(cfg, i) for i in range(1, 20_001)]
    assert draws != [decide_fault(SimConfig(seed=12, error_rate=0.2), i) for i in range(1, 20_001)]

    kw: dict[str, Any] = {
        "seed": 3,
        "error_rate": 0.3,
        "malformed_rate": 0.3,
        "ttft_ms": 1.0,
        "itl_ms": 0.1,
    }
    seen = []
    for sim in (sim_factory(**kw), sim_factory(**kw)):
        with httpx.Client(base_url=sim.base_url, timeout=10) as c:
            for _ in range(30):
                c.post("/v1/completions", json={"prompt": "x", "max_tokens": 3})
        gt = sim.ground_truth()["requests"]
        seen.append([gt[f"sim-{i}"]["fault"] for i in range(1, 31)])
        sim.reset()  # the counter restarts: the same faults again
        with httpx.Client(base_url=sim.base_url, timeout=10) as c:
            c.post("/v1/completions", json={"prompt": "x", "max_tokens": 3})
        assert sim.ground_truth()["requests"]["sim-1"]["fault"] == seen[-1][0]
    assert seen[0] == seen[1]
    expected = [decide_fault(SimConfig(**kw), i).value for i in range(1, 31)]
    assert seen[0] == expected
    assert {"error", "malformed", "none"} <= set(expected)


# --------------------------------------------------------------------------- metrics / GT


_PROM = re.compile(r"^([a-zA-Z_:][a-zA-Z0-9_:]*)(\{[^}]*\})? (-?[0-9.eE+-]+|NaN)$")


def parse_prom(text: str) -> dict[str, float]:
    out: dict[str, float] = {}
    for line in text.splitlines():
        if not line or line.startswith("#"):
            continue
        m = _PROM.match(line)
        assert m, f"bad metrics line {line!r}"
        out[m.group(1) + (m.group(2) or "")] = float(m.group(3))
    return out


def test_metrics_parse_and_count(sim_factory: Any) -> None:
    sim = sim_factory(ttft_ms=5.0, itl_ms=50.0)
    with socket.create_connection(("127.0.0.1", sim.port)) as s:
        s.sendall(raw_request(sim.port, "/v1/chat/completions", chat_body(max_tokens=4)))
        s.settimeout(5)
        s.recv(65536)
        during = parse_prom(httpx.get(sim.base_url + "/metrics").text)
        read_until(s, 5.0)
    label = '{model_name="tokentrace-sim"}'
    assert (
        during[f"vllm:num_requests_running{label}"] + during[f"vllm:num_requests_waiting{label}"]
        == 1
    )
    assert 0 < during[f"vllm:gpu_cache_usage_perc{label}"] <= 1
    after = parse_prom(httpx.get(sim.base_url + "/metrics").text)
    assert after[f"vllm:num_requests_running{label}"] == 0
    assert after[f"vllm:generation_tokens_total{label}"] == 4
    assert after[f"vllm:prompt_tokens_total{label}"] == TOK.count("the measure of a stream")


def test_ground_truth_reset(sim_factory: Any) -> None:
    sim = sim_factory(**FAST)
    stream(sim, "/v1/chat/completions", chat_body(max_tokens=2), **{"X-Request-Id": "x"})
    stream(sim, "/v1/chat/completions", chat_body(max_tokens=2), **{"X-Request-Id": "x"})
    assert set(sim.ground_truth()["requests"]) == {"x", "x#2"}
    assert httpx.post(sim.base_url + "/_sim/reset").json() == {"ok": True}
    assert sim.ground_truth()["requests"] == {}
    stream(sim, "/v1/chat/completions", chat_body(max_tokens=2))
    assert set(sim.ground_truth()["requests"]) == {"sim-1"}


# --------------------------------------------------------------------------- CLI


def test_cli_parses_and_rejects_bad_arguments(capsys: pytest.CaptureFixture[str]) -> None:
    ns = build_arg_parser().parse_args(
        [
            "--port",
            "9000",
            "--ttft-ms",
            "50",
            "--itl-ms",
            "10",
            "--tokens-per-event",
            "2",
            "--no-role-chunk",
            "--error-rate",
            "0.1",
            "--seed",
            "4",
        ]
    )
    cfg = config_from_args(ns)
    assert (cfg.port, cfg.ttft_ms, cfg.tokens_per_event, cfg.role_chunk) == (9000, 50, 2, False)
    assert (cfg.error_rate, cfg.seed) == (0.1, 4)
    for bad in (
        ["--itl-ms", "-1"],
        ["--bogus"],
        ["--error-rate", "0.7", "--hang-rate", "0.7"],
        ["--port", "x"],
    ):
        assert main(bad) == 2
        err = capsys.readouterr().err.strip()
        assert err.startswith("tokentrace sim: error:") and "\n" not in err


# --------------------------------------------------------------------------- load


async def fetch(port: int, path: str, body: dict[str, Any], rid: str) -> tuple[int, list[str]]:
    """A minimal client: read the raw response to EOF, then parse it with h11."""
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    conn = h11.Connection(h11.CLIENT)
    data = json.dumps(body).encode()
    headers = [
        ("host", "sim"),
        ("content-type", "application/json"),
        ("content-length", str(len(data))),
        ("x-request-id", rid),
    ]
    request = conn.send(h11.Request(method="POST", target=path, headers=headers))
    writer.write(request + conn.send(h11.Data(data=data)) + conn.send(h11.EndOfMessage()))
    raw = await reader.read(-1)
    writer.close()
    conn.receive_data(raw)
    conn.receive_data(b"")
    status, payload = 0, bytearray()
    while True:
        event = conn.next_event()
        if isinstance(event, h11.Response):
            status = event.status_code
        elif isinstance(event, h11.Data):
            payload += event.data
        else:
            break
    return status, sse_payloads(payload.decode())


def test_300_concurrent_streams_in_a_separate_process() -> None:
    n_streams, n_tokens, itl_ms = 300, 40, 10.0
    cfg = SimConfig(ttft_ms=20.0, itl_ms=itl_ms, role_chunk=True)
    with start_simulator_process(cfg) as sim:

        async def one(i: int) -> tuple[int, list[str]]:
            await asyncio.sleep(0.3 * i / n_streams)  # arrivals over 300 ms, not one burst
            body = {"prompt": "a b", "max_tokens": n_tokens, "stream": True}
            return await fetch(sim.port, "/v1/completions", body, f"c{i}")

        async def run() -> list[tuple[int, list[str]]]:
            return await asyncio.gather(*(one(i) for i in range(n_streams)))

        results = asyncio.run(run())
        gt = sim.ground_truth()["requests"]
        sim.reset()
        assert sim.ground_truth()["requests"] == {}
    assert all(status == 200 for status, _ in results)
    assert all(TOK.count(content_text(p)) == n_tokens for _, p in results)
    assert len(gt) == n_streams
    gaps, late = [], []
    for req in gt.values():
        t, due, _ = token_events(req)
        gaps.append(np.diff(t) / 1e6)
        late.append((t - due) / 1e6)
    dev = np.abs(np.concatenate(gaps) - itl_ms)
    lateness = np.concatenate(late)
    dev_p99, late_p50, late_p99 = (
        float(np.percentile(dev, 99)),
        float(np.percentile(lateness, 50)),
        float(np.percentile(lateness, 99)),
    )
    print(
        f"\n{n_streams} streams @ {itl_ms} ms ITL: |stamp gap - ITL| p99 {dev_p99:.3f} ms; "
        f"write lateness p50 {late_p50:.3f} ms, p99 {late_p99:.3f} ms"
    )
    assert late_p50 < 100.0 and dev_p99 < 1000.0  # sanity only: the figures are reported


def test_client_going_away_frees_the_stream(sim_factory: Any) -> None:
    sim = sim_factory(ttft_ms=5.0, itl_ms=20.0)
    with socket.create_connection(("127.0.0.1", sim.port)) as s:
        s.sendall(raw_request(sim.port, "/v1/chat/completions", chat_body(max_tokens=50), "gone"))
        s.settimeout(5)
        s.recv(65536)
    for _ in range(100):
        req = gt_request(sim, "gone")
        if req["closed_ns"] is not None:
            break
        asyncio.run(asyncio.sleep(0.01))
    assert req["closed_ns"] is not None
    assert sum(req["events"]["tokens"]) < 50
    metrics = parse_prom(httpx.get(sim.base_url + "/metrics").text)
    assert metrics['vllm:num_requests_running{model_name="tokentrace-sim"}'] == 0


@pytest.mark.parametrize(
    "text", ["", "the cat, sat.  on\n\tthe mat!!", " a  b   c ", "naïve café 123 x1 — ok?", "\n\n"]
)
def test_fast_input_count_matches_builtin_tokenizer(text: str) -> None:
    from app.targets.simulator.plan import count_tokens

    assert count_tokens(text) == TOK.count(text)
