"""``tokentrace worker`` (pull jobs from a dashboard and run them) and ``tokentrace bench
--server`` (submit a run to a dashboard and follow it).

Exit codes as everywhere: 0 success, 1 the run or the connection failed (one-line reason),
2 bad arguments.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import logging
import math
import os
import signal
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

from app.cli.args import UsageError
from app.client.spec import RunSpec
from app.protocol.wire import TERMINAL_JOB_STATES, JobKind

Handler = Callable[[argparse.Namespace, Console], int]
TOKEN_ENV = "TOKENTRACE_WORKER_TOKEN"
SUBMIT_TOKEN_ENV = "TOKENTRACE_TOKEN"
POLL_S = 1.0


class Failure(Exception):
    """A one-line reason to exit 1."""


def register(sub: argparse._SubParsersAction) -> dict[str, Handler]:  # type: ignore[type-arg]
    """Add this module's subcommands to ``sub``; return command name -> handler."""
    w = sub.add_parser("worker", help="pull jobs from a tokentrace server and run them")
    w.add_argument("--server", required=True, help="the dashboard, e.g. http://10.0.0.5:8000")
    w.add_argument(
        "--token-file",
        type=Path,
        default=None,
        help=f"a file holding the API token (scope worker); or ${TOKEN_ENV}",
    )
    w.add_argument(
        "--token",
        default=None,
        help="the API token itself: visible to every user of this machine in ps, so prefer "
        f"--token-file or ${TOKEN_ENV}",
    )
    w.add_argument(
        "--label",
        action="append",
        default=[],
        metavar="K=V",
        help="a label jobs can require (repeatable), e.g. --label rack=a",
    )
    w.add_argument("--name", default=None, help="worker name shown in the dashboard")
    w.add_argument(
        "--state-dir",
        type=Path,
        default=None,
        help="where unsent results are kept (default: the user state directory)",
    )
    w.add_argument("--kind", action="append", default=None, choices=("bench", "probe", "sweep"))
    w.add_argument("--once", action="store_true", help="run at most one job, then exit")
    w.add_argument(
        "--realtime",
        action="store_true",
        help="run loads at real-time priority (SCHED_FIFO; needs root or CAP_SYS_NICE)",
    )
    w.add_argument(
        "--clock",
        choices=("auto", "userspace"),
        default="auto",
        help="receive stamps: auto = kernel (SO_TIMESTAMPNS) where available, else user-space",
    )
    w.add_argument(
        "--dataset-dir",
        action="append",
        default=None,
        dest="dataset_dirs",
        help="a directory runs may read dataset_path files from (repeatable; default "
        "TOKENTRACE_DATASET_DIRS; none: runs cannot name a file on this worker)",
    )
    w.add_argument(
        "--allow-link-local-targets",
        action="store_true",
        help="run loads against targets that resolve to link-local addresses (169.254.0.0/16, "
        "fe80::/10: cloud metadata services); refused by default",
    )
    w.add_argument(
        "--processes",
        default=None,
        metavar="N|auto",
        help="load processes for a run that asks for one (1 to 1024, or auto: the cores this "
        "machine can spare); a run asking for another count keeps it, one that cannot be "
        "dealt keeps one process and says why",
    )
    w.add_argument("--log-level", default="INFO", help="DEBUG | INFO | WARNING")
    w.add_argument(
        "--exit-with-parent",
        type=int,
        default=None,
        metavar="PID",
        help="stop when process PID, this worker's parent, ends (even killed): how "
        "`tokentrace serve` runs its embedded worker",
    )
    return {"worker": cmd_worker}


MAX_TOKEN_FILE_BYTES = 4096


def read_token(ns: argparse.Namespace) -> str:
    """The worker's token: ``--token-file``, else ``--token`` (with a warning: ``ps`` shows
    it), else ``$TOKENTRACE_WORKER_TOKEN`` (then dropped from this process's environment, so
    nothing it starts inherits it)."""
    if ns.token_file is not None and ns.token:
        raise UsageError("--token-file: give --token-file or --token, not both")
    if ns.token_file is not None:
        path: Path = ns.token_file
        try:
            with path.open("rb") as f:  # a pipe too: --token-file <(pass show tokentrace)
                raw = f.read(MAX_TOKEN_FILE_BYTES + 1)
                loose = path.is_file() and os.fstat(f.fileno()).st_mode & 0o077
        except OSError as e:
            raise UsageError(f"--token-file: cannot read {path}: {e.strerror or e}") from None
        token = raw.decode("utf-8", "replace").strip()
        if len(raw) > MAX_TOKEN_FILE_BYTES or not token or any(c.isspace() for c in token):
            raise UsageError(f"--token-file: {path} does not hold one token")
        if loose:
            sys.stderr.write(
                f"tokentrace worker: warning: {path} is readable by other users (chmod 600)\n"
            )
        return token
    if ns.token:
        sys.stderr.write(
            "tokentrace worker: warning: --token is visible to every user of this machine "
            f"(ps); use --token-file or ${TOKEN_ENV}\n"
        )
        return str(ns.token)
    token = os.environ.pop(TOKEN_ENV, "")
    if not token:
        raise UsageError(f"--token-file: a token is required (--token-file PATH or ${TOKEN_ENV})")
    return token


async def exit_with_parent(parent_pid: int, stop: asyncio.Event, grace_s: float) -> None:
    """Stop when ``parent_pid`` is gone (``app.worker.parent_watch``); once stopped without
    a parent, the process ends at the latest ``grace_s`` + ``EXIT_DEADLINE_S`` later."""
    from app.worker.parent_watch import EXIT_DEADLINE_S, hard_exit_after, watch_parent

    watcher = asyncio.create_task(watch_parent(parent_pid, stop))
    try:
        await stop.wait()
    finally:
        watcher.cancel()
    if os.getppid() != parent_pid:
        hard_exit_after(grace_s + EXIT_DEADLINE_S)


def parse_labels(items: list[str]) -> dict[str, str]:
    labels: dict[str, str] = {}
    for item in items:
        key, sep, value = item.partition("=")
        key = key.strip()
        if not sep or not key or any(c.isspace() for c in key):
            raise UsageError(f"--label: expected KEY=VALUE, got {item!r}")
        labels[key] = value.strip()
    return labels


def _check_url(flag: str, url: str) -> str:
    if not (url.startswith("http://") or url.startswith("https://")):
        raise UsageError(f"{flag}: must start with http:// or https://, got {url!r}")
    return url.rstrip("/")


def cmd_worker(ns: argparse.Namespace, console: Console) -> int:
    from app.worker.client import AuthError, ServerUnreachable
    from app.worker.loop import Worker, WorkerOptions

    labels = parse_labels(ns.label)
    server = _check_url("--server", ns.server)
    token = read_token(ns)
    if ns.exit_with_parent is not None:
        from app.worker.parent_watch import PARENT_GONE_EXIT, die_with_parent

        if not die_with_parent(ns.exit_with_parent):  # gone before the worker started
            return PARENT_GONE_EXIT
    level = getattr(logging, str(ns.log_level).upper(), None)
    if not isinstance(level, int):
        raise UsageError(f"--log-level: unknown level {ns.log_level!r}")
    logging.basicConfig(
        level=level, stream=sys.stderr, format="%(asctime)s %(levelname)s %(name)s: %(message)s"
    )
    if ns.realtime:
        from app.client.sched import RealtimeRefused, check_realtime

        try:
            check_realtime()
        except RealtimeRefused as e:
            raise UsageError(f"--realtime: {e}") from None
    kinds: list[JobKind] = ns.kind or ["bench", "sweep"]
    from app.client.connpool import raise_nofile_limit
    from app.settings import get_settings

    raise_nofile_limit()

    dirs = ns.dataset_dirs if ns.dataset_dirs is not None else get_settings().dataset_dirs
    for d in dirs:
        if not os.path.isdir(d):
            raise UsageError(f"--dataset-dir: {d!r} is not a directory")
    processes = None
    if ns.processes is not None:
        from app.worker.processes import parse_processes

        try:
            processes = parse_processes(ns.processes)
        except ValueError as e:
            raise UsageError(f"--processes: {e}") from None
    opts = WorkerOptions(
        processes=processes,
        realtime=ns.realtime,
        kernel_stamps=ns.clock == "auto",
        dataset_dirs=tuple(dirs),
        allow_link_local=ns.allow_link_local_targets or get_settings().target_allow_link_local,
    )
    worker = Worker(
        server,
        token,
        labels=labels,
        state_dir=ns.state_dir,
        kinds=kinds,
        name=ns.name,
        options=opts,
    )

    async def main() -> int:
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGINT, signal.SIGTERM):
            with contextlib.suppress(NotImplementedError, RuntimeError):
                loop.add_signal_handler(sig, stop.set)
        guard = None
        if ns.exit_with_parent is not None:
            guard = asyncio.create_task(
                exit_with_parent(ns.exit_with_parent, stop, opts.shutdown_grace_s)
            )
        try:
            if ns.once:
                outcome = await worker.run_once(stop)
                return 1 if outcome is not None and outcome.status == "failed" else 0
            await worker.run_forever(stop)
            return 0
        finally:
            if guard is not None:
                guard.cancel()

    try:
        return asyncio.run(main())
    except AuthError as e:
        return _fail(f"tokentrace worker: error: the server refused the token ({e})")
    except ServerUnreachable as e:
        return _fail(f"tokentrace worker: error: server unreachable: {e}")
    except RuntimeError as e:  # the state directory is in use
        return _fail(f"tokentrace worker: error: {e}")


def _fail(line: str) -> int:
    sys.stderr.write(line.splitlines()[0] + "\n" if line else "\n")
    return 1


# --------------------------------------------------------------------------- bench --server


def submission_body(spec: RunSpec, name: str | None, series: str | None = None) -> dict[str, Any]:
    """POST /api/v1/runs body (``app.api.schemas.RunCreate``): the spec's fields as JSON, plus
    ``api_key`` (spec dumps omit it), the run's name and the series it joins."""
    body: dict[str, Any] = spec.model_dump(mode="json")
    if math.isinf(spec.request_rate):  # the default; JSON has no infinity
        del body["request_rate"]
    if spec.api_key:
        body["api_key"] = spec.api_key
    if name:
        body["name"] = name
    if series:
        body["series"] = series
    return body


def _detail(resp: httpx.Response) -> str:
    try:
        body = resp.json()
    except ValueError:
        return resp.text.strip()[:200] or resp.reason_phrase
    d = body.get("detail", body) if isinstance(body, dict) else body
    return d if isinstance(d, str) else json.dumps(d)[:300]


def _check(resp: httpx.Response, what: str) -> Any:
    if resp.status_code in (401, 403):
        raise Failure(f"the server refused the token (HTTP {resp.status_code}: {_detail(resp)})")
    if resp.status_code >= 400:
        raise Failure(f"{what}: HTTP {resp.status_code}: {_detail(resp)}")
    try:
        return resp.json()
    except ValueError:
        raise Failure(f"{what}: the server did not answer JSON") from None


def sse_events(lines: Iterator[str]) -> Iterator[tuple[str, str]]:
    """(event name, data) of each SSE event in ``lines``."""
    event, data = "message", list[str]()
    for line in lines:
        if not line:
            if data:
                yield event, "\n".join(data)
            event, data = "message", list[str]()
        elif line.startswith(":"):
            continue
        else:
            field, _, value = line.partition(":")
            value = value.removeprefix(" ")
            if field == "event":
                event = value
            elif field == "data":
                data.append(value)
    if data:
        yield event, "\n".join(data)


def _state_and_progress(payload: Any) -> tuple[str | None, dict[str, Any]]:
    """A progress event or job object: its job state (if any) and its progress fields."""
    if not isinstance(payload, dict):
        return None, {}
    state = payload.get("state")
    prog = payload.get("progress")
    if not isinstance(prog, dict):
        prog = payload
    return (state if isinstance(state, str) else None), prog


class _Follower:
    """Follows a job's progress: SSE stream, falling back to polling the job."""

    def __init__(
        self, http: httpx.Client, job_id: str, on_progress: Callable[[dict[str, Any]], None]
    ):
        self.http = http
        self.job_id = job_id
        self.on_progress = on_progress

    def follow(self) -> str | None:
        state = self._stream()
        while state not in TERMINAL_JOB_STATES:
            state, prog = _state_and_progress(_check(self.http.get(f"/jobs/{self.job_id}"), "job"))
            if prog:
                self.on_progress(prog)
            if state in TERMINAL_JOB_STATES:
                break
            time.sleep(POLL_S)
        return state

    def _stream(self) -> str | None:
        state: str | None = None
        try:
            with self.http.stream(
                "GET",
                f"/jobs/{self.job_id}/progress/stream",
                headers={"Accept": "text/event-stream"},
                timeout=httpx.Timeout(30.0, read=None),
            ) as resp:
                if resp.status_code in (401, 403):
                    resp.read()
                    _check(resp, "progress")
                if resp.status_code != 200:
                    return None
                for event, data in sse_events(resp.iter_lines()):
                    try:
                        payload = json.loads(data)
                    except ValueError:
                        continue
                    st, prog = _state_and_progress(payload)
                    if prog:
                        self.on_progress(prog)
                    if st is not None:
                        state = st
                    if state in TERMINAL_JOB_STATES or event in ("end", "done", "complete"):
                        break
        except httpx.TransportError:
            return state  # the poll loop takes over (and reports the server if it is gone)
        return state


def _report_of(body: Any) -> dict[str, Any]:
    if isinstance(body, dict):
        if "metrics" in body:
            return body
        rep = body.get("report")
        if isinstance(rep, dict):
            return rep
    raise Failure("the server's run has no report")


def submit_and_follow(spec: RunSpec, ns: argparse.Namespace, console: Console) -> int:
    """``tokentrace bench --server URL``: submit the run to a dashboard and follow it."""
    server = _check_url("--server", ns.server)
    token = ns.token or os.environ.get(SUBMIT_TOKEN_ENV)
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    err = Console(stderr=True)
    try:
        with httpx.Client(
            base_url=server + "/api/v1", headers=headers, timeout=30.0, trust_env=False
        ) as http:
            return _submit_and_follow(http, spec, ns, console, err)
    except Failure as e:
        return _fail(f"tokentrace bench: error: {e}")
    except httpx.TransportError as e:
        return _fail(f"tokentrace bench: error: cannot reach {server}: {type(e).__name__}: {e}")


def _submit_and_follow(
    http: httpx.Client, spec: RunSpec, ns: argparse.Namespace, console: Console, err: Console
) -> int:
    body = submission_body(spec, ns.name, getattr(ns, "series", None))
    sub = _check(http.post("/runs", json=body), "submit")
    run_id = sub.get("run_id") or (sub.get("run") or {}).get("id")
    job_id = sub.get("job_id") or (sub.get("job") or {}).get("id")
    if not run_id or not job_id:
        raise Failure(f"submit: unexpected answer {json.dumps(sub)[:200]}")
    err.print(f"submitted run {run_id} (job {job_id}) to {ns.server}")
    total = spec.num_prompts
    with Progress(
        TextColumn("[bold]bench[/]"),
        TextColumn("{task.fields[phase]}"),
        BarColumn(),
        MofNCompleteColumn(),
        TextColumn("{task.fields[info]}"),
        TimeElapsedColumn(),
        console=err,
        transient=True,
        disable=ns.json or not err.is_terminal,
    ) as bar:
        task = bar.add_task("bench", total=total, info="", phase="queued")

        def on_progress(p: dict[str, Any]) -> None:
            bar.update(
                task,
                total=int(p.get("planned") or 0) or total,  # a trace: its lines; sessions: turns
                completed=int(p.get("done") or 0),
                phase=str(p.get("phase") or ""),
                info=f"errors {p.get('errors', 0)}  in flight {p.get('in_flight', 0)}  "
                f"{float(p.get('tokens_per_s') or 0):,.0f} tok/s",
            )

        state = _Follower(http, str(job_id), on_progress).follow()
        while spec.shards > 1:  # shard 0's job ended: the run ends with its last shard
            run = _check(http.get(f"/runs/{run_id}"), "run").get("run") or {}
            if run.get("status") not in ("queued", "running"):
                break
            time.sleep(POLL_S)
    report = _report_of(_check(http.get(f"/runs/{run_id}"), "report"))
    if ns.json:
        sys.stdout.write(json.dumps(report, indent=2, default=str) + "\n")
    else:
        from app.cli.render import render_report

        render_report(report, console)
    status = report.get("status")
    over = bool((report.get("validity") or {}).get("over_error_bound"))
    lost = bool((report.get("validity") or {}).get("lost_requests"))  # sent, never stored
    failed = status == "failed" or (state == "failed" and status != "partial")
    return 1 if failed or over or lost else 0
