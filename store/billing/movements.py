"""Moving credits: charges, reservations, refunds and grants, each with its ledger rows.

Every movement is one transaction that locks the account row first — ``SELECT … FOR NO KEY
UPDATE`` on PostgreSQL (blocks other chargers, not inserts referencing the account),
``BEGIN IMMEDIATE`` on SQLite (see :mod:`verimail.store.db`) — then checks, updates the
account and appends ledger rows. So concurrent charges from any number of API processes and
workers serialise per account and can never overdraw; a CHECK constraint
(``prepaid_credits >= 0``) and a guarded UPDATE back that up.

A charge spends the allowance before prepaid credits (the pools:
:mod:`verimail.store.billing.pools`). A refund gives allowance back to the allowance when it
was spent in the current period, and everything else to prepaid credits (:func:`refund_in`).

Ledger rows carry ``source`` (the pool that moved) and ``balance_after``, that pool's
balance right after the row — so each pool reads as its own running balance. The first
charge of a new period writes a ``kind="allowance"`` row (+allowance) opening the period,
so the ledger explains why the allowance is full again on the 1st; unused allowance of the
previous period lapses silently, and a period nobody charges in leaves no row.

The ``*_in`` functions run inside a caller's transaction (opened with
:func:`verimail.store.db.write_tx`) so jobs can create a row and reserve credits atomically.
"""

from __future__ import annotations

from dataclasses import replace
from datetime import datetime
from typing import Any, Literal

from sqlalchemy import Connection, Engine, func, insert, select, update

from verimail.schemas.limits import MAX_INT
from verimail.store.billing.ledger import net_charged_in
from verimail.store.billing.pools import (
    Allowance,
    Balance,
    allowance_of,
    balance_of,
    lock_account,
)
from verimail.store.db import utcnow, write_tx
from verimail.store.tables import accounts, credit_ledger

ChargeKind = Literal["charge", "reserve"]


# --- inside a caller's transaction ------------------------------------------------------------


def _ledger_row(
    conn: Connection,
    account_id: int,
    *,
    delta: int,
    kind: str,
    source: str,
    reason: str,
    reference: str | None,
    balance_after: int,
    now: datetime,
) -> None:
    conn.execute(
        insert(credit_ledger).values(
            account_id=account_id,
            delta=delta,
            kind=kind,
            source=source,
            reason=reason,
            reference=reference,
            balance_after=balance_after,
            created_at=now,
        )
    )


def charge_in(
    conn: Connection,
    account_id: int,
    amount: int,
    *,
    kind: ChargeKind = "charge",
    reason: str = "",
    reference: str | None = None,
    now: datetime | None = None,
) -> bool:
    """Spend ``amount`` (allowance first, then prepaid) inside ``conn``'s transaction.

    All or nothing: returns False and writes nothing when the account has too little.
    The caller's transaction must have been opened with ``write_tx``.
    """
    if amount < 0:
        raise ValueError("amount must be >= 0")
    if kind not in ("charge", "reserve"):
        raise ValueError(f"kind must be 'charge' or 'reserve', not {kind!r}")
    now = now or utcnow()
    row = lock_account(conn, account_id)
    if amount == 0:
        return True
    state = allowance_of(row, now)
    prepaid = row.prepaid_credits
    if prepaid + state.remaining < amount:
        return False

    from_allowance = min(amount, state.remaining)
    from_prepaid = amount - from_allowance

    values: dict[str, Any] = {}
    if from_allowance:
        if state.new_period:
            if state.start is None or state.plan.allowance is None:  # pragma: no cover
                raise RuntimeError("allowance period without an allowance")
            _ledger_row(
                conn,
                account_id,
                delta=state.plan.allowance,
                kind="allowance",
                source="allowance",
                reason=f"{state.plan.name} plan allowance for the {state.plan.period} "
                f"starting {state.start.isoformat()}",
                reference=f"period:{state.start.isoformat()}",
                balance_after=state.plan.allowance,
                now=now,
            )
        _ledger_row(
            conn,
            account_id,
            delta=-from_allowance,
            kind=kind,
            source="allowance",
            reason=reason,
            reference=reference,
            balance_after=state.remaining - from_allowance,
            now=now,
        )
        values["allowance_used"] = state.used + from_allowance
        values["allowance_period_start"] = state.start
    if from_prepaid:
        _ledger_row(
            conn,
            account_id,
            delta=-from_prepaid,
            kind=kind,
            source="prepaid",
            reason=reason,
            reference=reference,
            balance_after=prepaid - from_prepaid,
            now=now,
        )
        values["prepaid_credits"] = accounts.c.prepaid_credits - from_prepaid

    result = conn.execute(
        update(accounts)
        .where(accounts.c.id == account_id, accounts.c.prepaid_credits >= from_prepaid)
        .values(**values)
    )
    if result.rowcount != 1:  # cannot happen while the row is locked; never overdraw anyway
        raise RuntimeError(f"account {account_id} changed under its lock")
    return True


def credit_in(
    conn: Connection,
    account_id: int,
    amount: int,
    *,
    kind: Literal["signup", "grant"],
    reason: str = "",
    reference: str | None = None,
    now: datetime | None = None,
) -> Balance:
    """Add ``amount`` prepaid credits inside ``conn``'s transaction; returns the new balance.
    (Refunds go through :func:`refund_in`, which gives allowance back to the allowance.)"""
    if kind not in ("signup", "grant"):
        raise ValueError(f"kind must be signup or grant, not {kind!r}")
    return _add_prepaid(conn, account_id, amount, kind, reason, reference, now or utcnow())


def _add_prepaid(
    conn: Connection,
    account_id: int,
    amount: int,
    kind: str,
    reason: str,
    reference: str | None,
    now: datetime,
) -> Balance:
    if amount < 0:
        raise ValueError("amount must be >= 0")
    old = balance_of(lock_account(conn, account_id), now)
    if amount == 0:
        return old
    if old.prepaid + amount > MAX_INT:  # (PostgreSQL would refuse it; SQLite would not)
        raise ValueError(
            f"the prepaid balance would pass {MAX_INT:,}, the most an account can hold "
            f"(it is {old.prepaid:,})"
        )
    conn.execute(
        update(accounts)
        .where(accounts.c.id == account_id)
        .values(prepaid_credits=accounts.c.prepaid_credits + amount)
    )
    new = replace(old, prepaid=old.prepaid + amount, total=old.total + amount)
    _ledger_row(
        conn,
        account_id,
        delta=amount,
        kind=kind,
        source="prepaid",
        reason=reason,
        reference=reference,
        balance_after=new.prepaid,
        now=now,
    )
    return new


def refund_in(
    conn: Connection,
    account_id: int,
    amount: int,
    *,
    reason: str,
    reference: str | None,
    now: datetime | None = None,
) -> Balance:
    """Give back ``amount`` credits charged or reserved under ``reference``, inside
    ``conn``'s transaction; returns the new balance.

    What the allowance paid under ``reference`` in the current period goes back to the
    allowance; the rest (prepaid credits, or allowance of a period that has ended) goes to
    prepaid credits, which never expire, so no refund is lost when a period rolls over.
    Refunding allowance as prepaid would let anyone who can make work fail (a client that
    hangs up mid-request) turn each day's lapsing allowance into credits that never lapse.
    """
    if amount < 0:
        raise ValueError("amount must be >= 0")
    now = now or utcnow()
    row = lock_account(conn, account_id)
    state = allowance_of(row, now)
    back = min(amount, _allowance_paid(conn, account_id, state, reference))
    if back:
        conn.execute(
            update(accounts)
            .where(accounts.c.id == account_id)
            .values(allowance_used=state.used - back)
        )
        _ledger_row(
            conn,
            account_id,
            delta=back,
            kind="refund",
            source="allowance",
            reason=reason,
            reference=reference,
            balance_after=state.remaining + back,
            now=now,
        )
    return _add_prepaid(conn, account_id, amount - back, "refund", reason, reference, now)


def _allowance_paid(
    conn: Connection, account_id: int, state: Allowance, reference: str | None
) -> int:
    """Allowance spent under ``reference`` in the current period and not given back yet
    (at most what the period's counter holds: an operator's plan change resets it)."""
    if reference is None or state.new_period or state.start is None or not state.used:
        return 0
    ledger = credit_ledger.c
    opened = conn.execute(  # the row that opened the current period's counter
        select(func.max(ledger.id)).where(
            ledger.account_id == account_id,
            ledger.kind == "allowance",
            ledger.reference == f"period:{state.start.isoformat()}",
        )
    ).scalar_one()
    if opened is None:
        return 0
    net = conn.execute(
        select(func.coalesce(func.sum(ledger.delta), 0)).where(
            ledger.account_id == account_id,
            ledger.reference == reference,
            ledger.source == "allowance",
            ledger.kind.in_(("charge", "reserve", "refund")),
            ledger.id > opened,
        )
    ).scalar_one()
    return max(0, min(-int(net), state.used))


# --- one transaction each ---------------------------------------------------------------------


def charge(
    engine: Engine,
    account_id: int,
    amount: int,
    *,
    kind: ChargeKind = "charge",
    reason: str = "",
    reference: str | None = None,
    now: datetime | None = None,
) -> bool:
    """Spend ``amount`` credits atomically; False (and nothing written) when short — a 402."""
    if amount == 0:
        return True
    with write_tx(engine) as conn:
        return charge_in(
            conn, account_id, amount, kind=kind, reason=reason, reference=reference, now=now
        )


ChargeOutcome = Literal["charged", "already", "short"]


def charge_once(
    engine: Engine,
    account_id: int,
    amount: int,
    *,
    reference: str,
    reason: str = "",
    now: datetime | None = None,
) -> ChargeOutcome:
    """:func:`charge`, at most once per ``reference``: "already" (nothing written) when the
    account has a charge under it that :func:`refund_once` has not given back. For work that
    may run again — a finder job resumed after its runner died finds the rows it already
    paid for once more.

    The check and the charge share the account lock, so two runs cannot both pay."""
    if amount == 0:
        return "charged"
    with write_tx(engine) as conn:
        return charge_once_in(conn, account_id, amount, reference=reference, reason=reason, now=now)


def charge_once_in(
    conn: Connection,
    account_id: int,
    amount: int,
    *,
    reference: str,
    reason: str = "",
    now: datetime | None = None,
) -> ChargeOutcome:
    """:func:`charge_once` inside the caller's transaction (which may hold other locks)."""
    if amount == 0:
        return "charged"
    lock_account(conn, account_id)
    if net_charged_in(conn, account_id, reference) > 0:
        return "already"
    ok = charge_in(conn, account_id, amount, reason=reason, reference=reference, now=now)
    return "charged" if ok else "short"


def refund_once(
    engine: Engine,
    account_id: int,
    *,
    reference: str,
    reason: str,
    now: datetime | None = None,
) -> int:
    """Give back what is charged under ``reference`` and not refunded yet; returns the
    credits given back (0 when there is nothing to give). For a charge that a later run of
    the same work found it should not have made: a resumed finder job that no longer finds
    the address an earlier run paid for."""
    with write_tx(engine) as conn:
        return refund_once_in(conn, account_id, reference=reference, reason=reason, now=now)


def refund_once_in(
    conn: Connection,
    account_id: int,
    *,
    reference: str,
    reason: str,
    now: datetime | None = None,
) -> int:
    """:func:`refund_once` inside the caller's transaction."""
    lock_account(conn, account_id)
    owed = net_charged_in(conn, account_id, reference)
    if owed > 0:
        refund_in(conn, account_id, owed, reason=reason, reference=reference, now=now)
    return max(owed, 0)


def reserve(
    engine: Engine,
    account_id: int,
    amount: int,
    *,
    reason: str = "",
    reference: str | None = None,
    now: datetime | None = None,
) -> bool:
    """Set credits aside for work that will run later (bulk jobs); a charge of kind reserve."""
    return charge(
        engine, account_id, amount, kind="reserve", reason=reason, reference=reference, now=now
    )


def refund(
    engine: Engine,
    account_id: int,
    amount: int,
    *,
    reason: str,
    reference: str | None = None,
    now: datetime | None = None,
) -> Balance:
    """Give back credits that were charged or reserved under ``reference`` but not used
    (see :func:`refund_in` for which pool they return to)."""
    with write_tx(engine) as conn:
        return refund_in(conn, account_id, amount, reason=reason, reference=reference, now=now)


def grant(
    engine: Engine,
    account_id: int,
    amount: int,
    *,
    reason: str = "",
    reference: str | None = None,
    now: datetime | None = None,
) -> Balance:
    """Add prepaid credits (purchases, operator grants, Enterprise's custom allowance)."""
    if amount <= 0:
        raise ValueError("grant amount must be > 0")
    with write_tx(engine) as conn:
        return credit_in(
            conn, account_id, amount, kind="grant", reason=reason, reference=reference, now=now
        )
