"""``GET /api/account``: the key's account — balance, plan, limits, Email Finder.

What the dashboard's overview and plan pages show, for API clients: a script checks the
balance before uploading a list instead of learning it from a 402. Reading it counts
against the plan's request rate like any other call (it is cheap, but not free to hammer).
"""

from __future__ import annotations

from anyio import to_thread
from fastapi import APIRouter, Request

from verimail.api.deps import AccountDep, StoreDep
from verimail.api.errors import pick_error_docs
from verimail.schemas.account import UPGRADE_HELP, AccountBalance, AccountInfo, AccountLimits
from verimail.schemas.limits import MAX_BATCH, MAX_JSON_BULK
from verimail.store.billing import balance, quote
from verimail.store.plans import get_plan

router = APIRouter(tags=["account"])


@router.get(
    "/api/account",
    response_model=AccountInfo,
    summary="Your balance, plan and limits",
    description="The account of the API key: credits available (prepaid and the plan's "
    "allowance), the plan and its limits, and whether the Email Finder is enabled. Costs "
    "no credit.",
    responses=pick_error_docs({}, ()),
)
async def get_account(request: Request, account: AccountDep, store: StoreDep) -> AccountInfo:
    settings = request.app.state.settings
    bal = await to_thread.run_sync(balance, store.engine, account.id)
    plan = get_plan(account.plan)
    return AccountInfo(
        account_id=account.id,
        email=account.email,
        plan=plan.name,  # type: ignore[arg-type]
        balance=AccountBalance(
            total=bal.total,
            prepaid=bal.prepaid,
            allowance=bal.allowance,
            allowance_remaining=bal.allowance_remaining,
            allowance_resets_at=bal.period_resets_at,
        ),
        limits=AccountLimits(
            requests_per_minute=plan.requests_per_minute,
            concurrent_requests=plan.concurrent,
            batch_max_emails=MAX_BATCH,
            json_bulk_max_emails=MAX_JSON_BULK,
            upload_max_bytes=settings.upload_max_bytes,
            upload_max_rows=settings.upload_max_rows,
        ),
        finder_enabled=account.finder_enabled,
        finder_credits_per_find=quote("find", 1, settings),
        upgrade=UPGRADE_HELP,
    )
