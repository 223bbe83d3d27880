"""Re-verification schedules of customers' lists and the history of their runs.

Revision ID: 0004
Revises: 0003
Create Date: 2026-11-27
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0004"
down_revision = "0003"
branch_labels = None
depends_on = None


def _created_at() -> sa.Column:
    return sa.Column(
        "created_at",
        sa.DateTime(timezone=True),
        nullable=False,
        server_default=sa.func.current_timestamp(),
    )


def _fk(table: str, column: str, target: str) -> sa.ForeignKeyConstraint:
    """``table.column`` → ``target.id``, deleted with it (named as tables.py names it)."""
    return sa.ForeignKeyConstraint(
        [column], [f"{target}.id"], name=f"fk_{table}_{column}_{target}", ondelete="CASCADE"
    )


def upgrade() -> None:
    op.create_table(
        "reverify_schedules",
        sa.Column("id", sa.Integer(), autoincrement=True, nullable=False),
        sa.Column("account_id", sa.Integer(), nullable=False),
        sa.Column("list_job_id", sa.Integer(), nullable=False),
        sa.Column("every_days", sa.Integer(), nullable=False),
        sa.Column("next_run_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("flow_run_id", sa.String(64), nullable=True),
        _created_at(),
        sa.CheckConstraint("every_days >= 1", name="ck_reverify_schedules_every_days_positive"),
        _fk("reverify_schedules", "account_id", "accounts"),
        _fk("reverify_schedules", "list_job_id", "jobs"),
        sa.PrimaryKeyConstraint("id", name="pk_reverify_schedules"),
    )
    op.create_index(
        "ix_reverify_schedules_list_job_id", "reverify_schedules", ["list_job_id"], unique=True
    )
    op.create_index("ix_reverify_schedules_account_id", "reverify_schedules", ["account_id"])
    op.create_table(
        "reverify_runs",
        sa.Column("id", sa.Integer(), autoincrement=True, nullable=False),
        sa.Column("account_id", sa.Integer(), nullable=False),
        sa.Column("list_job_id", sa.Integer(), nullable=False),
        sa.Column("job_id", sa.Integer(), nullable=True),
        sa.Column("previous_job_id", sa.Integer(), nullable=False),
        sa.Column("schedule_id", sa.Integer(), nullable=True),
        sa.Column("skipped_reason", sa.Text(), nullable=True),
        sa.Column("flow_run_id", sa.String(64), nullable=True),
        _created_at(),
        _fk("reverify_runs", "account_id", "accounts"),
        _fk("reverify_runs", "list_job_id", "jobs"),
        _fk("reverify_runs", "job_id", "jobs"),
        sa.PrimaryKeyConstraint("id", name="pk_reverify_runs"),
    )
    op.create_index("ix_reverify_runs_list_job_id_id", "reverify_runs", ["list_job_id", "id"])


def downgrade() -> None:
    op.drop_table("reverify_runs")
    op.drop_table("reverify_schedules")
