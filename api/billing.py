"""Charging for work: all-or-nothing before the work, refunded when the work fails.

Charging *before* verifying is what makes concurrent requests safe: the store's charge is
one transaction that locks the account, so 50 simultaneous requests on 20 credits give
exactly 20 charges and 30 refusals, whatever the number of API processes. Verifying first
and charging after would let all 50 verify and then overdraw or silently give work away.

The price of charging first is that a failure afterwards must give the credits back;
:func:`charged` does that for *any* exception in its body (and for a cancelled request:
a server stopping; uvicorn does not cancel a request whose client hangs up, so that work is
finished and charged), so the 500 handler's "nothing was charged" is always true. Build
the response inside the ``async with`` block, so nothing that can fail runs after the
charge is kept.
"""

from __future__ import annotations

import logging
import uuid
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import anyio
from anyio import to_thread

from verimail.api.errors import ApiError
from verimail.store.credits import balance, charge, refund
from verimail.store.db import Store

log = logging.getLogger("verimail.api.billing")


def _credits(n: int) -> str:
    return f"{n} credit" if n == 1 else f"{n} credits"


@asynccontextmanager
async def charged(
    store: Store, account_id: int, amount: int, *, reason: str
) -> AsyncIterator[None]:
    """Charge ``amount`` now (402 when short, nothing written); refund it if the body fails."""
    # A reference of its own, so a refund gives back to the pool that paid (the allowance
    # when it did, see refund_in): a client that hangs up mid-request gets no more.
    reference = f"request:{uuid.uuid4().hex}"
    ok = await to_thread.run_sync(
        lambda: charge(store.engine, account_id, amount, reason=reason, reference=reference)
    )
    if not ok:
        have = await to_thread.run_sync(lambda: balance(store.engine, account_id).total)
        raise ApiError(
            402,
            f"Not enough credits: this request needs {amount}, the balance is {have}.",
        )
    try:
        yield
    except BaseException:
        # Shielded: a cancelled request (a server stopping) still gets its refund.
        with anyio.CancelScope(shield=True):
            try:
                await to_thread.run_sync(
                    lambda: refund(
                        store.engine,
                        account_id,
                        amount,
                        reason=f"refund: {reason} failed",
                        reference=reference,
                    )
                )
            except Exception:
                log.exception(
                    "REFUND FAILED: account %s is owed %s (%s)",
                    account_id,
                    _credits(amount),
                    reason,
                )
        raise
