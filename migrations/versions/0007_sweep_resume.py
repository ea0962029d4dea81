"""sweep steps remember their attempt and completed summary (lost sweeps resume)

Revision ID: 0007
Revises: 0006
Create Date: 2027-01-05
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0007"
down_revision: str | None = "0006"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    with op.batch_alter_table("sweep_steps") as b:
        b.add_column(sa.Column("attempt", sa.Integer(), nullable=False, server_default="1"))
        b.add_column(sa.Column("summary", sa.JSON(), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("sweep_steps") as b:
        b.drop_column("summary")
        b.drop_column("attempt")
