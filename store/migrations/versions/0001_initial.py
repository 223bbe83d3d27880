"""Initial store: accounts, API keys, credit ledger, jobs.

Written by hand to match ``store/tables.py`` as of this revision (a test compares the
migrated schema with the metadata). Constraint names are spelled out because migrations
must not depend on the live metadata's naming convention.

Revision ID: 0001
Revises:
Create Date: 2026-11-23
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0001"
down_revision = None
branch_labels = None
depends_on = None

PLAN_CHECK = "plan IN ('free', 'starter', 'pro', 'business', 'enterprise')"
LEDGER_KIND_CHECK = "kind IN ('signup', 'grant', 'charge', 'reserve', 'refund', 'allowance')"
LEDGER_SOURCE_CHECK = "source IN ('prepaid', 'allowance')"
JOB_KIND_CHECK = "kind IN ('bulk_csv', 'bulk_json', 'finder_csv', 'reverify')"
JOB_STATUS_CHECK = "status IN ('pending', 'processing', 'completed', 'failed')"


def _ts(name: str, *, nullable: bool = True, now: bool = False) -> sa.Column:
    return sa.Column(
        name,
        sa.DateTime(timezone=True),
        nullable=nullable,
        server_default=sa.func.current_timestamp() if now else None,
    )


def _count(name: str) -> sa.Column:
    return sa.Column(name, sa.Integer(), nullable=False, server_default="0")


def upgrade() -> None:
    op.create_table(
        "accounts",
        sa.Column("id", sa.Integer(), autoincrement=True, nullable=False),
        sa.Column("email", sa.String(320), nullable=True),
        sa.Column("password_hash", sa.String(255), nullable=True),
        sa.Column("plan", sa.String(32), nullable=False, server_default="free"),
        sa.Column("finder_enabled", sa.Boolean(), nullable=False, server_default=sa.true()),
        sa.Column("is_admin", sa.Boolean(), nullable=False, server_default=sa.false()),
        sa.Column("prepaid_credits", sa.Integer(), nullable=False, server_default="0"),
        sa.Column("allowance_used", sa.Integer(), nullable=False, server_default="0"),
        sa.Column("allowance_period_start", sa.Date(), nullable=True),
        _ts("created_at", nullable=False, now=True),
        sa.PrimaryKeyConstraint("id", name="pk_accounts"),
        sa.UniqueConstraint("email", name="uq_accounts_email"),
        sa.CheckConstraint("prepaid_credits >= 0", name="ck_accounts_prepaid_nonnegative"),
        sa.CheckConstraint("allowance_used >= 0", name="ck_accounts_allowance_used_nonnegative"),
        sa.CheckConstraint(PLAN_CHECK, name="ck_accounts_plan"),
    )

    op.create_table(
        "api_keys",
        sa.Column("id", sa.Integer(), autoincrement=True, nullable=False),
        sa.Column("account_id", sa.Integer(), nullable=False),
        sa.Column("name", sa.String(100), nullable=False, server_default="default"),
        sa.Column("prefix", sa.String(16), nullable=False),
        sa.Column("key_hash", sa.String(64), nullable=False),
        _ts("created_at", nullable=False, now=True),
        _ts("last_used_at"),
        _ts("revoked_at"),
        sa.PrimaryKeyConstraint("id", name="pk_api_keys"),
        sa.ForeignKeyConstraint(
            ["account_id"],
            ["accounts.id"],
            name="fk_api_keys_account_id_accounts",
            ondelete="CASCADE",
        ),
        sa.UniqueConstraint("key_hash", name="uq_api_keys_key_hash"),
    )
    op.create_index("ix_api_keys_account_id", "api_keys", ["account_id"])

    op.create_table(
        "credit_ledger",
        sa.Column("id", sa.Integer(), autoincrement=True, nullable=False),
        sa.Column("account_id", sa.Integer(), nullable=False),
        sa.Column("delta", sa.Integer(), nullable=False),
        sa.Column("kind", sa.String(16), nullable=False),
        sa.Column("source", sa.String(16), nullable=False),
        sa.Column("reason", sa.Text(), nullable=False, server_default=""),
        sa.Column("reference", sa.String(200), nullable=True),
        sa.Column("balance_after", sa.Integer(), nullable=False),
        _ts("created_at", nullable=False, now=True),
        sa.PrimaryKeyConstraint("id", name="pk_credit_ledger"),
        sa.ForeignKeyConstraint(
            ["account_id"],
            ["accounts.id"],
            name="fk_credit_ledger_account_id_accounts",
            ondelete="CASCADE",
        ),
        sa.CheckConstraint(LEDGER_KIND_CHECK, name="ck_credit_ledger_kind"),
        sa.CheckConstraint(LEDGER_SOURCE_CHECK, name="ck_credit_ledger_source"),
    )
    op.create_index("ix_credit_ledger_account_id_id", "credit_ledger", ["account_id", "id"])
    op.create_index("ix_credit_ledger_reference", "credit_ledger", ["reference"])

    op.create_table(
        "jobs",
        sa.Column("id", sa.Integer(), autoincrement=True, nullable=False),
        sa.Column("public_id", sa.String(40), nullable=False),
        sa.Column("account_id", sa.Integer(), nullable=False),
        sa.Column("kind", sa.String(16), nullable=False),
        sa.Column("status", sa.String(16), nullable=False, server_default="pending"),
        _count("total_emails"),
        sa.Column("unique_emails", sa.Integer(), nullable=True),
        _count("processed_emails"),
        _count("valid_count"),
        _count("invalid_count"),
        _count("catch_all_count"),
        _count("disposable_count"),
        _count("unknown_count"),
        _count("risky_count"),
        _count("likely_valid_count"),
        _count("found_count"),
        _count("credits_reserved"),
        _count("credits_used"),
        _count("credits_refunded"),
        sa.Column("upload_path", sa.Text(), nullable=True),
        sa.Column("result_path", sa.Text(), nullable=True),
        sa.Column("email_column", sa.String(200), nullable=True),
        sa.Column("options", sa.Text(), nullable=True),
        sa.Column("failed_reason", sa.Text(), nullable=True),
        sa.Column("flow_run_id", sa.String(64), nullable=True),
        sa.Column("webhook_url", sa.Text(), nullable=True),
        _ts("created_at", nullable=False, now=True),
        _ts("started_at"),
        _ts("completed_at"),
        _ts("heartbeat_at"),
        sa.PrimaryKeyConstraint("id", name="pk_jobs"),
        sa.ForeignKeyConstraint(
            ["account_id"],
            ["accounts.id"],
            name="fk_jobs_account_id_accounts",
            ondelete="CASCADE",
        ),
        sa.UniqueConstraint("public_id", name="uq_jobs_public_id"),
        sa.CheckConstraint(JOB_KIND_CHECK, name="ck_jobs_kind"),
        sa.CheckConstraint(JOB_STATUS_CHECK, name="ck_jobs_status"),
        sa.CheckConstraint(
            "credits_refunded >= 0 AND credits_refunded <= credits_reserved",
            name="ck_jobs_refund_within_reservation",
        ),
    )
    op.create_index("ix_jobs_account_id_id", "jobs", ["account_id", "id"])
    op.create_index("ix_jobs_status_heartbeat_at", "jobs", ["status", "heartbeat_at"])


def downgrade() -> None:
    op.drop_table("jobs")
    op.drop_table("credit_ledger")
    op.drop_table("api_keys")
    op.drop_table("accounts")
