"""``GET /api/account/usage`` and ``GET /api/account/ledger``: credits over time and every
movement of them, for scripts — what the dashboard's overview chart and credits page show.

Both read the ledger through ``store/billing/ledger.py``: the usage is the chart's own
figure (``daily_spending``), so the API and the dashboard cannot disagree.
"""

from __future__ import annotations

from datetime import date, timedelta
from typing import Annotated, Any, Literal

from anyio import to_thread
from fastapi import APIRouter, Query

from verimail.api.cursors import decode_cursor, encode_cursor
from verimail.api.deps import AccountDep, StoreDep
from verimail.api.errors import ApiError, pick_error_docs
from verimail.schemas.account import LedgerPage, LedgerRow, Usage, UsageDay
from verimail.schemas.errors import ValidationErrorBody
from verimail.schemas.limits import MAX_PAGE, MAX_USAGE_DAYS
from verimail.schemas.query_times import QueryDate
from verimail.store.billing import daily_spending, ledger_page
from verimail.store.db import utcnow

router = APIRouter(tags=["account"])

DEFAULT_USAGE_DAYS = 30
"""The range without ``from``: the last 30 days, as the dashboard's chart."""


def _invalid(description: str) -> dict[int | str, dict[str, Any]]:
    return {422: {"model": ValidationErrorBody, "description": description}}


@router.get(
    "/api/account/usage",
    response_model=Usage,
    summary="Credits spent per day",
    description="Credits spent on each UTC day from `from` to `to` (both included; dates "
    "as `YYYY-MM-DD`): charges and job reservations less refunds, the figure the "
    f"dashboard's chart draws. Without `to`: today; without `from`: {DEFAULT_USAGE_DAYS} "
    f"days up to `to`. At most {MAX_USAGE_DAYS} days per request. Costs no credit.",
    responses=pick_error_docs(
        _invalid(
            f"A bad range: a date that is not `YYYY-MM-DD`, `from` after `to`, a range over "
            f"{MAX_USAGE_DAYS} days, or a `granularity` other than `day`."
        ),
        (422,),
    ),
)
async def get_usage(
    account: AccountDep,
    store: StoreDep,
    from_: Annotated[
        QueryDate | None, Query(alias="from", description="First day (UTC), `YYYY-MM-DD`.")
    ] = None,
    to: Annotated[QueryDate | None, Query(description="Last day (UTC), included.")] = None,
    granularity: Annotated[
        Literal["day"], Query(description="`day`: one entry per day (the only one).")
    ] = "day",
) -> Usage:
    last = to or utcnow().date()
    first = from_ or _days_before(last, DEFAULT_USAGE_DAYS - 1)
    if first > last:
        raise ApiError(422, f"from ({first}) is after to ({last}); give from <= to.")
    days = (last - first).days + 1
    if days > MAX_USAGE_DAYS:
        raise ApiError(
            422,
            f"from {first} to {last} is {days} days; ask for at most {MAX_USAGE_DAYS} "
            "days at a time.",
        )
    spent = await to_thread.run_sync(
        lambda: daily_spending(store.engine, account.id, days, today=last)
    )
    return Usage(
        from_=first,
        to=last,
        granularity=granularity,
        total_spent=sum(spent),
        days=[UsageDay(date=first + timedelta(i), credits_spent=n) for i, n in enumerate(spent)],
    )


def _days_before(day: date, days: int) -> date:
    """``day`` less ``days`` days, or the first date there is."""
    try:
        return day - timedelta(days)
    except OverflowError:
        return date.min


@router.get(
    "/api/account/ledger",
    response_model=LedgerPage,
    summary="Your credit ledger, newest first",
    description="Every movement of the account's credits (grants, charges, job "
    "reservations, refunds, allowance periods), newest first, a page at a time: pass the "
    "answer's `next_cursor` as `cursor` for the next page, until it is null. A job's rows "
    "name it (`reference` `job:<id>`). Costs no credit.",
    responses=pick_error_docs(
        _invalid(f"`limit` outside 1 to {MAX_PAGE}, or a `cursor` this list did not give."),
        (422,),
    ),
)
async def get_ledger(
    account: AccountDep,
    store: StoreDep,
    limit: Annotated[
        int, Query(ge=1, le=MAX_PAGE, description=f"Rows per page, 1 to {MAX_PAGE}.")
    ] = 20,
    cursor: Annotated[
        str | None,
        Query(max_length=200, description="The `next_cursor` of the previous page."),
    ] = None,
) -> LedgerPage:
    before = decode_cursor("l", cursor)
    rows, last = await to_thread.run_sync(
        lambda: ledger_page(store.engine, account.id, limit=limit, before_id=before)
    )
    return LedgerPage(
        entries=[
            LedgerRow(**{name: getattr(row, name) for name in LedgerRow.model_fields})
            for row in rows
        ],
        next_cursor=encode_cursor("l", last),
    )
