"""``/dashboard/verify``: try one address, charged 1 credit through the same code as
``POST /api/verify/single`` (:func:`~verimail.api.billing.charged`, under the plan's limits).
"""

from __future__ import annotations

from typing import Any

from anyio import to_thread
from fastapi import APIRouter, Request
from fastapi.responses import Response
from sqlalchemy.exc import SQLAlchemyError

from verimail.api.billing import charged
from verimail.api.dashboard.web import (
    PREFIX,
    CheckedForm,
    CurrentAccount,
    DashboardRoute,
    StoreDep,
    log,
    plan_limits,
    render,
    text_field,
)
from verimail.api.deps import EngineDep
from verimail.api.errors import ApiError
from verimail.engine import urgent
from verimail.schemas.api import VerifyResult
from verimail.schemas.limits import MAX_EMAIL_LENGTH
from verimail.store.billing import balance, quote

router = APIRouter(prefix=PREFIX, route_class=DashboardRoute, include_in_schema=False)


@router.get("/verify")
async def verify_form(request: Request, account: CurrentAccount) -> Response:
    return render(request, "verify.html", {"email": ""}, account=account)


@router.post("/verify")
async def verify_one(
    request: Request,
    account: CurrentAccount,
    store: StoreDep,
    engine: EngineDep,
    form: CheckedForm,
) -> Response:
    """One address, charged 1 credit exactly like ``POST /api/verify/single``."""
    email = text_field(form, "email", 4096).strip()
    context: dict[str, Any] = {"email": email}
    if not email or len(email) > MAX_EMAIL_LENGTH:
        context["error"] = f"Enter an address of 1 to {MAX_EMAIL_LENGTH} characters."
        return render(request, "verify.html", context, account=account, status_code=422)
    try:
        async with (
            plan_limits(request, account),
            charged(store, account.id, quote("verify", 1), reason="verify single (dashboard)"),
        ):
            with urgent():
                context["result"] = VerifyResult.of(await engine.verify(email))
    except ApiError as exc:
        if exc.status_code not in (402, 429):
            raise
        context["error"] = exc.detail
        return render(
            request,
            "verify.html",
            context,
            account=account,
            status_code=exc.status_code,
            headers=exc.headers,
        )
    try:
        context["balance"] = await to_thread.run_sync(balance, store.engine, account.id)
    except SQLAlchemyError as exc:  # charged and done: show the result, not "nothing charged"
        log.warning("balance unavailable after a dashboard verification: %s", exc)
    return render(request, "verify.html", context, account=account)
