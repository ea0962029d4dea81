"""requests: ``model`` and ``target``, the model and the base URL a request of a run of
several models (``RunSpec.model_mix``) or targets (``RunSpec.base_urls``) used
(``app.client.routing``); NULL for a run of one model and one target (every earlier run).

Revision ID: 0021
Revises: 0020
Create Date: 2027-05-02
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0021"
down_revision: str | None = "0020"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    with op.batch_alter_table("requests") as batch:
        batch.add_column(sa.Column("model", sa.String(length=255), nullable=True))
        batch.add_column(sa.Column("target", sa.String(length=2048), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("requests") as batch:
        batch.drop_column("target")
        batch.drop_column("model")
