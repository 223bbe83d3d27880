"""Learned domain patterns in the store (``store/patterns.py``), on SQLite and PostgreSQL."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from pathlib import Path

import pytest
from sqlalchemy import delete

from verimail.store.accounts import create_account
from verimail.store.db import Store
from verimail.store.patterns import pattern_counts, record_find
from verimail.store.tables import accounts
from verimail.store.testing import temporary_store


@pytest.fixture(params=["sqlite", "postgres"])
def store(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Store]:
    with temporary_store(request.param, tmp_path) as s:
        yield s


async def test_finds_at_once_all_count_and_scopes_read_them(store: Store) -> None:
    """Twenty finds recorded concurrently by two accounts: an upsert, so none is lost
    (a select-then-insert lost counts or failed on the duplicate key)."""
    one = create_account(store.engine, store.settings).id
    two = create_account(store.engine, store.settings).id
    await asyncio.gather(
        *(
            asyncio.to_thread(record_find, store.engine, account, "acme.test", "last.f")
            for account in [one, two] * 10
        )
    )
    record_find(store.engine, two, "acme.test", "flast")
    assert pattern_counts(store.engine, "acme.test", None) == {"last.f": 20, "flast": 1}
    assert pattern_counts(store.engine, "acme.test", one) == {"last.f": 10}
    with store.engine.begin() as conn:
        conn.execute(delete(accounts).where(accounts.c.id == two))
    assert pattern_counts(store.engine, "acme.test", None) == {"last.f": 10}  # cascaded
