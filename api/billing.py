"""The API's wording of a request's charge: 402 when short, refunded when the work fails.

The rule — charge all or nothing before the work, under a reference of the request's own,
and give it back if the work fails — is billing's (``store/billing/requests.py``); this
module runs it around a request's work and answers in HTTP.

A failure after the charge must give the credits back; :func:`charged` does that for *any*
exception in its body (and for a cancelled request: a server stopping; uvicorn does not
cancel a request whose client hangs up, so that work is finished and charged), so the 500
handler's "nothing was charged" is always true. Build the response inside the ``async
with`` block, so nothing that can fail runs after the charge is kept.
"""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import anyio
from anyio import to_thread

from verimail.api.errors import ApiError
from verimail.store.billing import balance, charge_request, refund_request
from verimail.store.db import Store

log = logging.getLogger("verimail.api.billing")


def _credits(n: int) -> str:
    return f"{n} credit" if n == 1 else f"{n} credits"


@asynccontextmanager
async def charged(
    store: Store, account_id: int, amount: int, *, reason: str
) -> AsyncIterator[None]:
    """Charge ``amount`` now (402 when short, nothing written); refund it if the body fails."""
    reference = await to_thread.run_sync(
        lambda: charge_request(store.engine, account_id, amount, reason=reason)
    )
    if reference is None:
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
                    lambda: refund_request(
                        store.engine, account_id, amount, reason=reason, reference=reference
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
