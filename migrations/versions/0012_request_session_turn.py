"""requests: the multi-turn session and turn a request belongs to (session_idx from 0,
turn_idx from 1; NULL for single requests and every earlier run)

Revision ID: 0012
Revises: 0011
Create Date: 2027-03-01
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0012"
down_revision: str | None = "0011"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    with op.batch_alter_table("requests") as batch:
        batch.add_column(sa.Column("session_idx", sa.Integer(), nullable=True))
        batch.add_column(sa.Column("turn_idx", sa.Integer(), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("requests") as batch:
        batch.drop_column("turn_idx")
        batch.drop_column("session_idx")
