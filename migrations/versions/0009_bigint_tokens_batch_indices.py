"""token counts as BIGINT on PostgreSQL; the request indices each result batch declared

Token-count columns (input/output/tokenizer/usage tokens, n_events) were INTEGER: a count
past 2^31-1 was a 500 on PostgreSQL (SQLite's INTEGER is already 64-bit, so nothing
changes there). ``job_batches.request_indices`` lists the indices a batch carried, so
completing a job can say which requests never landed (NULL for batches stored before).

Revision ID: 0009
Revises: 0008
Create Date: 2027-01-27
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0009"
down_revision: str | None = "0008"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

TOKEN_COLUMNS = (
    "input_tokens",
    "output_tokens",
    "tokenizer_output_tokens",
    "usage_prompt_tokens",
    "usage_completion_tokens",
    "n_events",
)


def _postgresql() -> bool:
    return op.get_bind().dialect.name == "postgresql"


def upgrade() -> None:
    if _postgresql():
        for name in TOKEN_COLUMNS:
            op.alter_column("requests", name, type_=sa.BigInteger(), existing_type=sa.Integer())
    with op.batch_alter_table("job_batches") as b:
        b.add_column(sa.Column("request_indices", sa.JSON(), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("job_batches") as b:
        b.drop_column("request_indices")
    if _postgresql():  # fails, naming the column, if a stored count no longer fits
        for name in reversed(TOKEN_COLUMNS):
            op.alter_column("requests", name, type_=sa.Integer(), existing_type=sa.BigInteger())
