"""CSV uploads in the dashboard: ``/dashboard/upload`` streams the file to disk with the
API's size cap and starts its job through the API's own :func:`~verimail.api.jobs.create_and_start`;
a file whose email column cannot be found waits in ``pending/`` (one per account, at most an
hour) while the column picker asks which column holds the addresses.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import time
import uuid
from pathlib import Path
from typing import Any

from anyio import to_thread
from fastapi import APIRouter, Request
from fastapi.responses import Response

from verimail.api.body_limit import streams_own_body
from verimail.api.dashboard.web import (
    PREFIX,
    CheckedForm,
    CurrentAccount,
    DashboardRoute,
    StoreDep,
    check_csrf,
    dashboard_state,
    plan_limits,
    redirect,
    render,
    text_field,
)
from verimail.api.errors import ApiError
from verimail.api.jobs import create_and_start, uploads_dir
from verimail.api.uploads import receive_upload
from verimail.files.csv_detect import inspect_csv
from verimail.files.csv_encoding import open_info
from verimail.files.csv_records import iter_data_records
from verimail.files.upload_errors import UploadError, UploadTooLarge
from verimail.store import accounts as acc
from verimail.store.billing import balance

router = APIRouter(prefix=PREFIX, route_class=DashboardRoute, include_in_schema=False)

PENDING_DIR = "pending"
PENDING_MAX_AGE = 3600
"""Seconds an upload waiting for its email column is kept (then it is swept away)."""
PREVIEW_ROWS = 5
PICKER_MAX_COLUMNS = 200
"""Columns the picker lists and previews: a file 2 million columns wide made a 130 MB page
and took 2 GB of memory to build it."""


def dashboard_words(exc: UploadError) -> str:
    """A refusal worded for the dashboard: no API field names (``email_column``), and the
    picker, not a field to pass, is how a column is chosen."""
    return exc.reworded({"email_column": "The email column"}, "")


def _pending_root(request: Request) -> Path:
    return uploads_dir(request) / PENDING_DIR


def _sweep_pending(root: Path) -> None:
    """Remove uploads whose column was never chosen (older than PENDING_MAX_AGE)."""
    if not root.is_dir():
        return
    cutoff = time.time() - PENDING_MAX_AGE
    for folder in root.iterdir():
        with contextlib.suppress(OSError):
            if folder.stat().st_mtime < cutoff:
                shutil.rmtree(folder, ignore_errors=True)


def upload_preview(path: Path, max_rows: int) -> tuple[tuple[str, ...], list[list[str]], int]:
    """The first columns (at most PICKER_MAX_COLUMNS), the first rows' cells under them, and
    how many columns the file has, to help choose the email column."""
    info = inspect_csv(path, max_rows=max_rows, need_email=False)
    rows: list[list[str]] = []
    with open_info(path, info) as stream:
        for fields in iter_data_records(stream, info.delimiter, info.has_header):
            shown = fields[:PICKER_MAX_COLUMNS]
            rows.append([(cell if len(cell) <= 60 else cell[:59] + "…") for cell in shown])
            if len(rows) >= PREVIEW_ROWS:
                break
    return info.columns[:PICKER_MAX_COLUMNS], rows, len(info.columns)


def _pending_prefix(account_id: int) -> str:
    """How an account's waiting upload is named in ``pending/`` (letters and digits only)."""
    return f"a{account_id}x"


def _forget_pending(root: Path, account_id: int) -> None:
    """Remove the account's uploads still waiting for a column, unless one is being used.

    One upload waits per account: each kept its whole file for an hour, so a script posting
    undetectable files could fill the disk (about 500 MB a minute per account)."""
    if not root.is_dir():
        return
    for folder in root.glob(_pending_prefix(account_id) + "*"):
        if not (folder / ".claimed").exists():
            shutil.rmtree(folder, ignore_errors=True)


@router.get("/upload")
async def upload_form(request: Request, account: CurrentAccount, store: StoreDep) -> Response:
    bal = await to_thread.run_sync(balance, store.engine, account.id)
    return render(request, "upload.html", {"balance": bal}, account=account)


async def _upload_refused(
    request: Request,
    account: acc.Account,
    store: StoreDep,
    status_code: int,
    error: str | None,
    **context: Any,
) -> Response:
    bal = await to_thread.run_sync(balance, store.engine, account.id)
    return render(
        request,
        "upload.html",
        {"balance": bal, "error": error, **context},
        account=account,
        status_code=status_code,
    )


async def _start_job(
    request: Request,
    account: acc.Account,
    store: StoreDep,
    folder: Path,
    column: str | None,
    filename: str | None,
) -> Response:
    """Inspect the stored upload and start its job; a missing column shows the picker."""
    settings = request.app.state.settings
    path = folder / "upload.csv"
    try:
        info = await to_thread.run_sync(
            lambda: inspect_csv(path, max_rows=settings.upload_max_rows, email_column=column)
        )
    except UploadTooLarge as exc:
        shutil.rmtree(folder, ignore_errors=True)
        return await _upload_refused(
            request, account, store, 413, f"{exc.detail} Nothing was stored."
        )
    except UploadError as exc:
        try:
            preview = await to_thread.run_sync(upload_preview, path, settings.upload_max_rows)
        except UploadError:
            shutil.rmtree(folder, ignore_errors=True)
            return await _upload_refused(request, account, store, 422, dashboard_words(exc))
        return await _column_picker(
            request, account, store, folder, filename, preview, dashboard_words(exc), column
        )
    except BaseException:
        shutil.rmtree(folder, ignore_errors=True)
        raise
    if info.email_count == 0:
        shutil.rmtree(folder, ignore_errors=True)
        return await _upload_refused(
            request, account, store, 422, f"The column {info.email_column!r} holds no addresses."
        )
    folder = out_of_pending(request, folder)
    path = folder / "upload.csv"
    try:
        job = await create_and_start(
            request,
            store,
            account.id,
            info.email_count,
            upload=path,
            info=info,
            email_column=info.email_reference,
            options={"filename": filename},
        )
    except ApiError as exc:
        if exc.status_code != 402:
            raise
        return await _upload_refused(request, account, store, 402, exc.detail)
    return redirect(f"{PREFIX}/jobs/{job.id}")


async def _column_picker(
    request: Request,
    account: acc.Account,
    store: StoreDep,
    folder: Path,
    filename: str | None,
    preview: tuple[tuple[str, ...], list[list[str]], int],
    why: str,
    chosen: str | None,
) -> Response:
    """Keep the file (in ``pending/``, replacing the account's earlier waiting upload) and
    ask which column holds the addresses.

    A first upload without a detectable column is a normal step (200, no error shown
    beyond the question); a column the person chose and that does not work is a 422.
    """
    columns, rows, width = preview
    token = await keep_pending(request, account.id, folder, filename)
    undetected = chosen is None and why.startswith("No email column found")
    return await _upload_refused(
        request,
        account,
        store,
        200 if chosen is None else 422,
        None if undetected else why,
        picker={
            "token": token,
            "columns": columns,
            "rows": rows,
            "filename": filename,
            "width": width,
        },
    )


async def keep_pending(
    request: Request, account_id: int, folder: Path, filename: str | None
) -> str:
    """Keep an upload whose columns are to be chosen in ``pending/`` (replacing the account's
    earlier waiting upload, of either picker); the signed token its picker form carries."""
    if folder.parent.name != PENDING_DIR:
        root = _pending_root(request)
        await to_thread.run_sync(_forget_pending, root, account_id)
        pending = root / (_pending_prefix(account_id) + folder.name)
        pending.parent.mkdir(parents=True, exist_ok=True)
        os.replace(folder, pending)
        folder = pending
    return dashboard_state(request).signer.dump_token(
        {"upload": folder.name, "account": account_id, "filename": filename}
    )


def claim_pending(request: Request, account_id: int, token: str) -> tuple[Path, dict] | None:
    """The pending upload a picker's token names, claimed (``.claimed`` in its folder) so a
    second submit of the same picker (a double click, two tabs) is told it is taken instead
    of racing this one for the folder; None when it is gone, used or not this account's."""
    data = dashboard_state(request).signer.load_token(token, max_age=PENDING_MAX_AGE)
    folder = None
    if data is not None and data.get("account") == account_id:
        name = str(data.get("upload", ""))
        if name and name.isalnum():
            folder = _pending_root(request) / name
    if folder is None or not (folder / "upload.csv").is_file():
        return None
    try:
        os.close(os.open(folder / ".claimed", os.O_CREAT | os.O_EXCL | os.O_WRONLY))
    except (FileExistsError, FileNotFoundError):
        return None
    return folder, data


def release_claim(request: Request, folder: Path) -> None:
    """Drop the claim, wherever the folder went (a started job's moved it out of pending)."""
    for place in (folder / ".claimed", uploads_dir(request) / folder.name / ".claimed"):
        with contextlib.suppress(FileNotFoundError):
            place.unlink()


def out_of_pending(request: Request, folder: Path) -> Path:
    """Move a claimed upload out of the sweeper's reach before its job exists."""
    if folder.parent.name != PENDING_DIR:
        return folder
    ready = uploads_dir(request) / folder.name
    os.replace(folder, ready)
    return ready


GONE = "That upload is no longer waiting (it expired or was used); upload the file again."


@router.post("/upload")
@streams_own_body
async def upload(request: Request, account: CurrentAccount, store: StoreDep) -> Response:
    """A CSV from the browser: streamed to disk with the API's size cap, then a job."""
    settings = request.app.state.settings
    await to_thread.run_sync(_sweep_pending, _pending_root(request))
    folder = uploads_dir(request) / uuid.uuid4().hex
    async with plan_limits(request, account):
        try:
            received = await receive_upload(
                request, folder / "upload.csv", max_bytes=settings.upload_max_bytes
            )
        except ApiError as exc:  # too large, or not a readable form: nothing was done
            shutil.rmtree(folder, ignore_errors=True)
            return await _upload_refused(request, account, store, exc.status_code, exc.detail)
        try:
            check_csrf(request, received.fields.get("csrf_token"))
        except Exception:
            shutil.rmtree(folder, ignore_errors=True)
            raise
        if received.size == 0 and not received.filename:
            shutil.rmtree(folder, ignore_errors=True)
            return await _upload_refused(request, account, store, 422, "Choose a CSV file.")
        return await _start_job(request, account, store, folder, None, received.filename)


@router.post("/upload/column")
async def upload_column(
    request: Request, account: CurrentAccount, store: StoreDep, form: CheckedForm
) -> Response:
    """The picker's answer: the pending upload and the chosen column."""
    claimed = claim_pending(request, account.id, text_field(form, "upload", 4096))
    if claimed is None:
        return await _upload_refused(request, account, store, 410, GONE)
    folder, data = claimed
    column = text_field(form, "email_column", 300).strip() or None
    try:
        async with plan_limits(request, account):
            return await _start_job(request, account, store, folder, column, data.get("filename"))
    finally:
        release_claim(request, folder)
