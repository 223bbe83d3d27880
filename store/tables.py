"""The store's tables (SQLAlchemy Core), the single source the hand-written migrations follow.

Enumerations are CHECK constraints on plain strings rather than native enums: they behave
the same on SQLite and PostgreSQL and a new value is a one-line migration on both.
Timestamps are UTC; ``UTCDateTime`` makes SQLite (which stores naive text) hand back
aware datetimes like PostgreSQL does, so callers never compare naive with aware.
"""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

from sqlalchemy import (
    Boolean,
    CheckConstraint,
    Column,
    Date,
    DateTime,
    ForeignKey,
    Index,
    Integer,
    MetaData,
    PrimaryKeyConstraint,
    String,
    Table,
    Text,
    false,
    func,
    true,
)
from sqlalchemy.engine import Dialect
from sqlalchemy.types import TypeDecorator

from verimail.schemas.limits import MAX_EMAIL_LENGTH
from verimail.store.plans import PLAN_NAMES

# Stable constraint names, so later migrations can drop/alter them by name on both backends.
NAMING_CONVENTION = {
    "ix": "ix_%(column_0_label)s",
    "uq": "uq_%(table_name)s_%(column_0_name)s",
    "ck": "ck_%(table_name)s_%(constraint_name)s",
    "fk": "fk_%(table_name)s_%(column_0_name)s_%(referred_table_name)s",
    "pk": "pk_%(table_name)s",
}

metadata = MetaData(naming_convention=NAMING_CONVENTION)

LEDGER_KINDS = ("signup", "grant", "charge", "reserve", "refund", "allowance")
LEDGER_SOURCES = ("prepaid", "allowance")
JOB_KINDS = ("bulk_csv", "bulk_json", "finder_csv", "reverify")
JOB_STATUSES = ("pending", "processing", "completed", "failed")


def _in(column: str, values: tuple[str, ...]) -> str:
    """SQL text ``column IN ('a', 'b')`` for a CHECK constraint (values are our constants)."""
    return f"{column} IN ({', '.join(repr(v) for v in values)})"


class UTCDateTime(TypeDecorator[datetime]):
    """A timezone-aware UTC timestamp on every backend (SQLite drops the zone on storage)."""

    impl = DateTime(timezone=True)
    cache_ok = True

    def process_bind_param(self, value: datetime | None, dialect: Dialect) -> datetime | None:
        if value is None:
            return None
        if value.tzinfo is None:
            raise ValueError("naive datetime given to the store; pass an aware UTC datetime")
        value = value.astimezone(UTC)
        # SQLite stores text; drop the zone so the text sorts and compares uniformly.
        return value.replace(tzinfo=None) if dialect.name == "sqlite" else value

    def process_result_value(self, value: Any, dialect: Dialect) -> datetime | None:
        if value is None:
            return None
        if value.tzinfo is None:
            return value.replace(tzinfo=UTC)
        return value.astimezone(UTC)


accounts = Table(
    "accounts",
    metadata,
    Column("id", Integer, primary_key=True, autoincrement=True),
    # Nullable: operators create accounts from the CLI without an address; unique when set
    # (both backends allow several NULLs under a UNIQUE constraint).
    Column("email", String(MAX_EMAIL_LENGTH), unique=True, nullable=True),
    # Filled by the dashboard later; API-key-only accounts have none.
    Column("password_hash", String(255), nullable=True),
    Column("plan", String(32), nullable=False, server_default="free"),
    Column("finder_enabled", Boolean, nullable=False, server_default=true()),
    Column("is_admin", Boolean, nullable=False, server_default=false()),
    Column("prepaid_credits", Integer, nullable=False, server_default="0"),
    Column("allowance_used", Integer, nullable=False, server_default="0"),
    # Start (UTC date) of the allowance period ``allowance_used`` counts; NULL = never used.
    Column("allowance_period_start", Date, nullable=True),
    Column("created_at", UTCDateTime, nullable=False, server_default=func.current_timestamp()),
    CheckConstraint("prepaid_credits >= 0", name="prepaid_nonnegative"),
    CheckConstraint("allowance_used >= 0", name="allowance_used_nonnegative"),
    CheckConstraint(_in("plan", PLAN_NAMES), name="plan"),
)

api_keys = Table(
    "api_keys",
    metadata,
    Column("id", Integer, primary_key=True, autoincrement=True),
    Column(
        "account_id",
        Integer,
        ForeignKey("accounts.id", ondelete="CASCADE"),
        nullable=False,
        index=True,
    ),
    Column("name", String(100), nullable=False, server_default="default"),
    Column("prefix", String(16), nullable=False),
    Column("key_hash", String(64), nullable=False, unique=True),
    Column("created_at", UTCDateTime, nullable=False, server_default=func.current_timestamp()),
    Column("last_used_at", UTCDateTime, nullable=True),
    Column("revoked_at", UTCDateTime, nullable=True),
)

credit_ledger = Table(
    "credit_ledger",
    metadata,
    Column("id", Integer, primary_key=True, autoincrement=True),
    Column(
        "account_id",
        Integer,
        ForeignKey("accounts.id", ondelete="CASCADE"),
        nullable=False,
    ),
    Column("delta", Integer, nullable=False),
    Column("kind", String(16), nullable=False),
    Column("source", String(16), nullable=False),
    Column("reason", Text, nullable=False, server_default=""),
    Column("reference", String(200), nullable=True),
    Column("balance_after", Integer, nullable=False),
    Column("created_at", UTCDateTime, nullable=False, server_default=func.current_timestamp()),
    CheckConstraint(_in("kind", LEDGER_KINDS), name="kind"),
    CheckConstraint(_in("source", LEDGER_SOURCES), name="source"),
    Index("ix_credit_ledger_account_id_id", "account_id", "id"),
    Index("ix_credit_ledger_reference", "reference"),
)

jobs = Table(
    "jobs",
    metadata,
    Column("id", Integer, primary_key=True, autoincrement=True),
    Column("public_id", String(40), nullable=False, unique=True),
    Column(
        "account_id",
        Integer,
        ForeignKey("accounts.id", ondelete="CASCADE"),
        nullable=False,
    ),
    Column("kind", String(16), nullable=False),
    Column("status", String(16), nullable=False, server_default="pending"),
    Column("total_emails", Integer, nullable=False, server_default="0"),
    Column("unique_emails", Integer, nullable=True),
    Column("processed_emails", Integer, nullable=False, server_default="0"),
    Column("valid_count", Integer, nullable=False, server_default="0"),
    Column("invalid_count", Integer, nullable=False, server_default="0"),
    Column("catch_all_count", Integer, nullable=False, server_default="0"),
    Column("disposable_count", Integer, nullable=False, server_default="0"),
    Column("unknown_count", Integer, nullable=False, server_default="0"),
    Column("risky_count", Integer, nullable=False, server_default="0"),
    Column("likely_valid_count", Integer, nullable=False, server_default="0"),
    Column("found_count", Integer, nullable=False, server_default="0"),
    Column("credits_reserved", Integer, nullable=False, server_default="0"),
    Column("credits_used", Integer, nullable=False, server_default="0"),
    Column("credits_refunded", Integer, nullable=False, server_default="0"),
    Column("upload_path", Text, nullable=True),
    Column("result_path", Text, nullable=True),
    Column("email_column", String(200), nullable=True),
    Column("options", Text, nullable=True),
    Column("failed_reason", Text, nullable=True),
    Column("flow_run_id", String(64), nullable=True),
    Column("webhook_url", Text, nullable=True),
    Column("created_at", UTCDateTime, nullable=False, server_default=func.current_timestamp()),
    Column("started_at", UTCDateTime, nullable=True),
    Column("completed_at", UTCDateTime, nullable=True),
    Column("heartbeat_at", UTCDateTime, nullable=True),
    # A deleted job's tombstone (store/job_deletion.py): its data gone, its id kept.
    Column("deleted_at", UTCDateTime, nullable=True),
    CheckConstraint(_in("kind", JOB_KINDS), name="kind"),
    CheckConstraint(_in("status", JOB_STATUSES), name="status"),
    CheckConstraint(
        "credits_refunded >= 0 AND credits_refunded <= credits_reserved",
        name="refund_within_reservation",
    ),
    Index("ix_jobs_account_id_id", "account_id", "id"),
    Index("ix_jobs_status_heartbeat_at", "status", "heartbeat_at"),
)

# Dashboard sessions ended by logging out (store/sessions.py): the session is a signed cookie,
# so this is what makes a copy of it taken before the logout stop working.
ended_sessions = Table(
    "ended_sessions",
    metadata,
    Column("sid_hash", String(64), primary_key=True),  # SHA-256 of the session id
    Column("expires_at", UTCDateTime, nullable=False, index=True),
)

# Email Finder: the local-part patterns found at each domain (store/patterns.py). Pattern
# names and counts only, never an address or a name: what any lookup at the domain may use.
domain_patterns = Table(
    "domain_patterns",
    metadata,
    Column(
        "account_id",
        Integer,
        ForeignKey("accounts.id", ondelete="CASCADE"),
        nullable=False,
    ),
    Column("domain", String(255), nullable=False),
    Column("pattern", String(64), nullable=False),
    Column("finds", Integer, nullable=False, server_default="0"),
    Column("last_found_at", UTCDateTime, nullable=False),
    PrimaryKeyConstraint("account_id", "domain", "pattern", name="pk_domain_patterns"),
    CheckConstraint("finds >= 0", name="finds_nonnegative"),
    Index("ix_domain_patterns_domain", "domain"),
)

# Re-verification of a customer's list (store/reverify.py). A "list" is the job its owner
# first uploaded (``list_job_id``); every re-verification of it is a job of its own.
reverify_schedules = Table(
    "reverify_schedules",
    metadata,
    Column("id", Integer, primary_key=True, autoincrement=True),
    Column("account_id", Integer, ForeignKey("accounts.id", ondelete="CASCADE"), nullable=False),
    Column("list_job_id", Integer, ForeignKey("jobs.id", ondelete="CASCADE"), nullable=False),
    Column("every_days", Integer, nullable=False),
    Column("next_run_at", UTCDateTime, nullable=False),
    # The Prefect flow run (state Scheduled) that will make the next run.
    Column("flow_run_id", String(64), nullable=True),
    Column("created_at", UTCDateTime, nullable=False, server_default=func.current_timestamp()),
    CheckConstraint("every_days >= 1", name="every_days_positive"),
    Index("ix_reverify_schedules_list_job_id", "list_job_id", unique=True),
    Index("ix_reverify_schedules_account_id", "account_id"),
)

# One row per re-verification of a list, made or skipped: the list's history.
reverify_runs = Table(
    "reverify_runs",
    metadata,
    Column("id", Integer, primary_key=True, autoincrement=True),
    Column("account_id", Integer, ForeignKey("accounts.id", ondelete="CASCADE"), nullable=False),
    Column("list_job_id", Integer, ForeignKey("jobs.id", ondelete="CASCADE"), nullable=False),
    # The new job (NULL when the run was skipped) and the job it compares against.
    Column("job_id", Integer, ForeignKey("jobs.id", ondelete="CASCADE"), nullable=True),
    Column("previous_job_id", Integer, nullable=False),
    Column("schedule_id", Integer, nullable=True),  # (the schedule may be cancelled since)
    Column("skipped_reason", Text, nullable=True),
    Column("flow_run_id", String(64), nullable=True),
    Column("created_at", UTCDateTime, nullable=False, server_default=func.current_timestamp()),
    Index("ix_reverify_runs_list_job_id_id", "list_job_id", "id"),
)

# A big job's shards (store/job_shards.py): each verifies the addresses of some domains, on
# whichever worker takes it, and is run again alone when its worker dies.
SHARD_STATUSES = ("pending", "running", "done")
job_shards = Table(
    "job_shards",
    metadata,
    Column("job_id", Integer, ForeignKey("jobs.id", ondelete="CASCADE"), nullable=False),
    Column("shard", Integer, nullable=False),
    Column("status", String(16), nullable=False, server_default="pending"),
    Column("attempt", Integer, nullable=False, server_default="1"),
    Column("addresses", Integer, nullable=False),  # distinct addresses in it
    Column("rows", Integer, nullable=False),  # the upload's rows they stand for
    Column("processed", Integer, nullable=False, server_default="0"),  # rows settled
    Column("counts", Text, nullable=True),  # JSON: the job's count columns, for its rows
    Column("flow_run_id", String(64), nullable=True),
    Column("heartbeat_at", UTCDateTime, nullable=True),
    Column("completed_at", UTCDateTime, nullable=True),
    PrimaryKeyConstraint("job_id", "shard", name="pk_job_shards"),
    CheckConstraint(_in("status", SHARD_STATUSES), name="status"),
    Index("ix_job_shards_status_heartbeat_at", "status", "heartbeat_at"),
)
