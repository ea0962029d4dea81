"""``tokentrace serve`` (the REST API on uvicorn) and ``tokentrace token`` (API tokens)."""

from __future__ import annotations

import argparse
import contextlib
import json
import signal
import sys
from collections.abc import Callable, Iterator
from types import FrameType
from typing import Any

from rich.console import Console
from rich.table import Table

from app.cli.args import Parser, UsageError

Handler = Callable[[argparse.Namespace, Console], int]


def register(sub: argparse._SubParsersAction) -> dict[str, Handler]:  # type: ignore[type-arg]
    """Add this module's subcommands to ``sub``; return command name -> handler."""
    from app.services.auth import SCOPES

    serve = sub.add_parser("serve", help="serve the REST API (and an embedded worker)")
    serve.add_argument("--host", default=None, help="listen address (default 127.0.0.1)")
    serve.add_argument("--port", type=int, default=None, help="listen port (default 8000)")
    serve.add_argument("--database-url", default=None)
    serve.add_argument(
        "--no-local-worker", action="store_true", help="do not start the embedded worker"
    )
    serve.add_argument(
        "--realtime",
        action="store_true",
        help="the embedded worker runs loads at real-time priority (SCHED_FIFO; root or "
        "CAP_SYS_NICE)",
    )
    serve.add_argument("--log-level", default="info")
    serve.add_argument("--access-log", action="store_true", help="log every HTTP request")
    serve.add_argument(
        "--demo",
        action="store_true",
        help="also start the simulator on --demo-port, benchmark it once if the database has "
        "no runs, and print an admin token for the browser",
    )
    serve.add_argument("--demo-port", type=int, default=9000)

    tok = sub.add_parser("token", help="create, list and revoke API tokens")
    tsub = tok.add_subparsers(dest="token_command", required=True, parser_class=Parser)
    create = tsub.add_parser("create", help="create a token and print its secret once")
    create.add_argument(
        "--scope",
        action="append",
        required=True,
        choices=SCOPES,
        help="read, run, admin or worker (repeat for several)",
    )
    create.add_argument("--name", default=None)
    create.add_argument("--json", action="store_true")
    create.add_argument("--database-url", default=None)
    lst = tsub.add_parser("list", help="list tokens (never their secrets)")
    lst.add_argument("--json", action="store_true")
    lst.add_argument("--database-url", default=None)
    rev = tsub.add_parser("revoke", help="revoke a token by id")
    rev.add_argument("token_id")
    rev.add_argument("--database-url", default=None)
    return {"serve": cmd_serve, "token": cmd_token}


def _exit_on_signal(signum: int, _frame: FrameType | None) -> None:
    raise SystemExit(128 + signum)


@contextlib.contextmanager
def exit_on_signals() -> Iterator[None]:
    """SIGTERM and SIGINT raise ``SystemExit(128 + signum)`` in the main thread, so every
    ``finally`` runs (the demo's simulator is stopped). uvicorn installs its own handlers
    while it serves, shuts down gracefully (the lifespan stops the embedded worker), then
    restores these and re-raises the signal it caught: without them SIGTERM's default
    action would end the process before the simulator is stopped."""
    signals = (signal.SIGTERM, signal.SIGINT)
    before = {s: signal.getsignal(s) for s in signals}
    for s in signals:
        signal.signal(s, _exit_on_signal)
    try:
        yield
    finally:
        for s, handler in before.items():
            signal.signal(s, handler)


def _run(app: Any, settings: Any, ns: argparse.Namespace) -> None:
    import uvicorn

    uvicorn.run(
        app,
        host=settings.host,
        port=settings.port,
        log_level=ns.log_level,
        access_log=ns.access_log,
    )


def cmd_serve(ns: argparse.Namespace, console: Console) -> int:

    from app.api.app import create_app
    from app.settings import Settings

    overrides: dict[str, Any] = {}
    if ns.host is not None:
        overrides["host"] = ns.host
    if ns.port is not None:
        if not 0 < ns.port < 65536:
            raise UsageError(f"--port: {ns.port} is not a port number")
        overrides["port"] = ns.port
    if ns.database_url is not None:
        overrides["database_url"] = ns.database_url
    if ns.no_local_worker:
        overrides["local_worker"] = False
    if ns.realtime:
        from app.client.sched import RealtimeRefused, check_realtime

        try:
            check_realtime()
        except RealtimeRefused as e:
            raise UsageError(f"--realtime: {e}") from None
        overrides["local_worker_realtime"] = True
    from app.client.connpool import raise_nofile_limit

    raise_nofile_limit()  # clients, workers and loads all hold sockets
    settings = Settings(**overrides)
    with exit_on_signals():
        if not ns.demo:
            _run(create_app(settings), settings, ns)
            return 0
        from app.services.demo import DEMO_MODEL, demo_environment

        with demo_environment(settings, console, sim_port=ns.demo_port) as sim_url:
            # the dashboard's launch forms start with the demo simulator as their target
            demo = settings.model_copy(
                update={"default_target_url": sim_url, "default_target_model": DEMO_MODEL}
            )
            _run(create_app(demo), demo, ns)
    return 0


def _sessions(url: str | None) -> Any:
    from app.services.runs import open_database
    from app.settings import get_settings

    return open_database(url or get_settings().database_url)


def cmd_token(ns: argparse.Namespace, console: Console) -> int:
    from app.services import auth
    from app.storage.db import session_scope

    sessions = _sessions(ns.database_url)
    if ns.token_command == "create":
        from app.services.errors import ServiceError

        try:
            with session_scope(sessions) as s:
                row, secret = auth.create_token(s, scopes=ns.scope, name=ns.name)
                info: dict[str, Any] = {
                    "id": row.id,
                    "name": row.name,
                    "scopes": row.scopes,
                    "secret": secret,
                }
        except ServiceError as e:
            raise UsageError(f"--{e.detail}") from None
        if ns.json:
            sys.stdout.write(json.dumps(info) + "\n")
        else:
            sys.stdout.write(f"{secret}\n")
            sys.stderr.write(
                f"token {info['id']} ({', '.join(info['scopes'])}): the secret above is shown "
                "only now\n"
            )
        return 0
    if ns.token_command == "list":
        with session_scope(sessions) as s:
            rows: list[dict[str, Any]] = [
                {
                    "id": t.id,
                    "name": t.name,
                    "scopes": list(t.scopes),
                    "prefix": t.prefix,
                    "created_at": t.created_at.isoformat(),
                    "last_used_at": t.last_used_at.isoformat() if t.last_used_at else None,
                    "revoked_at": t.revoked_at.isoformat() if t.revoked_at else None,
                }
                for t in auth.list_tokens(s)
            ]
        if ns.json:
            sys.stdout.write(json.dumps(rows, indent=2) + "\n")
            return 0
        table = Table("id", "name", "scopes", "prefix", "created", "last used", "revoked")
        for r in rows:
            table.add_row(
                r["id"],
                r["name"] or "",
                ",".join(r["scopes"]),
                r["prefix"] + "…",
                (r["created_at"] or "")[:19],
                (r["last_used_at"] or "")[:19],
                (r["revoked_at"] or "")[:19],
            )
        console.print(table)
        return 0
    with session_scope(sessions) as s:
        revoked = auth.revoke_token(s, ns.token_id)
    if revoked is None:
        raise UsageError(f"token_id: no token {ns.token_id!r}")
    sys.stdout.write(f"revoked {ns.token_id}\n")
    return 0
