"""runs.lost_requests: requests sent to the target (or recorded by the worker) whose records
were never stored, e.g. a batch the server refused or a worker lost mid-run. 0 for every
earlier run (nothing was counted then). A run that lost any is never shown as valid.

Revision ID: 0015
Revises: 0014
Create Date: 2027-03-12
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0015"
down_revision: str | None = "0014"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    with op.batch_alter_table("runs") as batch:
        batch.add_column(
            sa.Column("lost_requests", sa.Integer(), nullable=False, server_default="0")
        )


def downgrade() -> None:
    with op.batch_alter_table("runs") as batch:
        batch.drop_column("lost_requests")
