"""Re-verifying a list: the body of ``POST /api/bulk/{id}/reverify``, a list's schedule
(``/api/bulk/{id}/reverify-schedule``, ``GET /api/reverify-schedules``) and its history
(``GET /api/bulk/{id}/reverifications``), every field described for OpenAPI.

The new job a re-verification makes is a ``BulkJob`` (``schemas/jobs.py``). ``of(row)``
takes a store row (anything with its attributes), so this module imports nothing of ours.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any

from pydantic import AnyHttpUrl, BaseModel, Field

from verimail.schemas.limits import MAX_EVERY_DAYS


class ReverifyRequest(BaseModel):
    """``POST /api/bulk/{job_id}/reverify`` (the body is optional)."""

    webhook_url: AnyHttpUrl | None = Field(
        None,
        description="POSTed the new job when it ends, signed with the `webhook_secret` of "
        "the response. Without it, the list's own webhook (its upload's, with that secret) "
        "is told.",
    )


class ScheduleRequest(BaseModel):
    """``PUT /api/bulk/{job_id}/reverify-schedule``: create or change the list's schedule."""

    every_days: int = Field(
        ge=1, le=MAX_EVERY_DAYS, description="Re-verify the list every this many days."
    )
    first_run_at: datetime | None = Field(
        None,
        description="When the first run is made (UTC when no offset is given); default: "
        "`every_days` from now. At most a year ahead.",
    )

    model_config = {"json_schema_extra": {"examples": [{"every_days": 30}]}}


class ReverifySchedule(BaseModel):
    """A list's re-verification schedule."""

    list_job_id: int = Field(description="The list: the job its owner uploaded.")
    every_days: int = Field(description="Days between runs.")
    next_run_at: datetime = Field(description="When the next run is made (UTC).")
    created_at: datetime = Field(description="When the schedule was made.")

    @classmethod
    def of(cls, schedule: Any) -> ReverifySchedule:
        """The answer for a store ``Schedule`` row."""
        return cls(
            list_job_id=schedule.list_job_id,
            every_days=schedule.every_days,
            next_run_at=schedule.next_run_at,
            created_at=schedule.created_at,
        )


class Reverification(BaseModel):
    """One re-verification of a list, made or skipped."""

    requested_at: datetime = Field(description="When it was asked for (or its schedule ran).")
    scheduled: bool = Field(description="Made by the list's schedule.")
    previous_job_id: int = Field(description="The run it compares with.")
    job_id: int | None = Field(description="Its job; null when it was skipped.")
    status: str = Field(description="Its job's status, or `skipped`.")
    transitions: dict[str, int] = Field(description="Rows whose status changed, once completed.")
    skipped_reason: str | None = Field(description="Why it was skipped (credits, …).")

    @classmethod
    def of(cls, entry: Any) -> Reverification:
        """The answer for a store ``HistoryEntry`` (its job is None when it was skipped)."""
        return cls(
            requested_at=entry.created_at,
            scheduled=entry.scheduled,
            previous_job_id=entry.previous_job_id,
            job_id=entry.job.id if entry.job else None,
            status=entry.job.status if entry.job else "skipped",
            transitions=entry.transitions,
            skipped_reason=entry.skipped_reason,
        )
