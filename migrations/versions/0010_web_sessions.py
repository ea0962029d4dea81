"""dashboard sign-in sessions: the cookie holds a session id (its SHA-256 stored here), not
an API token; each session has its CSRF token, an expiry, and is revoked on sign-out

Revision ID: 0010
Revises: 0009
Create Date: 2027-02-01
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0010"
down_revision: str | None = "0009"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.create_table(
        "web_sessions",
        sa.Column("id", sa.String(64), nullable=False),
        sa.Column("token_id", sa.String(32), nullable=False),
        sa.Column("csrf", sa.String(64), nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("expires_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("revoked_at", sa.DateTime(timezone=True), nullable=True),
        sa.ForeignKeyConstraint(
            ["token_id"],
            ["api_tokens.id"],
            name="fk_web_sessions_token_id_api_tokens",
            ondelete="CASCADE",
        ),
        sa.PrimaryKeyConstraint("id", name="pk_web_sessions"),
    )
    op.create_index("ix_web_sessions_token_id", "web_sessions", ["token_id"])


def downgrade() -> None:
    op.drop_index("ix_web_sessions_token_id", table_name="web_sessions")
    op.drop_table("web_sessions")
