"""CLI commands registered into `tokentrace` (see app.cli.main)."""

from __future__ import annotations

import argparse
from collections.abc import Callable

from rich.console import Console

from app.cli.args import UsageError
from app.domain import RunSpec

Handler = Callable[[argparse.Namespace, Console], int]


def register(sub: argparse._SubParsersAction) -> dict[str, Handler]:  # type: ignore[type-arg]
    """Add this module's subcommands to ``sub``; return command name -> handler."""
    return {}


def submit_and_follow(spec: RunSpec, ns: argparse.Namespace, console: Console) -> int:
    """``tokentrace bench --server URL``: submit the run to a dashboard and follow it."""
    raise UsageError("--server: submitting to a dashboard is not available yet")
