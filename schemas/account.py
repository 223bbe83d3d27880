"""``GET /api/account``'s answer: the key's account — balance by pool, plan, limits, Email
Finder — every field described for OpenAPI."""

from __future__ import annotations

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
