"""CLI commands registered into `tokentrace` (see app.cli.main)."""

from __future__ import annotations

import argparse
from collections.abc import Callable

from rich.console import Console

Handler = Callable[[argparse.Namespace, Console], int]


def register(sub: argparse._SubParsersAction) -> dict[str, Handler]:  # type: ignore[type-arg]
    """Add this module's subcommands to ``sub``; return command name -> handler."""
    return {}
