"""The two pools of credits an account spends from, and its balance.

* the plan **allowance** (SPEC §8 "monthly credits"; Free: 25 a day) counts up in
  ``accounts.allowance_used`` for the UTC calendar period in ``allowance_period_start``; a
  new period starts it afresh (unused allowance lapses). It is spent *before* prepaid
  credits, so a customer's bought credits last as long as possible;
* **prepaid** credits (signup, grants, refunds of prepaid credits) in
  ``accounts.prepaid_credits``, which never expire (SPEC §1).

What moves credits between them is :mod:`verimail.store.billing.movements`; this module
reads an account row: which period it is in, what is left of each pool, and the lock every
movement takes first (:func:`lock_account`).
"""

from __future__ import annotations

import calendar
from dataclasses import dataclass
from datetime import UTC, date, datetime, time, timedelta
from typing import Any

from sqlalchemy import Connection, Engine, Row, select

from verimail.store.db import utcnow
from verimail.store.plans import Plan, get_plan
from verimail.store.tables import accounts


class AccountNotFound(LookupError):
    """Credits were moved for an account id that does not exist (a caller bug, not a 402)."""


@dataclass(frozen=True)
class Balance:
    """What an account can spend now; ``allowance`` is the plan's per-period amount (None: none)."""

    prepaid: int
    allowance_remaining: int
    total: int
    period_resets_at: datetime | None
    allowance: int | None = None


# --- periods -------------------------------------------------------------------------------


def period_start(plan: Plan, now: datetime) -> date:
    """First day (UTC) of the allowance period containing ``now``."""
    today = now.astimezone(UTC).date()
    return today if plan.period == "day" else today.replace(day=1)


def period_resets_at(plan: Plan, now: datetime) -> datetime:
    """When the allowance period containing ``now`` ends (UTC midnight)."""
    start = period_start(plan, now)
    if plan.period == "day":
        end = start + timedelta(days=1)
    else:
        end = start + timedelta(days=calendar.monthrange(start.year, start.month)[1])
    return datetime.combine(end, time(0), tzinfo=UTC)


@dataclass(frozen=True)
class Allowance:
    """The allowance of an account row as seen at one instant."""

    plan: Plan
    start: date | None  # current period's first day; None when the plan has no allowance
    used: int  # used in the current period (0 when the stored period is an old one)
    remaining: int
    new_period: bool  # stored counter belongs to an earlier period (or was never used)


def allowance_of(row: Row[Any], now: datetime) -> Allowance:
    """The allowance of the account ``row`` at ``now``."""
    plan = get_plan(row.plan)
    if not plan.allowance:
        return Allowance(plan, None, 0, 0, new_period=False)
    start = period_start(plan, now)
    stored = row.allowance_period_start
    if stored is not None and stored > start:
        # A process whose clock lags another's across a period boundary: periods only move
        # forward, or two skewed hosts could hand out the allowance twice.
        start = stored
    current = stored == start
    used = row.allowance_used if current else 0
    return Allowance(plan, start, used, max(plan.allowance - used, 0), new_period=not current)


def balance_of(row: Row[Any], now: datetime) -> Balance:
    """What the account ``row`` can spend at ``now``."""
    state = allowance_of(row, now)
    return Balance(
        prepaid=row.prepaid_credits,
        allowance_remaining=state.remaining,
        total=row.prepaid_credits + state.remaining,
        period_resets_at=period_resets_at(state.plan, now) if state.plan.allowance else None,
        allowance=state.plan.allowance,
    )


# --- the account row ---------------------------------------------------------------------------


def lock_account(conn: Connection, account_id: int) -> Row[Any]:
    """Lock and return the account row for the rest of the transaction (serialises movers)."""
    row = conn.execute(
        select(accounts).where(accounts.c.id == account_id).with_for_update(key_share=True)
    ).one_or_none()
    if row is None:
        raise AccountNotFound(f"no account {account_id}")
    return row


def balance(engine: Engine, account_id: int, *, now: datetime | None = None) -> Balance:
    """The account's spendable credits at ``now`` (default: the current time)."""
    with engine.connect() as conn:
        row = conn.execute(select(accounts).where(accounts.c.id == account_id)).one_or_none()
    if row is None:
        raise AccountNotFound(f"no account {account_id}")
    return balance_of(row, now or utcnow())


def short_balance(engine: Engine, account_id: int, amount: int) -> int | None:
    """The account's balance when it cannot pay ``amount``, None when it can: work that
    could pay for nothing (a finder lookup or job that cannot pay for one find) is refused
    before it starts, with nothing charged."""
    have = balance(engine, account_id).total
    return have if have < amount else None
