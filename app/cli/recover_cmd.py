"""``tokentrace recover SPOOL``: store the result batches a worker kept (the server refused
them, or its lease was lost before they were sent) into their runs, on the dashboard's
database (``app.services.spool_recovery``; docs/reliability.md).

Exit codes as everywhere: 0 stored (or nothing left to store), 1 the database would not take
them (the reason in one line), 2 bad arguments (not a kept spool, an unreadable batch).
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Iterator
from pathlib import Path

from pydantic import ValidationError
from rich.console import Console

from app.cli.args import UsageError
from app.cli.serve_cmd import Handler
from app.protocol.wire import LeasedJob, ResultBatch
from app.worker.spool import BATCH_PREFIX


def register(sub: argparse._SubParsersAction) -> dict[str, Handler]:  # type: ignore[type-arg]
    """Add this module's subcommands to ``sub``; return command name -> handler."""
    p = sub.add_parser(
        "recover",
        help="store the result batches a worker kept (refused, or never sent) into their runs",
    )
    p.add_argument(
        "spool",
        type=Path,
        help="a job spool the worker kept: <worker state dir>/kept/<job id>-a<attempt>",
    )
    p.add_argument("--json", action="store_true")
    p.add_argument("--database-url", default=None)
    return {"recover": cmd_recover}


def _batches(paths: list[Path]) -> Iterator[ResultBatch]:
    """Each batch file parsed as it is stored (one in memory at a time)."""
    for path in paths:
        try:
            yield ResultBatch.model_validate_json(path.read_bytes())
        except (OSError, ValidationError, ValueError) as e:
            raise UsageError(f"{path}: not a result batch: {str(e).splitlines()[0]}") from None


def cmd_recover(ns: argparse.Namespace, console: Console) -> int:
    from app.services.errors import ServiceError
    from app.services.runs import open_database
    from app.services.spool_recovery import recover_batches
    from app.settings import get_settings

    spool: Path = ns.spool
    try:
        job = LeasedJob.model_validate_json((spool / "job.json").read_bytes())
    except OSError:
        raise UsageError(f"spool: {spool} is not a worker's job spool (no job.json)") from None
    except (ValidationError, ValueError) as e:
        raise UsageError(f"spool: {spool / 'job.json'}: {str(e).splitlines()[0]}") from None
    paths = sorted(spool.glob(f"{BATCH_PREFIX}*.json"))
    if not paths:
        raise UsageError(f"spool: {spool} holds no result batches ({BATCH_PREFIX}*.json)")
    sessions = open_database(ns.database_url or get_settings().database_url)
    try:
        rec = recover_batches(sessions, job.job_id, job.attempt, _batches(paths))
    except ServiceError as e:
        sys.stderr.write(f"tokentrace recover: {e}\n")
        return 1
    stored = dict(rec.stored)
    if ns.json:
        out = {"job_id": job.job_id, "attempt": job.attempt, "batches": rec.batches,
               "already_stored_batches": rec.duplicate_batches, "stored": stored}  # fmt: skip
        sys.stdout.write(json.dumps(out, indent=2) + "\n")
    else:
        for run_id, n in stored.items():
            console.print(f"run {run_id}: {n} requests stored")
        console.print(
            f"{rec.batches} batches read, {rec.duplicate_batches} already stored; "
            f"{spool} may now be deleted"
        )
    return 0
