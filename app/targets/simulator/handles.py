"""Handles to a running simulator, for tests, demos and benchmarks: ``SimulatorThread``
(a background thread with its own event loop, ``start_simulator_thread``) and
``SimulatorProcess`` (``python -m app.targets.simulator`` in a child process, optionally
pinned to CPUs, ``start_simulator_process``), both ``SimulatorHandle``s: the port, the base
URL (``client_url``), the ground truth, a reset and a stop.
"""

from __future__ import annotations

import asyncio
import json
import os
import re
import select
import signal
import ssl
import subprocess
import sys
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any, Protocol

from app.targets.sim_config import SimConfig
from app.targets.simulator.scheduler import resolve
from app.targets.simulator.server import SimServer


def _client_host(host: str) -> str:
    if host in ("0.0.0.0", ""):
        return "127.0.0.1"
    if host == "::":
        return "::1"
    return host


def client_url(host: str, port: int, tls: bool = False) -> str:
    """The base URL a client on this host uses for a server bound to ``host:port``."""
    h = _client_host(host)
    scheme = "https" if tls else "http"
    return f"{scheme}://[{h}]:{port}" if ":" in h else f"{scheme}://{h}:{port}"


def _control_verify(config: SimConfig) -> bool | ssl.SSLContext:
    """TLS verification for the harness's own control calls (ground truth, reset) to the
    simulator process it started: none (its certificate is often a throwaway one)."""
    if not config.tls:
        return True
    ctx = ssl.create_default_context()
    ctx.check_hostname = False
    ctx.verify_mode = ssl.CERT_NONE
    return ctx


class SimulatorHandle(Protocol):
    @property
    def port(self) -> int: ...

    @property
    def base_url(self) -> str: ...

    def ground_truth(self) -> dict[str, Any]: ...

    def reset(self) -> None: ...

    def stop(self) -> None: ...


class SimulatorThread:
    """The simulator in a background thread with its own event loop (for tests)."""

    def __init__(self, config: SimConfig) -> None:
        self.config = config
        self._ready = threading.Event()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._server: SimServer | None = None
        self._stop_fut: asyncio.Future[None] | None = None
        self._error: BaseException | None = None
        self._thread = threading.Thread(target=self._main, name="tokentrace-sim", daemon=True)

    def start(self, timeout_s: float = 10.0) -> SimulatorThread:
        self._thread.start()
        if not self._ready.wait(timeout_s):
            raise RuntimeError("simulator thread did not start")
        if self._error is not None:
            raise RuntimeError(f"simulator failed to start: {self._error}") from self._error
        return self

    def _main(self) -> None:
        try:
            asyncio.run(self._amain())
        except BaseException as e:  # reported to the starting thread
            self._error = e
            self._ready.set()

    async def _amain(self) -> None:
        self._loop = asyncio.get_running_loop()
        self._stop_fut = self._loop.create_future()
        server = SimServer(self.config)
        await server.start()
        self._server = server
        self._ready.set()
        try:
            await self._stop_fut
        finally:
            await server.close()

    @property
    def port(self) -> int:
        assert self._server is not None, "not started"
        return self._server.port

    @property
    def base_url(self) -> str:
        return client_url(self.config.host, self.port, self.config.tls)

    def _call(self, fn: Callable[[], Any]) -> Any:
        assert self._loop is not None
        cf = asyncio.run_coroutine_threadsafe(_call_async(fn), self._loop)
        return cf.result(timeout=30)

    def ground_truth(self) -> dict[str, Any]:
        server = self._server
        assert server is not None
        result: dict[str, Any] = self._call(server.ground_truth)
        return result

    def reset(self) -> None:
        server = self._server
        assert server is not None
        self._call(server.reset)

    def stop(self) -> None:
        loop, fut = self._loop, self._stop_fut
        if loop is not None and fut is not None and self._thread.is_alive():
            loop.call_soon_threadsafe(resolve, fut)
        self._thread.join(timeout=10)

    def __enter__(self) -> SimulatorThread:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()


async def _call_async(fn: Callable[[], Any]) -> Any:
    return fn()


def start_simulator_thread(config: SimConfig) -> SimulatorThread:
    return SimulatorThread(config).start()


_READY = re.compile(r"listening on (https?://\S+)")


class SimulatorProcess:
    """The simulator in a separate process (``python -m app.targets.simulator``)."""

    def __init__(self, config: SimConfig, *, cpus: set[int] | None = None) -> None:
        self.config = config
        self._cpus = cpus
        self._proc: subprocess.Popen[bytes] | None = None
        self._port = 0

    def start(self, timeout_s: float = 30.0) -> SimulatorProcess:
        root = str(Path(__file__).resolve().parents[3])
        env = dict(os.environ)
        env["PYTHONPATH"] = os.pathsep.join(p for p in (root, env.get("PYTHONPATH")) if p)
        cmd = [
            sys.executable,
            "-m",
            "app.targets.simulator",
            "--config-json",
            json.dumps(self.config.to_dict()),
        ]
        self._proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, env=env, cwd=root)
        if self._cpus is not None and hasattr(os, "sched_setaffinity"):
            os.sched_setaffinity(self._proc.pid, self._cpus)
        line = _read_line(self._proc, timeout_s)
        m = _READY.search(line)
        if m is None:
            self.stop()
            raise RuntimeError(f"simulator process did not start: {line.strip()!r}")
        self._port = int(m.group(1).rsplit(":", 1)[1])
        return self

    @property
    def pid(self) -> int:
        assert self._proc is not None
        return self._proc.pid

    @property
    def port(self) -> int:
        return self._port

    @property
    def base_url(self) -> str:
        return client_url(self.config.host, self._port, self.config.tls)

    def ground_truth(self) -> dict[str, Any]:
        import httpx

        r = httpx.get(
            self.base_url + "/_sim/ground_truth",
            timeout=60,
            verify=_control_verify(self.config),
        )
        r.raise_for_status()
        data: dict[str, Any] = r.json()
        return data

    def reset(self) -> None:
        import httpx

        httpx.post(
            self.base_url + "/_sim/reset", timeout=30, verify=_control_verify(self.config)
        ).raise_for_status()

    def stop(self) -> None:
        proc = self._proc
        if proc is None or proc.poll() is not None:
            return
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout=10)
        if proc.stdout is not None:
            proc.stdout.close()

    def __enter__(self) -> SimulatorProcess:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()


def _read_line(proc: subprocess.Popen[bytes], timeout_s: float) -> str:
    assert proc.stdout is not None
    ready, _, _ = select.select([proc.stdout], [], [], timeout_s)
    if not ready:
        return "(timed out)"
    return proc.stdout.readline().decode(errors="replace")


def start_simulator_process(
    config: SimConfig, *, cpus: set[int] | None = None, timeout_s: float = 30.0
) -> SimulatorProcess:
    """Start the simulator in its own process (optionally pinned to ``cpus``)."""
    return SimulatorProcess(config, cpus=cpus).start(timeout_s)
