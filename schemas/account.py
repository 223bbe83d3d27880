"""``GET /api/account``'s answer: the key's account — balance by pool, plan, limits, Email
Finder — every field described for OpenAPI."""

from __future__ import annotations

from datetime import date as date_type
from datetime import datetime
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

UPGRADE_HELP = (
    "Plans and credits are changed by the service's operators (`verimail accounts set --account N "
    "--plan P`, `verimail credits grant --account N AMOUNT`): ask them, quoting your account id."
)


class AccountBalance(BaseModel):
    """Credits the account can spend now: the plan's allowance first, then prepaid ones."""

    total: int = Field(description="Credits available now: `prepaid` + `allowance_remaining`.")
    prepaid: int = Field(
        description="Prepaid credits (sign-up, grants, refunds); they never expire."
    )
    allowance: int | None = Field(
        description="The plan's allowance per period; null when the plan has none (Enterprise)."
    )
    allowance_remaining: int = Field(description="Allowance left in the current period.")
    allowance_resets_at: datetime | None = Field(
        description="When the allowance renews (UTC; unused allowance lapses); null without one."
    )


class AccountLimits(BaseModel):
    """The plan's request limits and the service's size limits."""

    requests_per_minute: int | None = Field(
        description="API requests per minute; null: unlimited. Past it: 429 with Retry-After."
    )
    concurrent_requests: int | None = Field(
        description="Requests at once; null: no fixed limit. Past it: 429."
    )
    batch_max_emails: int = Field(description="Most addresses per `POST /api/verify/batch`.")
    json_bulk_max_emails: int = Field(description="Most addresses per `POST /api/verify/bulk`.")
    upload_max_bytes: int = Field(description="Largest CSV upload, in bytes.")
    upload_max_rows: int = Field(description="Most rows in a CSV upload.")


class AccountInfo(BaseModel):
    """The account a key belongs to (the same figures as the dashboard)."""

    model_config = ConfigDict(
        json_schema_extra={
            "example": {
                "account_id": 7,
                "email": "data@example.com",
                "plan": "starter",
                "balance": {
                    "total": 4312,
                    "prepaid": 100,
                    "allowance": 5000,
                    "allowance_remaining": 4212,
                    "allowance_resets_at": "2026-12-01T00:00:00Z",
                },
                "limits": {
                    "requests_per_minute": 60,
                    "concurrent_requests": 5,
                    "batch_max_emails": 500,
                    "json_bulk_max_emails": 10000,
                    "upload_max_bytes": 52428800,
                    "upload_max_rows": 1000000,
                },
                "finder_enabled": True,
                "finder_credits_per_find": 10,
                "upgrade": UPGRADE_HELP,
            }
        }
    )

    account_id: int = Field(description="The account's id (quote it to the operators).")
    email: str | None = Field(description="The account's login address; null when it has none.")
    plan: Literal["free", "starter", "pro", "business", "enterprise"] = Field(
        description="The account's plan."
    )
    balance: AccountBalance = Field(description="Credits available now, by pool.")
    limits: AccountLimits = Field(description="The plan's request limits and the size limits.")
    finder_enabled: bool = Field(description="Whether the Email Finder endpoints may be used.")
    finder_credits_per_find: int = Field(
        description="Credits a verified find costs (nothing is charged otherwise)."
    )
    upgrade: str = Field(description="How to change the plan or get more credits.")


class UsageDay(BaseModel):
    """Credits spent on one UTC day."""

    date: date_type = Field(description="The day (UTC).")
    credits_spent: int = Field(
        description="Credits charged and reserved that day, less those refunded that day "
        "(never below 0): the bar the dashboard draws for the day."
    )


class Usage(BaseModel):
    """Credits spent per day over a range: what the dashboard's chart draws."""

    from_: date_type = Field(alias="from", description="First day of the range (UTC).")
    to: date_type = Field(description="Last day of the range (UTC), included.")
    granularity: Literal["day"] = Field(description="One entry per day.")
    total_spent: int = Field(description="The sum of `credits_spent` over the range.")
    days: list[UsageDay] = Field(description="Every day of the range, oldest first.")

    model_config = ConfigDict(populate_by_name=True, serialize_by_alias=True)


class LedgerRow(BaseModel):
    """One movement of credits (the ledger is append-only)."""

    id: int = Field(description="The row's id; rows are listed by it, newest first.")
    delta: int = Field(description="Credits added (> 0) or taken (< 0).")
    kind: str = Field(
        description="`signup` (the sign-up credits), `grant` (an operator's), `charge` (a "
        "request, a find), "
        "`reserve` (a job's credits, taken at creation), `refund` (given back), "
        "`allowance` (a new period of the plan's allowance opening)."
    )
    source: str = Field(description="The pool that moved: `prepaid` or `allowance` (the plan's).")
    reason: str = Field(description="What the movement was for, in words.")
    reference: str | None = Field(
        description="What it is charged under: `job:<id>` for a job, else a request's "
        "reference; null for grants."
    )
    balance_after: int = Field(description="The pool's balance right after this row.")
    created_at: datetime = Field(description="When it happened (UTC).")


class LedgerPage(BaseModel):
    """A page of the account's credit ledger, newest first."""

    entries: list[LedgerRow] = Field(description="The rows, newest first.")
    next_cursor: str | None = Field(
        description="Pass it as `cursor` for the next, older page; null on the last page."
    )
