"""Re-verifying a list: the body of ``POST /api/bulk/{id}/reverify``, a list's schedule
(``/api/bulk/{id}/reverify-schedule``, ``GET /api/reverify-schedules``) and its history
(``GET /api/bulk/{id}/reverifications``), every field described for OpenAPI.

The new job a re-verification makes is a ``BulkJob`` (``schemas/jobs.py``). ``of(row)``
takes a store row (anything with its attributes), so this module imports nothing of ours.
"""

from __future__ import annotations

import re
from datetime import UTC, datetime, timedelta
from typing import Any

from pydantic import AwareDatetime, BaseModel, Field, field_validator

from verimail.schemas.bulk import WebhookUrl
from verimail.schemas.limits import MAX_EVERY_DAYS

_DATE_TIME = re.compile(r"\d{4}-\d{2}-\d{2}[Tt ]\d{2}:\d{2}")


class ReverifyRequest(BaseModel):
    """``POST /api/bulk/{job_id}/reverify`` (the body is optional)."""

    webhook_url: WebhookUrl | None = Field(
        None,
        description="POSTed the new job when it ends, signed with the `webhook_secret` of "
        "the response. Without it, the list's own webhook (its upload's, with that secret) "
        "is told.",
    )


EXAMPLE_LEAD = timedelta(days=120)
"""How far ahead the schema's example ``first_run_at`` lies: to come, and within the year
the field allows, for as long as a process runs (a fixed date would fall out of either)."""


def example_first_run(now: datetime | None = None) -> str:
    """The example ``first_run_at``: 09:00 UTC, :data:`EXAMPLE_LEAD` from ``now``'s day."""
    day = ((now or datetime.now(UTC)) + EXAMPLE_LEAD).date()
    return f"{day.isoformat()}T09:00:00Z"


class ScheduleRequest(BaseModel):
    """``PUT /api/bulk/{job_id}/reverify-schedule``: create or change the list's schedule."""

    every_days: int = Field(
        strict=True,  # (`true` and `"7"` are no numbers of days)
        ge=1,
        le=MAX_EVERY_DAYS,
        description="Re-verify the list every this many days: a JSON integer.",
    )
    first_run_at: AwareDatetime | None = Field(
        None,
        description="When the first run is made: an RFC 3339 date-time with its zone "
        "(`YYYY-MM-DDThh:mm:ssZ`, or `…+02:00`); not in the past (a minute of clock skew is "
        "taken as now) and at most a year ahead. Default: `every_days` from now.",
        examples=[example_first_run()],
    )

    model_config = {"json_schema_extra": {"examples": [{"every_days": 30}]}}

    @field_validator("first_run_at", mode="before")
    @classmethod
    def _date_time_text(cls, value: object) -> object:
        """Only a date-time text: Pydantic alone reads ``0``, ``1e12`` and ``"0"`` as Unix
        times, and epoch 0, a past time, made a run (and its charge) at once."""
        if value is None or isinstance(value, datetime):
            return value
        if not isinstance(value, str) or not _DATE_TIME.match(value):
            raise ValueError(
                "a date-time with its zone is expected, such as "
                f"{example_first_run()} (not a number)"
            )
        return value


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
