"""Merge the feature branches (probes, sweeps and baselines, interop) into one head.

Revision ID: 0006
Revises: 0003_probes, 0004, 0005
"""

from __future__ import annotations

from collections.abc import Sequence

revision: str = "0006"
down_revision: str | Sequence[str] | None = ("0003_probes", "0004", "0005")
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    """Nothing to change: this revision only joins the branches."""


def downgrade() -> None:
    """Nothing to change: this revision only joins the branches."""
