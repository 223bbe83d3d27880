"""Accounts and API keys.

API keys are ``vm_`` + 32 random bytes (``secrets.token_urlsafe``, 256 bits). Only their
SHA-256 is stored, plus a short display prefix. A fast unsalted hash is the right tool here,
unlike for passwords: salting and slow hashing (bcrypt, argon2) exist to stop dictionary and
brute-force guessing of *low-entropy* secrets, and nobody can enumerate 2**256 keys however
fast the hash. A fast, deterministic hash also lets every request find its key with one
indexed equality lookup instead of trying a slow hash against every stored key. Timing of
that lookup leaks nothing useful: an attacker cannot steer the hash of a guess.
"""

from __future__ import annotations

import hashlib
import secrets
import unicodedata
from dataclasses import dataclass, field
from datetime import date, datetime, timedelta
from typing import Any

from sqlalchemy import Engine, Row, func, insert, or_, select, update

from verimail.config import Settings
from verimail.store.billing.movements import credit_in
from verimail.store.billing.pools import AccountNotFound
from verimail.store.db import utcnow, write_tx
from verimail.store.plans import get_plan
from verimail.store.tables import accounts, api_keys

KEY_PREFIX = "vm_"
DISPLAY_PREFIX_LENGTH = 12
"""Characters of a key shown back to users (``vm_`` + 9 random characters ≈ 54 bits): enough
to tell keys apart, far too little to help guess the remaining ~200 bits."""

LAST_USED_RESOLUTION = timedelta(minutes=1)
"""``last_used_at`` is written at most this often per key, so authentication stays a read."""


@dataclass(frozen=True)
class Account:
    """An account row. ``password_hash`` is kept out of ``repr`` so it never lands in logs."""

    id: int
    email: str | None
    plan: str
    finder_enabled: bool
    is_admin: bool
    prepaid_credits: int
    allowance_used: int
    allowance_period_start: date | None
    created_at: datetime
    password_hash: str | None = field(default=None, repr=False)


@dataclass(frozen=True)
class ApiKeyInfo:
    """Everything about a key except the key itself (which is shown once, at creation)."""

    id: int
    account_id: int
    name: str
    prefix: str
    created_at: datetime
    last_used_at: datetime | None
    revoked_at: datetime | None

    @property
    def active(self) -> bool:
        """True until the key is revoked."""
        return self.revoked_at is None


def hash_key(raw_key: str) -> str:
    """Hex SHA-256 of a raw API key: what the database stores and looks up."""
    return hashlib.sha256(raw_key.encode("utf-8")).hexdigest()


def _account(row: Row[Any]) -> Account:
    m = row._mapping
    return Account(
        id=m["id"],
        email=m["email"],
        plan=m["plan"],
        finder_enabled=bool(m["finder_enabled"]),
        is_admin=bool(m["is_admin"]),
        prepaid_credits=m["prepaid_credits"],
        allowance_used=m["allowance_used"],
        allowance_period_start=m["allowance_period_start"],
        created_at=m["created_at"],
        password_hash=m["password_hash"],
    )


def _key_info(row: Row[Any]) -> ApiKeyInfo:
    m = row._mapping
    return ApiKeyInfo(
        id=m["id"],
        account_id=m["account_id"],
        name=m["name"],
        prefix=m["prefix"],
        created_at=m["created_at"],
        last_used_at=m["last_used_at"],
        revoked_at=m["revoked_at"],
    )


# --- accounts ----------------------------------------------------------------------------


def create_account(
    engine: Engine,
    settings: Settings,
    *,
    plan: str = "free",
    finder_enabled: bool = True,
    email: str | None = None,
    password_hash: str | None = None,
    is_admin: bool = False,
    now: datetime | None = None,
) -> Account:
    """Create an account with ``settings.signup_credits`` prepaid credits (one ledger row).

    The Email Finder is on by default (SPEC §1 describes it as a feature that *can be
    disabled* per account). Raises ``sqlalchemy.exc.IntegrityError`` for a taken email.
    """
    get_plan(plan)  # a clear error instead of a CHECK-constraint failure
    now = now or utcnow()
    with write_tx(engine) as conn:
        account_id = conn.execute(
            insert(accounts)
            .values(
                email=email,
                password_hash=password_hash,
                plan=plan,
                finder_enabled=finder_enabled,
                is_admin=is_admin,
                prepaid_credits=0,
                allowance_used=0,
                created_at=now,
            )
            .returning(accounts.c.id)
        ).scalar_one()
        if settings.signup_credits:
            credit_in(
                conn,
                account_id,
                settings.signup_credits,
                kind="signup",
                reason="signup credits",
                now=now,
            )
        row = conn.execute(select(accounts).where(accounts.c.id == account_id)).one()
    return _account(row)


def get_account(engine: Engine, account_id: int) -> Account | None:
    """The account, or None."""
    with engine.connect() as conn:
        row = conn.execute(select(accounts).where(accounts.c.id == account_id)).one_or_none()
    return _account(row) if row else None


def get_account_by_email(engine: Engine, email: str) -> Account | None:
    """The account registered with ``email`` (for the dashboard's sign-in), or None."""
    with engine.connect() as conn:
        row = conn.execute(select(accounts).where(accounts.c.email == email)).one_or_none()
    return _account(row) if row else None


def email_taken(engine: Engine, email: str) -> bool:
    """Whether an account has ``email`` in any letter case: accounts made with the CLI keep
    the address as typed (``Bob@Example.com``), and a sign-up of its lower-case form must
    not create a second account that the dashboard's sign-in would then find first."""
    query = select(accounts.c.id).where(func.lower(accounts.c.email) == email.lower()).limit(1)
    with engine.connect() as conn:
        return conn.execute(query).first() is not None


def list_accounts(engine: Engine, limit: int = 100, offset: int = 0) -> list[Account]:
    """Accounts in creation order (for operators)."""
    query = select(accounts).order_by(accounts.c.id).limit(limit).offset(offset)
    with engine.connect() as conn:
        return [_account(row) for row in conn.execute(query)]


def _update_account(engine: Engine, account_id: int, **values: Any) -> Account | None:
    with write_tx(engine) as conn:
        conn.execute(update(accounts).where(accounts.c.id == account_id).values(**values))
        row = conn.execute(select(accounts).where(accounts.c.id == account_id)).one_or_none()
    return _account(row) if row else None


def set_finder(engine: Engine, account_id: int, enabled: bool) -> Account | None:
    """Switch the Email Finder on or off (403 on the finder endpoints when off)."""
    return _update_account(engine, account_id, finder_enabled=enabled)


def set_plan(engine: Engine, account_id: int, plan: str) -> Account | None:
    """Move the account to ``plan``; the new plan's allowance starts afresh.

    Resetting the allowance counter keeps the rule simple and predictable (an upgrade
    gives the full new allowance now). Plans are changed by operators/billing, not by
    the customer, so this cannot be played by switching plans back and forth. Setting the
    plan an account already has changes nothing: a repeated command (or a billing sync
    that re-applies every plan) must not hand out the period's allowance again.
    """
    get_plan(plan)
    with write_tx(engine) as conn:
        conn.execute(
            update(accounts)
            .where(accounts.c.id == account_id, accounts.c.plan != plan)
            .values(plan=plan, allowance_used=0, allowance_period_start=None)
        )
        row = conn.execute(select(accounts).where(accounts.c.id == account_id)).one_or_none()
    return _account(row) if row else None


def set_password_hash(engine: Engine, account_id: int, password_hash: str | None) -> Account | None:
    """Set (or, with None, remove) the dashboard password hash; None for an unknown account.

    Dashboard sessions are bound to the hash, so changing it signs every browser out.
    """
    return _update_account(engine, account_id, password_hash=password_hash)


# --- API keys ----------------------------------------------------------------------------


KEY_NAME_MAX = 100  # (api_keys.name is a String(100))


def key_name_problem(name: str) -> str | None:
    """Why ``name`` cannot name a key (a sentence), or None. Control characters are refused:
    PostgreSQL refuses a NUL in text, which failed the insert after the key was made."""
    if not name.strip() or len(name) > KEY_NAME_MAX:
        return f"A key name is 1 to {KEY_NAME_MAX} characters."
    if any(unicodedata.category(char) == "Cc" for char in name):
        return "A key name may not hold control characters (line breaks, tabs, NUL)."
    return None


def create_api_key(
    engine: Engine, account_id: int, name: str = "default", *, now: datetime | None = None
) -> tuple[str, ApiKeyInfo]:
    """Issue a key: returns the raw key (show it once; it is not stored) and its info.
    ValueError (nothing written) for a name :func:`key_name_problem` refuses."""
    if problem := key_name_problem(name):
        raise ValueError(problem)
    raw_key = KEY_PREFIX + secrets.token_urlsafe(32)
    now = now or utcnow()
    with write_tx(engine) as conn:
        exists = conn.execute(
            select(accounts.c.id).where(accounts.c.id == account_id)
        ).one_or_none()
        if exists is None:
            raise AccountNotFound(f"no account {account_id}")
        row = conn.execute(
            insert(api_keys)
            .values(
                account_id=account_id,
                name=name,
                prefix=raw_key[:DISPLAY_PREFIX_LENGTH],
                key_hash=hash_key(raw_key),
                created_at=now,
            )
            .returning(*api_keys.c)
        ).one()
    return raw_key, _key_info(row)


def authenticate(engine: Engine, raw_key: str, *, now: datetime | None = None) -> Account | None:
    """The account owning an active key, or None (missing, unknown or revoked: a 401).

    One indexed read per request; ``last_used_at`` is written only when it is more than
    :data:`LAST_USED_RESOLUTION` old, so busy keys do not turn every request into a write.
    """
    if not raw_key or not raw_key.startswith(KEY_PREFIX):
        return None
    now = now or utcnow()
    query = (
        select(accounts, api_keys.c.id.label("key_id"), api_keys.c.last_used_at)
        .join(api_keys, api_keys.c.account_id == accounts.c.id)
        .where(api_keys.c.key_hash == hash_key(raw_key), api_keys.c.revoked_at.is_(None))
    )
    with engine.connect() as conn:
        row = conn.execute(query).one_or_none()
    if row is None:
        return None
    cutoff = now - LAST_USED_RESOLUTION
    if row.last_used_at is None or row.last_used_at < cutoff:
        with write_tx(engine) as conn:
            conn.execute(
                update(api_keys)
                .where(
                    api_keys.c.id == row.key_id,
                    or_(api_keys.c.last_used_at.is_(None), api_keys.c.last_used_at < cutoff),
                )
                .values(last_used_at=now)
            )
    return _account(row)


def list_keys(engine: Engine, account_id: int, include_revoked: bool = True) -> list[ApiKeyInfo]:
    """The account's keys (prefixes only), oldest first."""
    query = select(api_keys).where(api_keys.c.account_id == account_id).order_by(api_keys.c.id)
    if not include_revoked:
        query = query.where(api_keys.c.revoked_at.is_(None))
    with engine.connect() as conn:
        return [_key_info(row) for row in conn.execute(query)]


def revoke_key(
    engine: Engine, account_id: int, key_id: int, *, now: datetime | None = None
) -> bool:
    """Revoke one of the account's keys; effective for the very next request.

    False when the key does not exist, belongs to another account, or was already revoked.
    """
    with write_tx(engine) as conn:
        result = conn.execute(
            update(api_keys)
            .where(
                api_keys.c.id == key_id,
                api_keys.c.account_id == account_id,
                api_keys.c.revoked_at.is_(None),
            )
            .values(revoked_at=now or utcnow())
        )
    return result.rowcount == 1
