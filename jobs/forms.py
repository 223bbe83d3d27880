"""Jobs a person starts from the Prefect UI (or a script) with a file and an account: what
was filled in checked, then the job made as every surface makes it (``jobs/create.py``).

A wrong input is a :class:`FormError`: one sentence for the person, which the flow makes
the failed run's state message (no traceback in the run log).
"""

from __future__ import annotations

import asyncio
import secrets
from pathlib import Path
from typing import Any

from verimail.config import Settings
from verimail.engine import DomainResolver
from verimail.files.bulk_io import read_job_input
from verimail.files.csv_detect import UploadError
from verimail.jobs.create import NotEnoughCredits, create_verify_job
from verimail.jobs.webhook import WebhookRefused, check_url_resolved
from verimail.schemas.forms import BulkVerifyForm
from verimail.store import accounts
from verimail.store.db import Store


class FormError(ValueError):
    """A form input the run cannot use; the message is one sentence for the person."""


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
    """The webhook URL if it may be called (as the API checks it, its host name resolved
    now); FormError if not. Called from a worker thread, with no event loop of its own."""
    if not url or not url.strip():
        return None
    resolver = DomainResolver(settings)
    try:
        asyncio.run(check_url_resolved(url.strip(), settings.webhook_allow_networks, resolver))
    except WebhookRefused as exc:
        raise FormError(str(exc)) from None
    return url.strip()


def create_job_for_file(
    store: Store,
    settings: Settings,
    file_path: str,
    account_id: int,
    email_column: str | None,
    webhook_url: str | None = None,
    retry_unknowns: bool = True,
) -> int:
    """A job row for a run started without one (the Prefect UI, a script): reserve like the
    API does. :class:`FormError` (one sentence) when the file or the balance will not do."""
    path = Path(file_path)
    try:
        job_input = read_job_input(path, email_column, settings.upload_max_rows)
    except UploadError as exc:
        raise FormError(f"{path.name}: {exc.detail}") from None
    count = job_input.address_rows
    options: dict[str, Any] = {"source": "prefect", "filename": path.name}
    if webhook_url:
        options["webhook_secret"] = secrets.token_urlsafe(32)
    if not retry_unknowns:
        options["retry_unknowns"] = False  # (as the API's upload form stores the opt-out)
    try:
        job = create_verify_job(
            store,
            account_id,
            count,
            upload=path.resolve(),
            info=job_input.info,
            email_column=job_input.info.email_reference,
            options=options,
            webhook_url=webhook_url,
        )
    except NotEnoughCredits as exc:
        raise FormError(
            f"Account {account_id} has {exc.have} credits and {path.name} needs {count} "
            "(1 per address row); nothing was charged."
        ) from None
    return job.id


def create_job_for_form(store: Store, settings: Settings, form: BulkVerifyForm) -> int:
    """The job of a run started from the deployment's form, its inputs checked first."""
    account = find_account(store, form.account)
    path = shared_file(settings, form.file)
    webhook_url = checked_webhook(settings, form.webhook_url)
    return create_job_for_file(
        store,
        settings,
        str(path),
        account.id,
        form.email_column,
        webhook_url,
        retry_unknowns=form.retry_unknowns,
    )
