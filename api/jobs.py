"""The job service (``jobs/create.py``) at the HTTP edge: its refusals as the spec's
answers, and an upload that is refused leaves nothing on disk.

The order makes "nothing lost, nothing overcharged" hold at every step: the upload is on
disk before the job exists; the job and its reservation are one transaction (402 leaves
neither); the run is started last, and if it cannot be started the job fails at once
with a full refund (503) instead of sitting in ``pending``.
"""

from __future__ import annotations

import secrets
import shutil
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Literal

from anyio import to_thread
from fastapi import Request

from verimail.api.errors import DATABASE_RETRY_AFTER, ApiError
from verimail.engine import DomainResolver
from verimail.files.csv_detect import CsvInfo
from verimail.files.upload_errors import UploadError, UploadTooLarge
from verimail.jobs.create import NotEnoughCredits, NotStarted, create_verify_job, submit
from verimail.jobs.webhook import WebhookRefused, check_url_resolved
from verimail.store import jobs as job_store
from verimail.store.db import Store


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
    except UploadError as exc:
        # The refusal's traceback holds the reader's frames, and they the whole parse (a
        # million-column header: ~100 MB of Python objects). Chained to the answer, it lived
        # until a full garbage collection, so memory grew upload after upload (issue 35;
        # BENCHMARKS.md, "Memory across huge-header uploads"): the parse is let go now.
        exc.__traceback__ = None
        if isinstance(exc, UploadTooLarge):
            raise ApiError(413, f"{exc.detail} Nothing was stored.") from exc
        raise ApiError(422, exc.detail) from exc


async def create_and_start(
    request: Request,
    store: Store,
    account_id: int,
    total: int,
    *,
    upload: Path,
    kind: Literal["bulk_csv", "bulk_json"] = "bulk_csv",
    info: CsvInfo | None = None,
    email_column: str | None = None,
    options: dict[str, Any] | None = None,
    webhook_url: str | None = None,
) -> job_store.Job:
    """A verification job through the job service, its ``total`` credits reserved, then
    started; 402 (nothing kept: the upload's folder goes too) when the balance is short."""

    def create() -> job_store.Job:
        return create_verify_job(
            store,
            account_id,
            total,
            upload=upload,
            kind=kind,
            info=info,
            email_column=email_column,
            options=options,
            webhook_url=webhook_url,
        )

    with dropped_on_failure(upload.parent):
        try:
            job = await to_thread.run_sync(create)
        except NotEnoughCredits as exc:
            raise ApiError(
                402,
                f"Not enough credits: this job needs {total} (1 per address), the balance is "
                f"{exc.have}. Nothing was stored or charged.",
            ) from None
    await start_run(request, store, job)
    return job


async def start_run(request: Request, store: Store, job: job_store.Job) -> None:
    """Start a created job's run (the job service's :func:`submit`); when it cannot start
    the job is failed with its refund and the answer is 503."""
    runner = request.app.state.runner
    try:
        await to_thread.run_sync(submit, store, runner, job)
    except NotStarted as exc:
        raise ApiError(
            503,
            f"The job could not be started right now; {exc.settled}.",
            {"Retry-After": str(DATABASE_RETRY_AFTER)},
        ) from exc


async def webhook_options(request: Request, url: str | None) -> dict[str, str]:
    """Check a job's ``webhook_url`` (422 when it may not be called: its host name is
    resolved now, by the engine's resolver) and make its secret.

    The secret signs the completion POST and is returned once, in the creation response.
    """
    if not url:
        return {}
    settings = request.app.state.settings
    try:
        await check_url_resolved(url, settings.webhook_allow_networks, webhook_resolver(request))
    except WebhookRefused as exc:
        raise ApiError(422, f"webhook_url: {exc}") from exc
    return {"webhook_secret": secrets.token_urlsafe(32)}


def webhook_resolver(request: Request) -> DomainResolver:
    """The engine's resolver (its cache shared), or one of the settings' when the engine
    could not be made."""
    engine = request.app.state.engine
    return engine.resolver if engine is not None else DomainResolver(request.app.state.settings)


def retry_option(value: str | bool | None) -> dict[str, bool]:
    """The job option of ``retry_unknowns`` (only when it opts out); 422 on an unreadable
    value, before anything is stored or charged."""
    if value is None or value is True or value == "":
        return {}
    if value is False:
        return {"retry_unknowns": False}
    text = str(value).strip().lower()
    if text in ("true", "1", "yes", "on"):
        return {}
    if text in ("false", "0", "no", "off"):
        return {"retry_unknowns": False}
    raise ApiError(422, f"retry_unknowns: {value!r} is not true or false.")
