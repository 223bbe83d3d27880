"""Job models shared by the API responses and the completion webhooks (SPEC §2.4, §2.7).

``of(job)`` takes a store job row (anything with its attributes), so this module keeps
importing nothing of ours and flows can build the same payload the API returns.
"""

from __future__ import annotations

import math
from datetime import datetime
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field


def percent_complete(done: int, total: int, completed: bool) -> float:
    """``done / total`` in percent, rounded *down* to 2 decimals: 19,999 of 20,000 is
    99.99, not 100.0 while the job is still processing."""
    if completed or total <= 0:
        return 100.0
    return min(100.0, math.floor(10_000 * done / total) / 100)


def retry_fields(job: Any) -> dict[str, Any]:
    """``phase``, ``retry_waiting`` and ``next_retry_at`` of a job row (its ``options``)."""
    if job.status != "processing":
        return {"phase": None, "retry_waiting": 0, "next_retry_at": None}
    state = (job.options or {}).get("retry") or {}
    waiting = state.get("phase") == "waiting_to_retry"
    return {
        "phase": state.get("phase") or "verifying",
        "retry_waiting": int(state.get("waiting", 0)),
        "next_retry_at": state.get("next_retry_at") if waiting else None,
    }


# The deferred-retry phase of a job (bulk and finder alike), from ``retry_fields``.
Phase = Annotated[
    Literal["verifying", "waiting_to_retry", "retrying"] | None,
    Field(
        description="While `processing`: `verifying` (first pass), `waiting_to_retry` "
        "(work the mail servers put off — greylisting, temporary failures — waits for a "
        "later pass; no worker is busy with the job), `retrying` (a later pass runs). "
        "Null otherwise.",
    ),
]
RetryWaiting = Annotated[
    int,
    Field(
        description="Addresses (in a finder job: rows) parked for the next (or running) "
        "retry pass; 0 otherwise.",
    ),
]
NextRetryAt = Annotated[
    datetime | None,
    Field(description="When the next retry pass starts (UTC); null when none is planned."),
]


WebhookError = Annotated[
    str | None,
    Field(
        description="A job with a `webhook_url` whose webhook could not be delivered (its "
        "retries spent, or its host resolving to a private address at delivery): why, in "
        "a sentence. Null otherwise (delivered, not yet due, or no webhook).",
        examples=["answered 500"],
    ),
]


CancelledAt = Annotated[
    datetime | None,
    Field(
        description="When the job's owner cancelled it (`POST …/cancel`, the dashboard); its "
        "status is then `failed`, its settled rows downloadable and the rest refunded. Null "
        "for a job not cancelled.",
    ),
]


def cancel_fields(job: Any) -> dict[str, Any]:
    """``cancelled_at`` of a job row (its ``options``, ``jobs/cancel.py``)."""
    cancelled = (job.options or {}).get("cancelled") if job.status == "failed" else None
    return {"cancelled_at": cancelled.get("at") if cancelled else None}


def webhook_fields(job: Any) -> dict[str, Any]:
    """``webhook_error`` of a job row (its ``options``): why its webhook was not delivered."""
    return {"webhook_error": (job.options or {}).get("webhook_error")}


class BulkJob(BaseModel):
    """A bulk verification job: its state, progress, counts by status and credits."""

    job_id: int = Field(description="Unique job identifier.")
    status: Literal["pending", "processing", "completed", "failed"] = Field(
        description="`pending` (accepted, not started) → `processing` → `completed` or "
        "`failed` (see `failed_reason`; unverified addresses are refunded)."
    )
    total_emails: int = Field(description="Addresses in the upload (rows with an address).")
    processed_emails: int = Field(description="Addresses verified so far.")
    percent_complete: float = Field(description="processed_emails / total_emails × 100.")
    valid_count: int = Field(description="Addresses verified valid.")
    invalid_count: int = Field(description="Addresses verified invalid.")
    catch_all_count: int = Field(
        description="Addresses on detected catch-all domains (statuses catchall and likely_valid)."
    )
    likely_valid_count: int = Field(description="The catch-all addresses scored likely valid.")
    disposable_count: int = Field(description="Addresses on disposable services.")
    unknown_count: int = Field(description="Addresses not conclusively verified.")
    risky_count: int = Field(description="Addresses that exist but would bounce now (full).")
    unique_emails: int | None = Field(None, description="Distinct addresses (each probed once).")
    credits_reserved: int = Field(description="Credits reserved at creation (1 per address).")
    credits_refunded: int = Field(description="Credits returned (a failed job's unverified).")
    created_at: datetime = Field(description="Job creation time (UTC).")
    completed_at: datetime | None = Field(None, description="When it completed or failed.")
    failed_reason: str | None = Field(None, description="Why the job failed, when it did.")
    cancelled_at: CancelledAt = None
    webhook_secret: str | None = Field(
        None,
        description="Only in the creation response of a job with a `webhook_url`: the key of "
        "its `X-Verimail-Signature` (HMAC-SHA256 of `<timestamp>.<body>`).",
    )
    webhook_error: WebhookError = None
    notice: str | None = Field(
        None,
        description="Only in the creation response of an upload with more than one column of "
        "addresses (e.g. `email` and `work_email`): which one is verified (the first found) "
        "and how to choose another (`email_column`).",
    )
    reverify_of: int | None = Field(
        None,
        description="A re-verification: the job whose results it compares with (null for "
        "an upload).",
    )
    transitions: dict[str, int] | None = Field(
        None,
        description="A completed re-verification: rows whose status changed since "
        '`reverify_of`, by `"<previous>-><status>"` (e.g. `{"valid->invalid": 31}`); '
        "null otherwise.",
        examples=[{"valid->invalid": 31, "unknown->valid": 4}],
    )
    egress_blocked: dict[str, int] | None = Field(
        None,
        description="A completed job: rows a mail server refused because of our sending IP "
        "(`unknown`/`egress_blocked`, e.g. a blocklist), by egress (`direct`, or a proxy's "
        "name); null when there were none. See docs/egress.md.",
        examples=[{"direct": 12}],
    )
    phase: Phase = None
    retry_waiting: RetryWaiting = 0
    next_retry_at: NextRetryAt = None
    shards_total: int | None = Field(
        None,
        description="A job big enough to be spread over workers (more distinct addresses "
        "than the shard size): the shards it was cut into, by domain; null for a job "
        "verified in one piece.",
    )
    shards_done: int | None = Field(
        None, description="Of `shards_total`, the shards verified so far; null likewise."
    )

    @classmethod
    def of(cls, job: Any) -> BulkJob:
        total = job.total_emails
        percent = percent_complete(job.processed_emails, total, job.status == "completed")
        return cls(
            **retry_fields(job),
            **webhook_fields(job),
            **cancel_fields(job),
            job_id=job.id,
            status=job.status,  # type: ignore[arg-type]
            total_emails=total,
            processed_emails=job.processed_emails,
            percent_complete=percent,
            valid_count=job.valid_count,
            invalid_count=job.invalid_count,
            catch_all_count=job.catch_all_count,
            likely_valid_count=job.likely_valid_count,
            disposable_count=job.disposable_count,
            unknown_count=job.unknown_count,
            risky_count=job.risky_count,
            unique_emails=job.unique_emails,
            credits_reserved=job.credits_reserved,
            credits_refunded=job.credits_refunded,
            created_at=job.created_at,
            completed_at=job.completed_at,
            failed_reason=job.failed_reason,
            egress_blocked=(job.options or {}).get("egress_blocked") or None,
            **_reverification(job.options or {}),
            **_shards(job.options or {}),
        )


def _shards(options: dict[str, Any]) -> dict[str, Any]:
    """A sharded job's ``shards_total`` and ``shards_done`` (none for a job in one piece)."""
    shards = options.get("shards")
    if not shards:
        return {}
    return {"shards_total": int(shards["total"]), "shards_done": int(shards["done"])}


def _reverification(options: dict[str, Any]) -> dict[str, Any]:
    """A re-verification job's fields, read from its options (none for an upload)."""
    if options.get("reverify_of") is None:
        return {}
    transitions = options.get("transitions")
    return {"reverify_of": int(options["reverify_of"]), "transitions": transitions}


class JsonBulkCreated(BaseModel):
    """Answer to ``POST /api/verify/bulk``: poll ``GET /api/verify/bulk/{job_id}``."""

    job_id: int = Field(description="Job identifier to poll.")
    status: Literal["pending", "processing", "completed", "failed"] = Field(
        description="`pending` right after creation."
    )
    total_emails: int = Field(description="Addresses accepted (empty entries are dropped).")
    webhook_secret: str | None = Field(
        None, description="With a `webhook_url`: the key of its `X-Verimail-Signature`."
    )


class JsonBulkJob(BulkJob):
    """A JSON bulk job with a page of its results once completed."""

    results: list[dict[str, Any]] | None = Field(
        None,
        description="Verification results in submission order, `limit` of them from "
        "`offset`; null until the job completes.",
    )
    offset: int = Field(0, description="Index of the first result on this page.")
    limit: int = Field(100, description="Results per page (at most 1,000).")
    next_offset: int | None = Field(None, description="Offset of the next page, if any.")


class FinderJob(BaseModel):
    """An Email Finder CSV job: its state, progress, counts by outcome and credits used."""

    model_config = ConfigDict(extra="allow")

    job_id: str = Field(description="Unique job identifier (a string such as `fj_…`).")
    status: Literal["pending", "processing", "completed", "failed"] = Field(
        description="`pending` → `processing` → `completed` (download the CSV) or `failed`."
    )
    total_rows: int = Field(description="Data rows in the upload.")
    processed_rows: int = Field(description="Rows looked up so far.")
    percent_complete: float = Field(description="processed_rows / total_rows × 100.")
    found_count: int = Field(description="Rows with a verified address (each charged).")
    not_found_count: int = Field(description="Rows with no address found (free).")
    catch_all_count: int = Field(description="Rows on catch-all domains: a guess, free.")
    invalid_input_count: int = Field(description="Rows with an empty name or bad domain.")
    skipped_no_credits_count: int = Field(
        description="Rows not looked up, or finds not revealed, because credits ran out."
    )
    credits_used: int = Field(description="Credits charged so far (finder charge per find).")
    created_at: datetime = Field(description="Job creation time (UTC).")
    completed_at: datetime | None = Field(None, description="When it completed or failed.")
    failed_reason: str | None = Field(None, description="Why the job failed, when it did.")
    cancelled_at: CancelledAt = None
    webhook_error: WebhookError = None
    phase: Phase = None
    retry_waiting: RetryWaiting = 0
    next_retry_at: NextRetryAt = None

    @classmethod
    def of(cls, job: Any) -> FinderJob:
        total = job.total_emails
        done = job.processed_emails
        percent = percent_complete(done, total, job.status == "completed")
        return cls(
            **retry_fields(job),
            **webhook_fields(job),
            **cancel_fields(job),
            job_id=job.public_id,
            status=job.status,  # type: ignore[arg-type]
            total_rows=total,
            processed_rows=done,
            percent_complete=percent,
            found_count=job.found_count,
            not_found_count=job.invalid_count,
            catch_all_count=job.catch_all_count,
            invalid_input_count=job.risky_count,
            skipped_no_credits_count=job.unknown_count,
            credits_used=job.credits_used,
            created_at=job.created_at,
            completed_at=job.completed_at,
            failed_reason=job.failed_reason,
        )


NextCursor = Annotated[
    str | None,
    Field(
        description="Pass it as `cursor` (with the same filters) for the next, older page; "
        "null on the last page.",
        examples=["ai0xMjQ"],
    ),
]


class BulkJobList(BaseModel):
    """A page of the account's bulk jobs, newest first."""

    jobs: list[BulkJob] = Field(
        description="The jobs, newest first, each as `GET /api/bulk/{job_id}` gives it."
    )
    next_cursor: NextCursor = None


class FinderJobList(BaseModel):
    """A page of the account's Email Finder CSV jobs, newest first."""

    jobs: list[FinderJob] = Field(
        description="The jobs, newest first, each as `GET /api/find-email/csv/{job_id}` gives it."
    )
    next_cursor: NextCursor = None
