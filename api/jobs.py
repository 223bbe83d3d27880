"""Creating a job and starting its run, shared by the CSV and JSON bulk endpoints.

The order makes "nothing lost, nothing overcharged" hold at every step: the upload is on
disk before the job exists; the job and its reservation are one transaction (402 leaves
neither); the run is started last, and if it cannot be started the job fails at once
with a full refund (503) instead of sitting in ``pending``.
"""

from __future__ import annotations

import logging
import secrets
import shutil
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from anyio import to_thread
from fastapi import Request

from verimail.api.errors import DATABASE_RETRY_AFTER, ApiError
from verimail.files.csv_detect import UploadError, UploadTooLarge
from verimail.store import jobs as job_store
from verimail.store.credits import balance
from verimail.store.db import Store
from verimail.store.prices import price
from verimail.tasks.webhook import WebhookRefused, check_url

log = logging.getLogger("verimail.api.jobs")


def uploads_dir(request: Request) -> Path:
    return Path(request.app.state.settings.data_dir) / "uploads"


@contextmanager
def dropped_on_failure(folder: Path) -> Iterator[None]:
    """Nothing of a refused upload stays on disk: any error (a 4xx, a database that does not
    answer, a bug) inside the block removes the upload's folder before it propagates."""
    try:
        yield
    except BaseException:
        shutil.rmtree(folder, ignore_errors=True)
        raise


@contextmanager
def upload_refusals() -> Iterator[None]:
    """The reader's refusals of an upload as HTTP errors: too many rows is a 413 (nothing is
    stored), anything else it cannot read a 422 with its explanation."""
    try:
        yield
    except UploadTooLarge as exc:
        raise ApiError(413, f"{exc.detail} Nothing was stored.") from exc
    except UploadError as exc:
        raise ApiError(422, exc.detail) from exc


async def create_and_start(
    request: Request,
    store: Store,
    account_id: int,
    *,
    kind: str,
    runner_kind: str,
    total: int,
    upload: Path,
    email_column: str | None = None,
    options: dict[str, Any] | None = None,
    webhook_url: str | None = None,
) -> job_store.Job:
    """Reserve ``total`` credits with the job row, then hand it to the runner."""

    def create() -> job_store.Job | None:
        return job_store.create_job(
            store.engine,
            account_id,
            kind,  # type: ignore[arg-type]
            total,
            reserve=price("verify", total),
            upload_path=str(upload),
            email_column=email_column,
            options=options,
            webhook_url=webhook_url,
        )

    with dropped_on_failure(upload.parent):
        job = await to_thread.run_sync(create)
        if job is None:
            have = await to_thread.run_sync(lambda: balance(store.engine, account_id).total)
            raise ApiError(
                402,
                f"Not enough credits: this job needs {total} (1 per address), the balance is "
                f"{have}. Nothing was stored or charged.",
            )
    await start_run(request, store, runner_kind, job)
    return job


async def start_run(request: Request, store: Store, runner_kind: str, job: job_store.Job) -> None:
    """Hand a created job to the runner. If it cannot start, the job is failed (which
    refunds its reservation, if any) and the answer is 503: no job is left pending and
    nothing stays charged."""
    runner = request.app.state.runner
    try:
        await to_thread.run_sync(runner.submit, runner_kind, job.id, job.attempt)
    except Exception as exc:
        log.exception("could not start job %s", job.id)
        settled = "its credits were refunded" if job.credits_reserved else "nothing was charged"
        await to_thread.run_sync(
            lambda: job_store.mark_failed(
                store.engine, job.id, f"The job could not be started; {settled}."
            )
        )
        raise ApiError(
            503,
            f"The job could not be started right now; {settled}.",
            {"Retry-After": str(DATABASE_RETRY_AFTER)},
        ) from exc


def webhook_options(request: Request, url: str | None) -> dict[str, str]:
    """Check a job's ``webhook_url`` (422 when it may not be called) and make its secret.

    The secret signs the completion POST and is returned once, in the creation response.
    """
    if not url:
        return {}
    try:
        check_url(url, request.app.state.settings.webhook_allow_networks)
    except WebhookRefused as exc:
        raise ApiError(422, f"webhook_url: {exc}") from exc
    return {"webhook_secret": secrets.token_urlsafe(32)}
