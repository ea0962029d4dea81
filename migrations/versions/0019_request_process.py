"""requests: ``process_idx``, the load process that sent the request in a run dealt over
several processes of one host (``RunSpec.processes``, ``app.client.shards``), from 0; NULL
for a run of one process (every earlier run).

Revision ID: 0019
Revises: 0018
Create Date: 2027-04-20
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0019"
down_revision: str | None = "0018"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    with op.batch_alter_table("requests") as batch:
        batch.add_column(sa.Column("process_idx", sa.Integer(), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("requests") as batch:
        batch.drop_column("process_idx")
