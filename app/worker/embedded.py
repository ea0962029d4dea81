"""The worker ``tokentrace serve`` starts next to itself, so one machine works out of the box.

``start_local_worker_process`` (what ``serve`` uses) runs ``tokentrace worker`` as a
supervised child process: nothing a run does there (its memory, its descriptors, a crash)
can take the server down, and a worker that dies is started again (backoff 1 s doubling to
30 s). Its token travels in the environment, not on the command line. It ends when the
server's process does, even killed (``--exit-with-parent``). ``stop()`` sends
SIGTERM: a running job stops its load, uploads what it can within the grace, and completes
as cancelled; a worker still alive after the timeout is killed.

``start_local_worker`` runs ``Worker.run_forever`` on a background thread instead (tests
and embedding; its loads run on a further thread: ``app.worker.load_thread``).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import signal
import subprocess
import sys
import threading
from collections.abc import Sequence
from pathlib import Path

from app.protocol.wire import JobKind
from app.worker.loop import Worker, WorkerOptions

log = logging.getLogger(__name__)


class LocalWorkerHandle:
    def __init__(self, worker: Worker) -> None:
        self.worker = worker
        self._ready = threading.Event()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._stop: asyncio.Event | None = None
        self.error: BaseException | None = None
        self._thread = threading.Thread(target=self._main, name="tokentrace-worker", daemon=True)

    def start(self) -> LocalWorkerHandle:
        self._thread.start()
        self._ready.wait(10)
        return self

    def _main(self) -> None:
        try:
            asyncio.run(self._amain())
        except BaseException as e:
            self.error = e
            log.exception("the local worker stopped with an error")
        finally:
            self._ready.set()

    async def _amain(self) -> None:
        self._loop = asyncio.get_running_loop()
        self._stop = asyncio.Event()
        self._ready.set()
        await self.worker.run_forever(self._stop)

    @property
    def alive(self) -> bool:
        return self._thread.is_alive()

    def stop(self, timeout_s: float = 15.0) -> None:
        """Stop the worker and wait (up to ``timeout_s``) for its thread to end."""
        loop, ev = self._loop, self._stop
        if loop is not None and ev is not None and self._thread.is_alive():
            with contextlib.suppress(RuntimeError):  # its loop already closed
                loop.call_soon_threadsafe(ev.set)
        self._thread.join(timeout_s)


def start_local_worker(
    server_url: str,
    token: str,
    *,
    labels: dict[str, str] | None = None,
    state_dir: Path | None = None,
    name: str = "local",
    options: WorkerOptions | None = None,
    kinds: Sequence[JobKind] = ("bench", "sweep"),
) -> LocalWorkerHandle:
    """Start a worker for ``server_url`` on a background thread; ``.stop()`` ends it.

    Registering retries with backoff, so it may start before the server listens."""
    opts = options or WorkerOptions(shutdown_grace_s=5.0)
    worker = Worker(
        server_url,
        token,
        labels=labels,
        state_dir=state_dir,
        name=name,
        options=opts,
        kinds=kinds,
    )
    return LocalWorkerHandle(worker).start()


RESTART_MIN_S = 1.0
RESTART_MAX_S = 30.0
TOKEN_ENV = "TOKENTRACE_WORKER_TOKEN"


def worker_command(
    server_url: str,
    *,
    name: str,
    kinds: Sequence[JobKind],
    options: WorkerOptions,
    state_dir: Path | None = None,
) -> list[str]:
    """``tokentrace worker`` for the embedded worker (the token goes in ``TOKEN_ENV``, never
    on its command line); it ends when this process does (``app.worker.parent_watch``)."""
    cmd = [sys.executable, "-m", "app.cli.main", "worker", "--server", server_url]
    cmd += ["--name", name, "--log-level", "WARNING", "--exit-with-parent", str(os.getpid())]
    for kind in kinds:
        cmd += ["--kind", kind]
    if options.realtime:
        cmd.append("--realtime")
    if not options.kernel_stamps:
        cmd += ["--clock", "userspace"]
    for d in options.dataset_dirs:
        cmd += ["--dataset-dir", d]
    if options.allow_link_local:
        cmd.append("--allow-link-local-targets")
    if state_dir is not None:
        cmd += ["--state-dir", str(state_dir)]
    return cmd


class LocalWorkerProcess:
    """``tokentrace worker`` as a child process, restarted whenever it dies."""

    def __init__(self, cmd: list[str], token: str) -> None:
        self.cmd = cmd
        self._env = os.environ | {TOKEN_ENV: token}
        self._stopping = threading.Event()
        self._lock = threading.Lock()
        self.proc: subprocess.Popen[bytes] | None = None
        self.starts = 0
        self.last_exit: int | None = None
        self._thread = threading.Thread(
            target=self._supervise, name="tokentrace-worker-supervisor", daemon=True
        )

    def start(self) -> LocalWorkerProcess:
        self._thread.start()
        return self

    @property
    def alive(self) -> bool:
        proc = self.proc
        return proc is not None and proc.poll() is None

    def _supervise(self) -> None:
        delay = RESTART_MIN_S
        while not self._stopping.is_set():
            with self._lock:
                if self._stopping.is_set():
                    return
                try:
                    self.proc = subprocess.Popen(self.cmd, env=self._env, stdin=subprocess.DEVNULL)
                except OSError as e:
                    log.error("cannot start the local worker: %s", e)
                    self.proc = None
                self.starts += 1
            proc = self.proc
            code = proc.wait() if proc is not None else None
            self.last_exit = code
            if self._stopping.is_set():
                return
            log.warning("the local worker exited (%s); starting it again in %.0f s", code, delay)
            if self._stopping.wait(delay):
                return
            delay = min(RESTART_MAX_S, delay * 2)

    def stop(self, timeout_s: float = 15.0) -> None:
        """SIGTERM, then SIGKILL after ``timeout_s``; the supervisor starts nothing more."""
        with self._lock:
            self._stopping.set()
            proc = self.proc
        if proc is not None and proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(timeout_s)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(5)
        self._thread.join(timeout_s)


def start_local_worker_process(
    server_url: str,
    token: str,
    *,
    name: str = "local",
    options: WorkerOptions | None = None,
    kinds: Sequence[JobKind] = ("bench", "sweep"),
    state_dir: Path | None = None,
) -> LocalWorkerProcess:
    """Start the embedded worker as a supervised child process; ``.stop()`` ends it."""
    opts = options or WorkerOptions(shutdown_grace_s=5.0)
    cmd = worker_command(server_url, name=name, kinds=kinds, options=opts, state_dir=state_dir)
    return LocalWorkerProcess(cmd, token).start()
