"""What a person fills in to start a flow from the Prefect UI.

A deployment's form is drawn from its flow's parameters: each field here has a title and a
description that the UI shows, and the flows hide their internal parameters (``job_id``,
``attempt``: what the API and recovery pass) from the form with ``SkipJsonSchema``. The
checks of what was filled in (the account exists, the file is in the data dir, the webhook
may be called) are the job service's (``jobs/forms.py``).
"""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field
from pydantic.json_schema import SkipJsonSchema


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
    email_column: str | SkipJsonSchema[None] = Field(
        None,
        title="Email column",
        description="The column with the addresses (its header or its 1-based number); "
        "empty: found automatically.",
    )
    webhook_url: str | SkipJsonSchema[None] = Field(
        None,
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
