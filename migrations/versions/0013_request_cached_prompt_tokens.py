"""requests: the prompt tokens the server served from its prefix cache, as its usage object
reported them (``usage.prompt_tokens_details.cached_tokens`` or llama.cpp's
``timings.cache_n``); NULL where the server did not say and for every earlier run. BIGINT
on PostgreSQL like the other token counts (0009); SQLite's INTEGER is 64-bit already.

Revision ID: 0013
Revises: 0012
Create Date: 2027-03-08
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0013"
down_revision: str | None = "0012"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    token_count = sa.BigInteger().with_variant(sa.Integer(), "sqlite")
    with op.batch_alter_table("requests") as batch:
        batch.add_column(sa.Column("cached_prompt_tokens", token_count, nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("requests") as batch:
        batch.drop_column("cached_prompt_tokens")
