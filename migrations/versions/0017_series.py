"""named series of runs: the series (its comparability key, the fields it lets vary, what
it does with a run whose key differs, its baseline), its members (state, reason, key, the
compact point a trend reads, trust), the sweeps whose steps join it, its alerts with
their deliveries; and a running job's /metrics history (the run page's live panels)

Revision ID: 0017
Revises: 0016
Create Date: 2027-03-20
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0017"
down_revision: str | None = "0016"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

RowId = sa.BigInteger().with_variant(sa.Integer(), "sqlite")


def upgrade() -> None:
    op.create_table(
        "series",
        sa.Column("id", sa.String(32), nullable=False),
        sa.Column("name", sa.String(100), nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("key", sa.JSON(), nullable=True),
        sa.Column("key_run_id", sa.String(32), nullable=True),
        sa.Column("vary", sa.JSON(), nullable=False),
        sa.Column("on_mismatch", sa.String(16), nullable=False),
        sa.Column("baseline_run_id", sa.String(32), nullable=True),
        sa.Column("note", sa.Text(), nullable=True),
        sa.ForeignKeyConstraint(
            ["baseline_run_id"], ["runs.id"], name="fk_series_baseline_run_id_runs",
            ondelete="SET NULL",
        ),
        sa.PrimaryKeyConstraint("id", name="pk_series"),
        sa.UniqueConstraint("name", name="uq_series_name"),
    )  # fmt: skip
    op.create_table(
        "series_members",
        sa.Column("id", RowId, autoincrement=True, nullable=False),
        sa.Column("series_id", sa.String(32), nullable=False),
        sa.Column("run_id", sa.String(32), nullable=False),
        sa.Column("sweep_id", sa.String(32), nullable=True),
        sa.Column("track", sa.String(64), nullable=False),
        sa.Column("state", sa.String(16), nullable=False),
        sa.Column("reason", sa.Text(), nullable=True),
        sa.Column("key", sa.JSON(), nullable=True),
        sa.Column("point", sa.JSON(), nullable=True),
        sa.Column("trusted", sa.Boolean(), nullable=False),
        sa.Column("trust_issues", sa.JSON(), nullable=False),
        sa.Column("run_created_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("added_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("settled_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column("evaluated", sa.Boolean(), nullable=False),
        sa.ForeignKeyConstraint(
            ["series_id"], ["series.id"], name="fk_series_members_series_id_series",
            ondelete="CASCADE",
        ),
        sa.ForeignKeyConstraint(
            ["run_id"], ["runs.id"], name="fk_series_members_run_id_runs", ondelete="CASCADE"
        ),
        sa.PrimaryKeyConstraint("id", name="pk_series_members"),
        sa.UniqueConstraint("run_id", name="uq_series_members_run_id"),
    )  # fmt: skip
    op.create_index(
        "ix_series_members_series_id_run_created_at",
        "series_members",
        ["series_id", "run_created_at"],
    )
    op.create_table(
        "series_sweeps",
        sa.Column("id", RowId, autoincrement=True, nullable=False),
        sa.Column("series_id", sa.String(32), nullable=False),
        sa.Column("sweep_id", sa.String(32), nullable=False),
        sa.Column("added_at", sa.DateTime(timezone=True), nullable=False),
        sa.ForeignKeyConstraint(
            ["series_id"], ["series.id"], name="fk_series_sweeps_series_id_series",
            ondelete="CASCADE",
        ),
        sa.ForeignKeyConstraint(
            ["sweep_id"], ["sweeps.id"], name="fk_series_sweeps_sweep_id_sweeps",
            ondelete="CASCADE",
        ),
        sa.PrimaryKeyConstraint("id", name="pk_series_sweeps"),
        sa.UniqueConstraint("sweep_id", name="uq_series_sweeps_sweep_id"),
    )  # fmt: skip
    op.create_table(
        "series_alerts",
        sa.Column("id", RowId, autoincrement=True, nullable=False),
        sa.Column("series_id", sa.String(32), nullable=False),
        sa.Column("metric", sa.String(64), nullable=False),
        sa.Column("stat", sa.String(16), nullable=False),
        sa.Column("webhook_sealed", sa.Text(), nullable=False),
        sa.Column("webhook_shown", sa.String(300), nullable=False),
        sa.Column("max_value", sa.Float(), nullable=True),
        sa.Column("max_relative", sa.Float(), nullable=True),
        sa.Column("change_points", sa.Boolean(), nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.ForeignKeyConstraint(
            ["series_id"], ["series.id"], name="fk_series_alerts_series_id_series",
            ondelete="CASCADE",
        ),
        sa.PrimaryKeyConstraint("id", name="pk_series_alerts"),
    )  # fmt: skip
    op.create_index("ix_series_alerts_series_id", "series_alerts", ["series_id"])
    op.create_table(
        "series_alert_events",
        sa.Column("id", RowId, autoincrement=True, nullable=False),
        sa.Column("alert_id", RowId, nullable=False),
        sa.Column("series_id", sa.String(32), nullable=False),
        sa.Column("run_id", sa.String(32), nullable=True),
        sa.Column("kind", sa.String(16), nullable=False),
        sa.Column("dedupe", sa.String(128), nullable=False),
        sa.Column("text", sa.Text(), nullable=False),
        sa.Column("payload", sa.JSON(), nullable=False),
        sa.Column("state", sa.String(16), nullable=False),
        sa.Column("attempts", sa.Integer(), nullable=False),
        sa.Column("next_attempt_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column("last_error", sa.Text(), nullable=True),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("delivered_at", sa.DateTime(timezone=True), nullable=True),
        sa.ForeignKeyConstraint(
            ["alert_id"], ["series_alerts.id"], name="fk_series_alert_events_alert_id_series_alerts",
            ondelete="CASCADE",
        ),
        sa.ForeignKeyConstraint(
            ["series_id"], ["series.id"], name="fk_series_alert_events_series_id_series",
            ondelete="CASCADE",
        ),
        sa.PrimaryKeyConstraint("id", name="pk_series_alert_events"),
        sa.UniqueConstraint(
            "alert_id", "dedupe", name="uq_series_alert_events_alert_id_dedupe"
        ),
    )  # fmt: skip
    op.create_index(
        "ix_series_alert_events_state_next_attempt_at",
        "series_alert_events",
        ["state", "next_attempt_at"],
    )
    op.create_index("ix_series_alert_events_series_id", "series_alert_events", ["series_id"])
    op.create_table(
        "job_live_series",
        sa.Column("job_id", sa.String(32), nullable=False),
        sa.Column("updated_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("payload", sa.JSON(), nullable=False),
        sa.ForeignKeyConstraint(
            ["job_id"], ["jobs.id"], name="fk_job_live_series_job_id_jobs", ondelete="CASCADE"
        ),
        sa.PrimaryKeyConstraint("job_id", name="pk_job_live_series"),
    )


def downgrade() -> None:
    op.drop_table("job_live_series")
    op.drop_index("ix_series_alert_events_series_id", table_name="series_alert_events")
    op.drop_index(
        "ix_series_alert_events_state_next_attempt_at", table_name="series_alert_events"
    )
    op.drop_table("series_alert_events")
    op.drop_index("ix_series_alerts_series_id", table_name="series_alerts")
    op.drop_table("series_alerts")
    op.drop_table("series_sweeps")
    op.drop_index("ix_series_members_series_id_run_created_at", table_name="series_members")
    op.drop_table("series_members")
    op.drop_table("series")
