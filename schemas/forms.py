"""What a person fills in to start a flow from the Prefect UI.

A deployment's form is drawn from its flow's parameters: each field here has a title and a
description that the UI shows, and the flows hide their internal parameters (``job_id``,
``attempt``: what the API and recovery pass) from the form with ``SkipJsonSchema``. The
checks of what was filled in (the account exists, the file is in the data dir, the webhook
may be called) are the job service's (``jobs/forms.py``).

**An optional field left empty** (:func:`optional`): its schema has a type and no
``default``. The Prefect UI (3.8) draws such a field as a plain input and sends nothing for
it when it is left empty, and Prefect's parameter validation (the UI's "Validate
parameters", and the server's when a run is created) lets a field that is not required and
has no default be null. A field written ``str | None = None`` instead draws a
"str / None" switch set to "Property is type None"; one whose null is hidden from the
schema but whose ``default: null`` is kept is sent as null and refused ("None is not of
type 'string'"). Hence the forms are models: a flow's own parameters always carry their
default in Prefect's schema.
"""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict, Field
from pydantic.json_schema import SkipJsonSchema


def _nothing() -> None:
    return None


def optional(**field: Any) -> Any:
    """A form field that may be left empty (None): no ``default`` in the schema (a default
    factory writes none), so the UI sends nothing for it and its validation accepts that."""
    return Field(default_factory=_nothing, **field)


class BulkVerifyForm(BaseModel):
    """Verify a CSV file on the shared data dir for an account (billed like an upload)."""

    model_config = ConfigDict(extra="forbid", title="Verify a file")

    account: str = Field(
        title="Account",
        description="The account the job belongs to and is billed to: its number "
        "(e.g. 12) or its email address. It needs 1 credit per address row.",
        min_length=1,
        examples=["12", "data-team@example.com"],
    )
    file: str = Field(
        title="CSV file",
        description="Path of the CSV file inside the data dir shared by the API and the "
        "workers (VERIMAIL_DATA_DIR), e.g. inbox/leads.csv. Paths outside it are refused.",
        min_length=1,
        examples=["inbox/leads.csv"],
    )
    email_column: str | SkipJsonSchema[None] = optional(
        title="Email column",
        description="The column with the addresses (its header or its 1-based number); "
        "empty: found automatically.",
    )
    webhook_url: str | SkipJsonSchema[None] = optional(
        title="Webhook URL",
        description="Optional URL to POST the finished job to, signed as for API jobs (the "
        "signing key is written in the run's log).",
    )
    retry_unknowns: bool = Field(
        True,
        title="Retry unknowns",
        description="Retry greylisted and temporarily failed addresses in later passes, after "
        "the greylist window (the job takes longer; fewer addresses come back unknown). Off: "
        "the job ends after its first pass.",
    )


class ReverifyForm(BaseModel):
    """What to re-verify: a past job, a file, or (neither) the stale addresses."""

    model_config = ConfigDict(extra="forbid", title="Re-verify")

    job_id: int | SkipJsonSchema[None] = optional(
        title="Job",
        description="A completed bulk job to verify again (its number). Leave empty for a "
        "file or for the stale addresses.",
    )
    file_path: str | SkipJsonSchema[None] = optional(
        title="CSV file",
        description="A CSV file inside the shared data dir (e.g. inbox/leads.csv) to verify "
        "again and compare with the history. Leave empty for a job or the stale addresses.",
    )
    older_than_days: int = Field(
        30,
        title="Older than (days)",
        description="With neither a job nor a file: re-verify every address whose latest "
        "verification is older than this many days.",
        ge=0,
    )
    retry_unknowns: bool = Field(
        True,
        title="Retry unknowns",
        description="Ask greylisted and temporarily failed addresses again later (a "
        "follow-up run, after VERIMAIL_JOB_RETRY_DELAY), updating the report; off: the "
        "report is final after this run.",
    )
