"""A run dealt over workers (``RunSpec.shards``, docs/scale.md): ``requests.shard_idx``, the
shard that sent a request (NULL: a run of one shard, every earlier run); on ``jobs``, a
shard's number (``shard_idx``), when its worker said it was ready (``shard_ready_at``) and
the common start instant on the server's wall clock (``shard_start_ns``).

Revision ID: 0022
Revises: 0021
Create Date: 2027-05-10
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0022"
down_revision: str | None = "0021"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    with op.batch_alter_table("requests") as batch:
        batch.add_column(sa.Column("shard_idx", sa.Integer(), nullable=True))
    with op.batch_alter_table("jobs") as batch:
        batch.add_column(sa.Column("shard_idx", sa.Integer(), nullable=True))
        batch.add_column(sa.Column("shard_ready_at", sa.DateTime(timezone=True), nullable=True))
        batch.add_column(sa.Column("shard_start_ns", sa.BigInteger(), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("jobs") as batch:
        batch.drop_column("shard_start_ns")
        batch.drop_column("shard_ready_at")
        batch.drop_column("shard_idx")
    with op.batch_alter_table("requests") as batch:
        batch.drop_column("shard_idx")
