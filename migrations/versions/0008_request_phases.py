"""per-request phases (SPEC 1b): queued, connect, tls, sending, waiting, first token; the
connection a request used and whether it was retried on a fresh one

Revision ID: 0008
Revises: 0007
Create Date: 2027-01-20
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0008"
down_revision: str | None = "0007"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

PHASES = ("queued_ns", "connect_ns", "tls_ns", "sending_ns", "waiting_ns", "first_token_ns")


def upgrade() -> None:
    with op.batch_alter_table("requests") as b:
        for name in PHASES:
            b.add_column(sa.Column(name, sa.BigInteger(), nullable=True))
        b.add_column(sa.Column("conn_id", sa.Integer(), nullable=True))
        b.add_column(sa.Column("conn_reused", sa.Boolean(), nullable=True))
        b.add_column(sa.Column("retries", sa.Integer(), nullable=False, server_default="0"))


def downgrade() -> None:
    with op.batch_alter_table("requests") as b:
        b.drop_column("retries")
        b.drop_column("conn_reused")
        b.drop_column("conn_id")
        for name in reversed(PHASES):
            b.drop_column(name)
