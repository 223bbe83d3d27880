"""What a person fills in to start a flow from the Prefect UI, and how it is checked.

A deployment's form is drawn from its flow's parameters: each field here has a title and a
description that the UI shows, and the flows hide their internal parameters (``job_id``,
``attempt``: what the API and recovery pass) from the form with ``SkipJsonSchema``.

A wrong input is a :class:`FormError`: one sentence for the person, which the flow makes
the failed run's state message (no traceback in the run log).
"""

from __future__ import annotations

from pathlib import Path

from pydantic import BaseModel, ConfigDict, Field
from pydantic.json_schema import SkipJsonSchema

from verimail.config import Settings
from verimail.jobs.webhook import WebhookRefused, check_url
from verimail.store import accounts
from verimail.store.db import Store


class FormError(ValueError):
    """A form input the run cannot use; the message is one sentence for the person."""


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


def find_account(store: Store, account: str) -> accounts.Account:
    """The account named by its number or email address; FormError if there is none."""
    text = account.strip()
    found = (
        accounts.get_account(store.engine, int(text))
        if text.isdigit()
        else accounts.get_account_by_email(store.engine, text)
    )
    if found is None:
        raise FormError(f"There is no account {text!r}: give its number or its email address.")
    return found


def shared_file(settings: Settings, file: str) -> Path:
    """``file`` resolved inside the data dir; FormError if outside it or not a file.

    Only the shared data dir: a form must not read any file a worker can (its own
    configuration, another installation's data) into a job whose results can be downloaded.
    """
    root = Path(settings.data_dir).resolve()
    path = (root / file.strip()).resolve()
    if not path.is_relative_to(root):
        raise FormError(f"The file {file!r} is outside the data dir {root}; put it there.")
    if not path.is_file():
        raise FormError(f"There is no file {file!r} in the data dir {root}.")
    return path


def checked_webhook(settings: Settings, url: str | None) -> str | None:
    """The webhook URL if it may be called (as the API checks it); FormError if not."""
    if not url or not url.strip():
        return None
    try:
        check_url(url.strip(), settings.webhook_allow_networks)
    except WebhookRefused as exc:
        raise FormError(str(exc)) from None
    return url.strip()
