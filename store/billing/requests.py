"""A synchronous request's charge: paid before the work, given back if the work fails.

Charging *before* the work is what makes concurrent requests safe: the charge is one
transaction that locks the account, so 50 simultaneous requests on 20 credits give exactly
20 charges and 30 refusals, whatever the number of API processes. Working first and
charging after would let all 50 work and then overdraw or silently give work away.

Each request is charged under a reference of its own, so its refund gives back to the pool
that paid (the allowance when it did, see
:func:`~verimail.store.billing.movements.refund_in`): a client that hangs up mid-request
gets no more than it paid. ``api/billing.py`` words this as HTTP (402) around the work.
"""

from __future__ import annotations

import uuid

from sqlalchemy import Engine

from verimail.store.billing.movements import charge, refund
from verimail.store.billing.pools import Balance


def charge_request(engine: Engine, account_id: int, amount: int, *, reason: str) -> str | None:
    """Charge ``amount`` for one request; the reference to refund it under, or None (and
    nothing written) when the account is short."""
    reference = f"request:{uuid.uuid4().hex}"
    ok = charge(engine, account_id, amount, reason=reason, reference=reference)
    return reference if ok else None


def refund_request(
    engine: Engine, account_id: int, amount: int, *, reason: str, reference: str
) -> Balance:
    """Give back the charge of a request whose work failed (``reason``: the charge's)."""
    return refund(
        engine, account_id, amount, reason=f"refund: {reason} failed", reference=reference
    )
