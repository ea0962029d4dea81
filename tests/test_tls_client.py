"""The socket client over TLS (https), over real loopback sockets.

A throwaway CA and server certificate for 127.0.0.1 are made with the ``openssl`` command
line once per session (.ci/run installs it if missing); the simulator serves https with them
and its ground truth checks the client's per-event stamps. Small asyncio TLS servers and a
silent TCP listener play the cases the simulator does not (close_notify, a truncated session,
a handshake that never completes).
"""

from __future__ import annotations

import asyncio
import shutil
import socket
import ssl
import subprocess
import sys
import time
from collections.abc import Awaitable, Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from app.client.clocks import ClockMap, kernel_stamps_supported
from app.client.http_request import parse_target, request_headers
from app.client.http_stream import StreamRequest
from app.client.raw_stream import RawStream
from app.client.runner import run_load_sync
from app.client.spec import RunSpec
from app.client.tokenizer import BuiltinTokenizer
from app.domain import ClockSource, EventKind, RequestStatus
from app.targets.sim_config import SimConfig
from app.targets.simulator import start_simulator_process, start_simulator_thread
from app.targets.simulator.cli import build_arg_parser, config_from_args
from app.targets.simulator.cli import main as sim_main
from tests.endpoint_support import body_of, path_of
from tests.record_support import finish_record

LINUX = sys.platform.startswith("linux")
OPENSSL = shutil.which("openssl")

# --------------------------------------------------------------------------- certificates


@dataclass(frozen=True)
class Certs:
    ca: str  # the test CA's certificate (trust anchor)
    cert: str  # server certificate for 127.0.0.1 / localhost, signed by the CA
    key: str
    self_cert: str  # a self-signed server certificate for 127.0.0.1 (trusted by nobody)
    self_key: str


def _openssl(*args: str, cwd: Path) -> None:
    assert OPENSSL is not None
    subprocess.run([OPENSSL, *args], cwd=cwd, check=True, capture_output=True, timeout=60)


_EC = ("-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes")
_SERVER_EXT = (
    "subjectAltName=IP:127.0.0.1,DNS:localhost\n"
    "basicConstraints=critical,CA:FALSE\n"
    "keyUsage=critical,digitalSignature\n"
    "extendedKeyUsage=serverAuth\n"
    "subjectKeyIdentifier=hash\n"
    "authorityKeyIdentifier=keyid\n"
)


@pytest.fixture(scope="session")
def certs(tmp_path_factory: pytest.TempPathFactory) -> Certs:
    if OPENSSL is None:
        pytest.fail("the openssl command line is needed to make test certificates: install it")
    d = tmp_path_factory.mktemp("tls")
    _openssl("req", "-x509", *_EC, "-keyout", "ca.key", "-out", "ca.pem", "-days", "2",
             "-subj", "/CN=tokentrace test CA",
             "-addext", "basicConstraints=critical,CA:TRUE",
             "-addext", "keyUsage=critical,keyCertSign,cRLSign", cwd=d)  # fmt: skip
    _openssl("req", *_EC, "-keyout", "server.key", "-out", "server.csr",
             "-subj", "/CN=127.0.0.1", cwd=d)  # fmt: skip
    (d / "server.ext").write_text(_SERVER_EXT)
    _openssl("x509", "-req", "-in", "server.csr", "-CA", "ca.pem", "-CAkey", "ca.key",
             "-CAcreateserial", "-out", "server.pem", "-days", "2",
             "-extfile", "server.ext", cwd=d)  # fmt: skip
    _openssl("req", "-x509", *_EC, "-keyout", "self.key", "-out", "self.pem", "-days", "2",
             "-subj", "/CN=127.0.0.1",
             "-addext", "subjectAltName=IP:127.0.0.1", cwd=d)  # fmt: skip
    return Certs(
        ca=str(d / "ca.pem"),
        cert=str(d / "server.pem"),
        key=str(d / "server.key"),
        self_cert=str(d / "self.pem"),
        self_key=str(d / "self.key"),
    )


def client_ctx(certs: Certs) -> ssl.SSLContext:
    """A client context that trusts the test CA (verification on)."""
    return ssl.create_default_context(cafile=certs.ca)


def server_ctx(certs: Certs) -> ssl.SSLContext:
    ctx = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    ctx.load_cert_chain(certs.cert, certs.key)
    return ctx


def sim_config(certs: Certs, **kw: Any) -> SimConfig:
    base: dict[str, Any] = {"ttft_ms": 20.0, "itl_ms": 5.0, "seed": 1}
    base.update(kw)
    return SimConfig(tls_certfile=certs.cert, tls_keyfile=certs.key, **base)


# --------------------------------------------------------------------------- helpers


def make_request(
    url: str,
    *,
    ssl_context: ssl.SSLContext | None,
    output_len: int = 10,
    timeout_s: float = 5.0,
    kernel: bool = True,
    request_id: str = "t-0",
) -> StreamRequest:
    target = parse_target(url)
    body = body_of(output_len=output_len)
    return StreamRequest(
        target,
        (target.host, target.port),
        socket.AF_INET,
        path_of(target),
        body,
        request_headers(target, request_id, None),
        request_id=request_id,
        timeout_s=timeout_s,
        clock=ClockMap(),
        kernel_stamps=kernel,
        ssl_context=ssl_context,
    )


def one_request(url: str, **kw: Any) -> RawStream:
    async def main() -> RawStream:
        return await make_request(url, **kw).run()

    return asyncio.run(main())


def record_of(raw: RawStream) -> Any:
    return finish_record(
        raw,
        index=0,
        scheduled_ns=0,
        run_start_ns=raw.t0_ns,
        tokenizer=BuiltinTokenizer(),
        token_counting="auto",
    )


def content_stamps(rec: Any, offset_ns: int) -> np.ndarray:
    return np.asarray(rec.event_t_ns[rec.event_kind == EventKind.CONTENT]) + offset_ns


def truth_content(gt: dict[str, Any], rid: str) -> np.ndarray:
    g = gt["requests"][rid]["events"]
    return np.asarray(
        [t for t, k in zip(g["t_ns"], g["kind"], strict=True) if k == "content"], np.int64
    )


def check_against_truth(ours: np.ndarray, truth: np.ndarray) -> None:
    assert len(ours) == len(truth)
    err_ms = np.abs(ours - truth) / 1e6
    # the simulator is a thread of this process: a stamp on either side may wait for the GIL
    # (a switch interval, 5 ms) once in a while, never typically (the median) nor twice over
    switch_ns = int(sys.getswitchinterval() * 1e9)
    assert np.median(err_ms) < 1, err_ms
    assert np.max(err_ms) < 4 * switch_ns / 1e6, err_ms
    assert np.all(ours >= truth - switch_ns)  # the server stamps before it writes
    assert np.all(np.diff(ours) >= 0)


# --------------------------------------------------------------------------- simulator


def test_stream_over_tls_matches_ground_truth(certs: Certs) -> None:
    handle = start_simulator_thread(sim_config(certs))
    try:
        assert handle.base_url.startswith("https://127.0.0.1:")
        raw = one_request(handle.base_url, ssl_context=client_ctx(certs), output_len=20)
        gt = handle.ground_truth()
    finally:
        handle.stop()
    assert raw.status is RequestStatus.OK and raw.error is None and raw.http_status == 200
    rec = record_of(raw)
    assert rec.status is RequestStatus.OK and rec.output_tokens == 20
    assert int((rec.event_kind == EventKind.CONTENT).sum()) == 20
    if kernel_stamps_supported():
        assert raw.clock is ClockSource.KERNEL, (raw.kernel_reads, raw.user_reads)
        # handshake-only reads count too: more reads than events delivered
        assert raw.kernel_reads >= 2
    else:
        assert raw.clock is ClockSource.USERSPACE
    assert raw.t0_ns < raw.ev_t[0] <= raw.end_ns
    check_against_truth(content_stamps(rec, raw.t0_ns), truth_content(gt, "t-0"))


def _tls_run(
    certs: Certs, monkeypatch: pytest.MonkeyPatch, tag: str, **spec: Any
) -> tuple[Any, dict[str, Any]]:
    """A run through the runner against the https simulator (trusting the test CA through
    ``SSL_CERT_FILE``): its result and the simulator's ground truth."""
    monkeypatch.setenv("SSL_CERT_FILE", certs.ca)
    handle = start_simulator_thread(sim_config(certs))
    try:
        run_spec = RunSpec(
            base_url=handle.base_url,
            model="m",
            input_len=8,
            request_timeout_s=5.0,
            scrape_metrics=False,
            **spec,
        )
        res = run_load_sync(run_spec, run_tag=tag, handle_sigint=False)
        return res, handle.ground_truth()
    finally:
        handle.stop()


def test_runner_over_tls_with_ssl_cert_file(certs: Certs, monkeypatch: pytest.MonkeyPatch) -> None:
    """The runner passes no context: the default one honours ``SSL_CERT_FILE``."""
    res, gt = _tls_run(certs, monkeypatch, "tls", output_len=10, num_prompts=4, max_concurrency=4)
    assert res.counts["ok"] == 4, [r.error for r in res.records]
    if kernel_stamps_supported():
        assert res.clock_source is ClockSource.KERNEL
    for r in res.records:
        assert r.output_tokens == 10
        ours = content_stamps(r, res.start_mono_ns)
        check_against_truth(ours, truth_content(gt, f"tls-{r.index}"))


def test_untrusted_certificate_is_a_request_error(certs: Certs) -> None:
    cfg = SimConfig(tls_certfile=certs.self_cert, tls_keyfile=certs.self_key)
    handle = start_simulator_thread(cfg)
    try:
        t = time.monotonic()
        raw = one_request(handle.base_url, ssl_context=None, timeout_s=5.0)  # default context
        assert time.monotonic() - t < 2.0
    finally:
        handle.stop()
    assert raw.status is RequestStatus.ERROR and raw.error is not None
    assert raw.error.startswith("tls handshake failed") and "certificate" in raw.error
    assert raw.ev_t == []


def test_wrong_ca_is_a_request_error(certs: Certs) -> None:
    """Verification against a context that trusts another CA fails the same way."""
    cfg = SimConfig(tls_certfile=certs.self_cert, tls_keyfile=certs.self_key)
    handle = start_simulator_thread(cfg)
    try:
        raw = one_request(handle.base_url, ssl_context=client_ctx(certs))
    finally:
        handle.stop()
    assert raw.status is RequestStatus.ERROR and "certificate" in (raw.error or "")


def test_disconnect_mid_stream_over_tls_keeps_events(certs: Certs) -> None:
    cfg = sim_config(certs, disconnect_rate=1.0, fault_after_tokens=5)
    handle = start_simulator_thread(cfg)
    try:
        raw = one_request(handle.base_url, ssl_context=client_ctx(certs), output_len=20)
    finally:
        handle.stop()
    assert raw.status is RequestStatus.ERROR and raw.error is not None
    assert "reset" in raw.error or "closed" in raw.error
    rec = record_of(raw)
    assert rec.status is RequestStatus.ERROR
    assert int((rec.event_kind == EventKind.CONTENT).sum()) == 5


def test_userspace_stamps_over_tls(certs: Certs) -> None:
    handle = start_simulator_thread(sim_config(certs))
    try:
        raw = one_request(handle.base_url, ssl_context=client_ctx(certs), kernel=False)
        gt = handle.ground_truth()
    finally:
        handle.stop()
    assert raw.status is RequestStatus.OK and raw.clock is ClockSource.USERSPACE
    assert raw.kernel_reads == 0 and raw.user_reads > 0
    assert raw.ev_t == raw.ev_user_t
    rec = record_of(raw)
    check_against_truth(content_stamps(rec, raw.t0_ns), truth_content(gt, "t-0"))


def test_simulator_process_over_tls(certs: Certs) -> None:
    with start_simulator_process(sim_config(certs)) as proc:
        assert proc.base_url.startswith("https://127.0.0.1:")
        raw = one_request(proc.base_url, ssl_context=client_ctx(certs), output_len=5)
        gt = proc.ground_truth()  # its control calls work over https too
        proc.reset()
    assert raw.status is RequestStatus.OK
    assert len(truth_content(gt, "t-0")) == 5


# --------------------------------------------------------------------------- handshake


@pytest.fixture
def silent_listener() -> Iterator[int]:
    """A TCP listener that never answers: the kernel accepts, the handshake waits."""
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    s.listen(8)
    try:
        yield s.getsockname()[1]
    finally:
        s.close()


def test_handshake_timeout(silent_listener: int, certs: Certs) -> None:
    url = f"https://127.0.0.1:{silent_listener}"
    t = time.monotonic()
    raw = one_request(url, ssl_context=client_ctx(certs), timeout_s=0.3)
    assert time.monotonic() - t < 1.5
    assert raw.status is RequestStatus.TIMEOUT
    assert raw.error == "request timeout after 0.3 s, during the TLS handshake"


def test_abort_during_handshake(silent_listener: int, certs: Certs) -> None:
    async def main() -> RawStream:
        sr = make_request(f"https://127.0.0.1:{silent_listener}", ssl_context=client_ctx(certs))
        asyncio.get_running_loop().call_later(
            0.1, sr.abort, RequestStatus.CANCELLED, "stopped: max_duration"
        )
        return await sr.run()

    t = time.monotonic()
    raw = asyncio.run(main())
    assert time.monotonic() - t < 1.5
    assert raw.status is RequestStatus.CANCELLED and raw.error == "stopped: max_duration"


def test_task_cancel_during_handshake(silent_listener: int, certs: Certs) -> None:
    async def main() -> RawStream:
        sr = make_request(f"https://127.0.0.1:{silent_listener}", ssl_context=client_ctx(certs))
        task = asyncio.create_task(sr.run())
        await asyncio.sleep(0.1)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        return sr.raw

    raw = asyncio.run(main())
    assert raw.status is RequestStatus.CANCELLED and raw.error == "request cancelled"


# --------------------------------------------------------------------------- TLS endings

Handler = Callable[[asyncio.StreamWriter], Awaitable[None]]


def with_tls_server(certs: Certs, handler: Handler, **kw: Any) -> RawStream:
    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            await reader.readuntil(b"\r\n\r\n")
            await handler(writer)
        except (ConnectionError, asyncio.IncompleteReadError, ssl.SSLError):
            pass

    async def main() -> RawStream:
        server = await asyncio.start_server(handle, "127.0.0.1", 0, ssl=server_ctx(certs))
        port = server.sockets[0].getsockname()[1]
        try:
            return await make_request(
                f"https://127.0.0.1:{port}", ssl_context=client_ctx(certs), **kw
            ).run()
        finally:
            server.close()

    return asyncio.run(main())


_UNTIL_CLOSE_HEAD = (
    b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nConnection: close\r\n\r\n"
)
_EVENTS = b"".join(
    b'data: {"choices":[{"index":0,"delta":{"content":" the"}}]}\n\n' for _ in range(3)
)


def test_close_notify_ends_an_until_close_body(certs: Certs) -> None:
    async def h(w: asyncio.StreamWriter) -> None:
        w.write(_UNTIL_CLOSE_HEAD)
        await w.drain()
        await asyncio.sleep(0.01)
        w.write(_EVENTS)
        await w.drain()
        w.close()  # TLS close_notify, then FIN
        await w.wait_closed()

    raw = with_tls_server(certs, h)
    assert raw.status is RequestStatus.OK and raw.error is None
    assert len(raw.ev_t) == 3 and raw.done_ns is not None
    if kernel_stamps_supported():
        assert raw.clock is ClockSource.KERNEL


def test_truncated_tls_session_is_an_error(certs: Certs) -> None:
    """FIN without close_notify: the body may be cut short and nobody can tell."""

    async def h(w: asyncio.StreamWriter) -> None:
        w.write(_UNTIL_CLOSE_HEAD + _EVENTS)
        await w.drain()
        await asyncio.sleep(0.05)
        sock = w.get_extra_info("socket")
        sock.shutdown(socket.SHUT_WR)
        await asyncio.sleep(0.2)

    raw = with_tls_server(certs, h)
    assert raw.status is RequestStatus.ERROR and raw.error is not None
    assert "close_notify" in raw.error and "(3 events received)" in raw.error
    assert len(raw.ev_t) == 3


def test_server_closing_during_handshake(certs: Certs) -> None:
    async def main() -> RawStream:
        def closer(r: asyncio.StreamReader, w: asyncio.StreamWriter) -> None:
            w.close()

        server = await asyncio.start_server(closer, "127.0.0.1", 0)
        port = server.sockets[0].getsockname()[1]
        try:
            return await make_request(
                f"https://127.0.0.1:{port}", ssl_context=client_ctx(certs)
            ).run()
        finally:
            server.close()

    raw = asyncio.run(main())
    assert raw.status is RequestStatus.ERROR
    assert (raw.error or "").startswith(("tls handshake failed", "connection reset"))


def test_plain_http_server_on_https_url(certs: Certs) -> None:
    """A server answering plain HTTP to the ClientHello: a handshake error, not a hang."""

    async def main() -> RawStream:
        async def plain(r: asyncio.StreamReader, w: asyncio.StreamWriter) -> None:
            w.write(b"HTTP/1.1 400 Bad Request\r\nContent-Length: 0\r\n\r\n")
            await w.drain()
            await asyncio.sleep(0.5)
            w.close()

        server = await asyncio.start_server(plain, "127.0.0.1", 0)
        port = server.sockets[0].getsockname()[1]
        try:
            return await make_request(
                f"https://127.0.0.1:{port}", ssl_context=client_ctx(certs), timeout_s=2.0
            ).run()
        finally:
            server.close()

    raw = asyncio.run(main())
    assert raw.status is RequestStatus.ERROR
    assert (raw.error or "").startswith("tls handshake failed")


# --------------------------------------------------------------------------- sim options


def test_sim_config_tls_needs_both_files(certs: Certs) -> None:
    with pytest.raises(ValueError, match="tls_certfile and tls_keyfile go together"):
        SimConfig(tls_certfile=certs.cert)
    with pytest.raises(ValueError, match="tls_certfile and tls_keyfile go together"):
        SimConfig(tls_keyfile=certs.key)
    assert not SimConfig().tls and sim_config(certs).tls
    assert SimConfig.from_dict(sim_config(certs).to_dict()) == sim_config(certs)


def test_sim_cli_tls_flags(certs: Certs, capsys: pytest.CaptureFixture[str]) -> None:
    ns = build_arg_parser().parse_args(["--tls-certfile", certs.cert, "--tls-keyfile", certs.key])
    cfg = config_from_args(ns)
    assert cfg.tls_certfile == certs.cert and cfg.tls_keyfile == certs.key
    assert sim_main(["--tls-certfile", certs.cert]) == 2
    assert "go together" in capsys.readouterr().err
    assert sim_main(["--port", "0", "--tls-certfile", certs.key, "--tls-keyfile", certs.key]) == 2
    assert "TLS certificate" in capsys.readouterr().err


def test_large_request_body_over_tls(certs: Certs) -> None:
    """A request larger than the socket buffers: the ciphertext goes out in partial sends."""

    async def main() -> tuple[RawStream, int]:
        target_url = handle.base_url
        target = parse_target(target_url)
        prompt = "hello " * 600_000  # ~3.6 MB
        body = body_of(prompt=prompt, output_len=3)
        sr = StreamRequest(
            target,
            (target.host, target.port),
            socket.AF_INET,
            path_of(target),
            body,
            request_headers(target, "big", None),
            request_id="big",
            timeout_s=20.0,
            clock=ClockMap(),
            ssl_context=client_ctx(certs),
        )
        return await sr.run(), len(body)

    handle = start_simulator_thread(sim_config(certs, ttft_ms=1.0, itl_ms=1.0))
    try:
        raw, nbody = asyncio.run(main())
        gt = handle.ground_truth()
    finally:
        handle.stop()
    assert raw.status is RequestStatus.OK, raw.error
    assert gt["requests"]["big"]["input_tokens"] >= 600_000
    assert len(truth_content(gt, "big")) == 3 and nbody > 3_000_000


def test_keep_alive_over_tls_does_one_handshake_per_connection(
    certs: Certs, monkeypatch: pytest.MonkeyPatch
) -> None:
    """12 requests on 3 slots: 3 connections, 3 handshakes (the tls phase of each
    connection's first request only), every request matched to the ground truth."""
    res, gt = _tls_run(certs, monkeypatch, "tka", output_len=6, num_prompts=12, max_concurrency=3)
    assert res.counts["ok"] == 12, [r.error for r in res.records]
    assert (res.connections["opened"], res.connections["reused"]) == (3, 9)
    assert gt["connections_accepted"] == 3
    with_tls = [r for r in res.records if r.tls_ns is not None]
    assert len(with_tls) == 3 and all(not r.conn_reused and r.tls_ns > 0 for r in with_tls)
    for r in res.records:
        ours = content_stamps(r, res.start_mono_ns)
        check_against_truth(ours, truth_content(gt, f"tka-{r.index}"))


def test_multi_turn_sessions_over_tls(
    certs: Certs, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """Without think time a session's next turn leaves from the TLS read callback where the
    reply ended, on the reply's connection (the TLS session kept): every turn OK, one
    connection per session, each later turn carrying more prompt by the server's count."""
    import json

    path = tmp_path / "conv.jsonl"
    convs = [["one two", "three four", "five"], ["six", "seven eight"]]
    path.write_text("".join(json.dumps({"turns": c}) + "\n" for c in convs))
    res, _gt = _tls_run(
        certs, monkeypatch, "tlsmt", endpoint="chat", dataset="jsonl",
        dataset_path=str(path), multi_turn=True, num_prompts=2, output_len=4,
    )  # fmt: skip
    recs = sorted((r for r in res.records if not r.warmup), key=lambda r: (r.session, r.turn))
    assert [(r.session, r.turn) for r in recs] == [(0, 1), (0, 2), (0, 3), (1, 1), (1, 2)]
    assert all(r.status is RequestStatus.OK for r in recs), [r.error for r in recs]
    for s in (0, 1):
        mine = [r for r in recs if r.session == s]
        assert len({r.conn_id for r in mine}) == 1
        assert [r.conn_reused for r in mine] == [False] + [True] * (len(mine) - 1)
        prompts = [r.usage_prompt_tokens for r in mine]
        assert all(p is not None for p in prompts) and prompts == sorted(set(prompts)), prompts
