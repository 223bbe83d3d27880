"""``POST /api/verify/single`` and ``POST /api/verify/batch``: the engine, called directly.

Both are synchronous: the engine answers by the body's ``timeout`` (what is unsettled then
is ``unknown``/``timeout``) and never waits out greylisting (``unknown``/``greylisted``
with ``retry_after`` at once); deferred retries are for jobs (docs/greylisting.md).

Both charge first (all or nothing, 402 when short) and verify inside
:func:`verimail.api.billing.charged`, which refunds if verifying fails. Results are built
inside that block too, so nothing that can fail runs after a charge is kept.
"""

from __future__ import annotations

from collections import Counter

from fastapi import APIRouter

from verimail.api.billing import charged
from verimail.api.deps import AccountDep, EngineDep, StoreDep
from verimail.api.errors import AUTH_ERRORS, COMMON_ERRORS, error_doc
from verimail.engine import urgent
from verimail.schemas.api import (
    MAX_BATCH,
    BatchRequest,
    BatchResponse,
    BatchSummary,
    SingleRequest,
    VerifyResult,
)
from verimail.schemas.errors import ValidationErrorBody
from verimail.schemas.outcomes import Status
from verimail.store.billing import quote

router = APIRouter(tags=["verification"])


def _errors(credits_402: str) -> dict[int | str, dict]:
    """The documented error responses of a charging endpoint, by status."""
    errors: dict[int | str, dict] = {
        **AUTH_ERRORS,
        402: error_doc(credits_402),
        422: {
            "model": ValidationErrorBody,
            "description": "The body is not JSON, or a field is missing, of the wrong type "
            "or out of bounds. A malformed address is *not* a 422: it is verified and "
            "reported `invalid`.",
        },
        **COMMON_ERRORS,
    }
    return dict(sorted(errors.items(), key=lambda item: str(item[0])))


@router.post(
    "/api/verify/single",
    response_model=VerifyResult,
    summary="Verify one address",
    description="Syntax, DNS/MX, SMTP and catch-all checks for one address. Costs 1 credit, "
    "charged before verifying and refunded if the verification fails on our side.",
    responses=_errors("Not enough credits (1 needed); nothing was charged."),
)
async def verify_single(
    body: SingleRequest, account: AccountDep, store: StoreDep, engine: EngineDep
) -> VerifyResult:
    async with charged(store, account.id, quote("verify", 1), reason="verify single"):
        with urgent():
            timeout = body.timeout or engine.settings.verify_timeout
            result = await engine.verify(body.email, timeout=timeout, greylist_retries=0)
            return VerifyResult.of(result)


@router.post(
    "/api/verify/batch",
    response_model=BatchResponse,
    summary="Verify up to 500 addresses",
    description=f"Verifies 1 to {MAX_BATCH} addresses in one request, grouped by mail "
    "server. Costs 1 credit per submitted address (duplicates included; each distinct "
    "address is verified once), charged all at once before verifying: when the balance is "
    "short the request is refused with 402 and nothing is charged or verified.",
    responses=_errors("Not enough credits for every submitted address; nothing was charged."),
)
async def verify_batch(
    body: BatchRequest, account: AccountDep, store: StoreDep, engine: EngineDep
) -> BatchResponse:
    n = len(body.emails)
    async with charged(store, account.id, quote("verify", n), reason=f"verify batch of {n}"):
        with urgent():
            timeout = body.timeout or engine.settings.verify_timeout
            outcome = await engine.verify_many(body.emails, timeout=timeout, greylist_retries=0)
        results = [VerifyResult.of(r) for r in outcome.results]
        counts = Counter(r.status for r in results)
        return BatchResponse(
            results=results,
            credits_used=n,
            summary=BatchSummary(**{s.value: counts.get(s, 0) for s in Status}),
        )
