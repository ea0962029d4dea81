"""More of a run dealt over workers (docs/scale.md): on ``jobs``, when a shard's worker
ended its warm-ups (``shard_warm_at``) and the common start of the measured phase on the
server's wall clock (``shard_measure_ns``); on ``sweeps``, the plan of a sweep whose steps
are each dealt over workers (``plan``: the server sequences its steps; NULL for any other).

Revision ID: 0023
Revises: 0022
Create Date: 2027-05-20
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0023"
down_revision: str | None = "0022"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    with op.batch_alter_table("jobs") as batch:
        batch.add_column(sa.Column("shard_warm_at", sa.DateTime(timezone=True), nullable=True))
        batch.add_column(sa.Column("shard_measure_ns", sa.BigInteger(), nullable=True))
    with op.batch_alter_table("sweeps") as batch:
        batch.add_column(sa.Column("plan", sa.JSON(), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("sweeps") as batch:
        batch.drop_column("plan")
    with op.batch_alter_table("jobs") as batch:
        batch.drop_column("shard_measure_ns")
        batch.drop_column("shard_warm_at")
