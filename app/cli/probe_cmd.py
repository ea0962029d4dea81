"""CLI commands registered into `tokentrace` (see app.cli.main)."""

from __future__ import annotations

import argparse

from app.cli.serve_cmd import Handler


def register(sub: argparse._SubParsersAction) -> dict[str, Handler]:  # type: ignore[type-arg]
    """Add this module's subcommands to ``sub``; return command name -> handler."""
    return {}
