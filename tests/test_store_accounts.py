"""Accounts and API keys: signup credits, hashed keys, revocation, settings."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
from sqlalchemy import select, text
from sqlalchemy.exc import IntegrityError

from verimail.store import accounts as acc
from verimail.store.billing.ledger import ledger
from verimail.store.billing.movements import charge
from verimail.store.billing.pools import AccountNotFound, balance
from verimail.store.db import Store, utcnow
from verimail.store.sessions import end_session, session_ended
from verimail.store.tables import api_keys, ended_sessions, metadata
from verimail.store.testing import temporary_store

BACKENDS = ["sqlite", pytest.param("postgres", marks=pytest.mark.postgres)]


@pytest.fixture(params=BACKENDS)
def store(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Store]:
    with temporary_store(request.param, tmp_path) as s:
        yield s


def _dump_database(store: Store) -> str:
    """Every row of every table (the alembic one too) as text."""
    parts = []
    with store.engine.connect() as conn:
        for table in [*metadata.sorted_tables]:
            parts += [repr(tuple(row)) for row in conn.execute(select(table))]
        parts += [repr(tuple(r)) for r in conn.execute(text("SELECT * FROM alembic_version"))]
    return "\n".join(parts)


def test_new_account_gets_signup_credits_in_the_ledger(store: Store) -> None:
    account = acc.create_account(store.engine, store.settings, plan="enterprise")
    assert account.prepaid_credits == store.settings.signup_credits == 100
    assert account.finder_enabled and not account.is_admin and account.email is None
    entries = ledger(store.engine, account.id)
    assert [(e.kind, e.source, e.delta, e.balance_after) for e in entries] == [
        ("signup", "prepaid", 100, 100)
    ]


def test_signup_credits_follow_settings(tmp_path: Path) -> None:
    with temporary_store("sqlite", tmp_path, signup_credits=0) as store:
        account = acc.create_account(store.engine, store.settings, plan="enterprise")
        assert account.prepaid_credits == 0
        assert ledger(store.engine, account.id) == []


def test_email_is_optional_but_unique(store: Store) -> None:
    acc.create_account(store.engine, store.settings)
    acc.create_account(store.engine, store.settings)  # two accounts without email
    a = acc.create_account(store.engine, store.settings, email="ops@example.com", is_admin=True)
    assert acc.get_account_by_email(store.engine, "ops@example.com") == a
    assert a.is_admin
    with pytest.raises(IntegrityError):
        acc.create_account(store.engine, store.settings, email="ops@example.com")
    assert len(acc.list_accounts(store.engine)) == 3


def test_raw_key_is_never_stored(store: Store) -> None:
    account = acc.create_account(store.engine, store.settings)
    raw_key, info = acc.create_api_key(store.engine, account.id, "ci")
    assert raw_key.startswith("vm_") and len(raw_key) >= 40
    assert raw_key.startswith(info.prefix) and len(info.prefix) == acc.DISPLAY_PREFIX_LENGTH
    assert acc.authenticate(store.engine, raw_key) == account  # exercise every write path

    dump = _dump_database(store)
    assert raw_key not in dump
    assert raw_key[len(info.prefix) :] not in dump  # nor the secret part alone
    assert acc.hash_key(raw_key) in dump  # the sanity check that the dump saw the key row
    assert "password_hash" not in repr(account)


def test_authenticate_rejects_unknown_and_malformed_keys(store: Store) -> None:
    account = acc.create_account(store.engine, store.settings)
    raw_key, _ = acc.create_api_key(store.engine, account.id, "x")
    assert (
        acc.authenticate(store.engine, raw_key[:-1] + ("A" if raw_key[-1] != "A" else "B")) is None
    )
    assert acc.authenticate(store.engine, "") is None
    assert acc.authenticate(store.engine, "Bearer " + raw_key) is None


def test_revoked_key_fails_at_once_and_only_for_its_owner(store: Store) -> None:
    owner = acc.create_account(store.engine, store.settings)
    other = acc.create_account(store.engine, store.settings)
    key1, info1 = acc.create_api_key(store.engine, owner.id, "one")
    key2, _ = acc.create_api_key(store.engine, owner.id, "two")
    assert acc.authenticate(store.engine, key1) is not None

    assert not acc.revoke_key(store.engine, other.id, info1.id)  # not theirs
    assert acc.authenticate(store.engine, key1) is not None
    assert acc.revoke_key(store.engine, owner.id, info1.id)
    assert acc.authenticate(store.engine, key1) is None
    assert acc.authenticate(store.engine, key2) == acc.get_account(store.engine, owner.id)
    assert not acc.revoke_key(store.engine, owner.id, info1.id)  # already revoked

    keys = acc.list_keys(store.engine, owner.id)
    assert [(k.name, k.active) for k in keys] == [("one", False), ("two", True)]
    assert [k.name for k in acc.list_keys(store.engine, owner.id, include_revoked=False)] == ["two"]


def test_last_used_is_written_at_most_once_a_minute(store: Store) -> None:
    account = acc.create_account(store.engine, store.settings)
    raw_key, info = acc.create_api_key(store.engine, account.id)
    assert info.last_used_at is None
    t0 = utcnow()

    def last_used() -> object:
        with store.engine.connect() as conn:
            return conn.execute(
                select(api_keys.c.last_used_at).where(api_keys.c.id == info.id)
            ).scalar_one()

    acc.authenticate(store.engine, raw_key, now=t0)
    assert last_used() == t0
    acc.authenticate(store.engine, raw_key, now=t0 + timedelta(seconds=30))
    assert last_used() == t0
    acc.authenticate(store.engine, raw_key, now=t0 + timedelta(seconds=61))
    assert last_used() == t0 + timedelta(seconds=61)


def test_create_key_for_missing_account_fails(store: Store) -> None:
    with pytest.raises(AccountNotFound):
        acc.create_api_key(store.engine, 999, "x")


def test_set_plan_and_finder(store: Store) -> None:
    account = acc.create_account(store.engine, store.settings, plan="free", finder_enabled=False)
    assert not account.finder_enabled
    updated = acc.set_finder(store.engine, account.id, True)
    assert updated is not None and updated.finder_enabled
    updated = acc.set_plan(store.engine, account.id, "business")
    assert updated is not None and updated.plan == "business"
    assert balance(store.engine, account.id).allowance == 50_000
    assert charge(store.engine, account.id, 100, reason="single", reference="r:1")
    acc.set_plan(store.engine, account.id, "business")  # the same plan again: no fresh allowance
    assert balance(store.engine, account.id).allowance_remaining == 49_900
    acc.set_plan(store.engine, account.id, "pro")  # a new plan starts its allowance afresh
    assert balance(store.engine, account.id).allowance_remaining == 10_000
    with pytest.raises(ValueError):
        acc.set_plan(store.engine, account.id, "platinum")
    assert acc.set_plan(store.engine, 999, "pro") is None
    assert acc.get_account(store.engine, 999) is None


def test_logging_one_session_out_many_times_at_once_is_one_record(store: Store) -> None:
    """Two tabs or a double click log one session out at once: on PostgreSQL the second
    select-then-insert hit the primary key (a 500 for that logout)."""
    until = utcnow() + timedelta(days=1)
    for round_ in range(5):
        sid = f"sid-{round_}"
        barrier = threading.Barrier(12)

        def logout(sid: str = sid, barrier: threading.Barrier = barrier) -> None:
            barrier.wait()
            end_session(store.engine, sid, until)

        with ThreadPoolExecutor(max_workers=12) as pool:
            for future in [pool.submit(logout) for _ in range(12)]:
                future.result()  # (raises what the thread raised)
        assert session_ended(store.engine, sid)
    with store.engine.connect() as conn:
        assert len(conn.execute(select(ended_sessions.c.sid_hash)).all()) == 5


def test_ended_sessions_are_kept_until_their_cookie_expires(store: Store) -> None:
    now = datetime(2026, 11, 23, 12, 0, tzinfo=UTC)
    end_session(store.engine, "sid-a", now + timedelta(days=14), now=now)
    end_session(store.engine, "sid-a", now + timedelta(days=14), now=now)  # twice: one record
    end_session(store.engine, "sid-b", now + timedelta(minutes=5), now=now)
    assert session_ended(store.engine, "sid-a") and session_ended(store.engine, "sid-b")
    assert not session_ended(store.engine, "sid-c")
    # A later logout forgets records whose cookies have expired by then.
    end_session(store.engine, "sid-c", now + timedelta(days=15), now=now + timedelta(hours=1))
    assert session_ended(store.engine, "sid-a") and not session_ended(store.engine, "sid-b")
    with store.engine.connect() as conn:
        stored = conn.execute(select(ended_sessions.c.sid_hash)).scalars().all()
    assert len(stored) == 2 and not any(h.startswith("sid") for h in stored)  # hashes only


@pytest.mark.parametrize("name", ["a\x00b", "two\nlines", "tab\there", "\x7f"])
def test_key_names_with_control_characters_are_refused_before_anything_is_written(
    store: Store, name: str
) -> None:
    """PostgreSQL refuses a NUL in text: the insert failed after the key was made (a 500 in
    the dashboard, the new key's hash in the error log). Every backend refuses the same."""
    account = acc.create_account(store.engine, store.settings, plan="free")
    before = acc.list_keys(store.engine, account.id)
    with pytest.raises(ValueError, match="control characters"):
        acc.create_api_key(store.engine, account.id, name)
    assert acc.list_keys(store.engine, account.id) == before
