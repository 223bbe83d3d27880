"""The dashboard's aggregates, on SQLite and PostgreSQL: credits spent per UTC day and the
results of all an account's bulk jobs."""

from __future__ import annotations

from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
from sqlalchemy import update

from verimail.store import accounts as acc
from verimail.store import jobs as job_store
from verimail.store.billing.ledger import daily_spending
from verimail.store.billing.movements import charge, grant, refund
from verimail.store.db import Store
from verimail.store.tables import jobs
from verimail.store.testing import temporary_store

BACKENDS = ["sqlite", pytest.param("postgres", marks=pytest.mark.postgres)]


@pytest.fixture(params=BACKENDS)
def store(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Store]:
    with temporary_store(request.param, tmp_path, signup_credits=500) as s:
        yield s


def test_daily_spending_by_utc_day(store: Store) -> None:
    account = acc.create_account(store.engine, store.settings, plan="enterprise")
    other = acc.create_account(store.engine, store.settings, plan="enterprise")
    today = datetime(2026, 11, 27, tzinfo=UTC).date()
    late = datetime(2026, 11, 26, 23, 30, tzinfo=UTC)  # the day before, late (UTC)
    charge(store.engine, account.id, 5, reason="x", now=late)
    charge(store.engine, account.id, 7, reason="x", now=late + timedelta(hours=1))
    charge(store.engine, account.id, 3, reason="x", reference="r1", now=late + timedelta(hours=2))
    refund(
        store.engine, account.id, 3, reason="back", reference="r1", now=late + timedelta(hours=3)
    )
    charge(store.engine, account.id, 4, reason="old", now=late - timedelta(days=40))
    grant(store.engine, account.id, 100, reason="not spending")
    charge(store.engine, other.id, 50, reason="someone else", now=late)
    spent = daily_spending(store.engine, account.id, 3, today=today)
    assert spent == [0, 5, 7]  # 25th, 26th, 27th (the refund cancels its charge)


def test_result_totals_sum_bulk_jobs_only(store: Store) -> None:
    account = acc.create_account(store.engine, store.settings, plan="enterprise")
    assert job_store.result_totals(store.engine, account.id)["valid_count"] == 0
    for kind, valid in (("bulk_csv", 3), ("bulk_json", 4), ("finder_csv", 100)):
        job = job_store.create_job(store.engine, account.id, kind, 10, reserve=0)
        assert job is not None
        with store.engine.begin() as conn:
            conn.execute(
                update(jobs).where(jobs.c.id == job.id).values(valid_count=valid, invalid_count=1)
            )
    totals = job_store.result_totals(store.engine, account.id)
    assert totals["valid_count"] == 7 and totals["invalid_count"] == 2
