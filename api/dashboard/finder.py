"""The Email Finder in the dashboard: ``/dashboard/finder`` looks up one person, or takes a
CSV of people and starts a finder job (whose page is the jobs' page, like a bulk job's).

Both go through the API's own code — :func:`~verimail.api.routes.finder.find_email_route`
(charged only for a verified find) and
:func:`~verimail.api.routes.finder_csv.create_from_upload` — under the plan's limits. An
account whose finder is switched off sees the page with the reason and no forms.
"""

from __future__ import annotations

import shutil
import uuid
from pathlib import Path
from typing import Any

from anyio import to_thread
from fastapi import APIRouter, Request
from fastapi.responses import Response
from pydantic import ValidationError

from verimail.api.dashboard.uploads import (
    GONE,
    claim_pending,
    keep_pending,
    out_of_pending,
    release_claim,
    upload_preview,
)
from verimail.api.dashboard.web import (
    PREFIX,
    CheckedForm,
    CurrentAccount,
    DashboardRoute,
    StoreDep,
    check_csrf,
    plan_limits,
    redirect,
    render,
    text_field,
)
from verimail.api.deps import EngineDep
from verimail.api.errors import ApiError
from verimail.api.jobs import start_run, uploads_dir
from verimail.api.routes.finder import (
    FINDER_DISABLED,
    FindEmailRequest,
    app_settings,
    domain_pattern_route,
    find_email_route,
)
from verimail.api.routes.finder_csv import create_from_upload
from verimail.api.uploads import ReceivedUpload, receive_upload
from verimail.files.csv_columns import (
    DOMAIN_HEADERS,
    FIRST_NAME_HEADERS,
    LAST_NAME_HEADERS,
    PERSON_HEADERS_ADVICE,
    column_by_header,
)
from verimail.files.upload_errors import UploadError
from verimail.store.accounts import Account
from verimail.store.billing import balance, quote

router = APIRouter(prefix=PREFIX, route_class=DashboardRoute, include_in_schema=False)

DISABLED_WHY = (
    f"{FINDER_DISABLED} The service's operators switch it on per account "
    "(`verimail accounts set --account N --finder`); ask them, quoting your account id."
)


async def _page(
    request: Request,
    account: Account,
    store: StoreDep,
    status_code: int = 200,
    **context: Any,
) -> Response:
    bal = await to_thread.run_sync(balance, store.engine, account.id)
    values = {
        "balance": bal,
        "charge": quote("find", 1, app_settings(request)),
        "disabled_why": None if account.finder_enabled else DISABLED_WHY,
        "person": {"first_name": "", "last_name": "", "domain": ""},
        **context,
    }
    return render(request, "finder.html", values, account=account, status_code=status_code)


def _refuse_if_disabled(account: Account) -> None:
    if not account.finder_enabled:
        raise ApiError(403, DISABLED_WHY)


@router.get("/finder")
async def finder_page(request: Request, account: CurrentAccount, store: StoreDep) -> Response:
    return await _page(request, account, store)


def _validation_message(exc: ValidationError) -> str:
    names = {"first_name": "First name", "last_name": "Last name", "domain": "Domain"}
    parts = []
    for error in exc.errors():
        field = str(error["loc"][0]) if error["loc"] else ""
        parts.append(f"{names.get(field, field)}: {error['msg'].removeprefix('Value error, ')}")
    return "; ".join(parts) or "Check the name and the domain."


@router.post("/finder")
async def finder_lookup(
    request: Request,
    account: CurrentAccount,
    store: StoreDep,
    engine: EngineDep,
    form: CheckedForm,
) -> Response:
    """One person, charged like ``POST /api/find-email`` (only for a verified find)."""
    _refuse_if_disabled(account)
    person = {name: text_field(form, name, 300).strip() for name in ("first_name", "last_name")}
    person["domain"] = text_field(form, "domain", 400).strip()
    try:
        body = FindEmailRequest(**person)
    except ValidationError as exc:
        return await _page(
            request, account, store, 422, person=person, error=_validation_message(exc)
        )
    try:
        async with plan_limits(request, account):
            result = await find_email_route(body, account, store, engine, app_settings(request))
    except ApiError as exc:
        if exc.status_code not in (402, 429):
            raise
        return await _page(
            request, account, store, exc.status_code, person=person, error=exc.detail
        )
    # The domain's pattern as learned so far (this find included): what the next lookup
    # there tries first, and how established it is.
    learned = await domain_pattern_route(account, store, app_settings(request), body.domain)
    return await _page(request, account, store, person=person, result=result, learned=learned)


FINDER_FIELDS = {
    "first_name_column": "first-name column",
    "last_name_column": "last-name column",
    "domain_column": "domain column",
}


def _words(exc: ApiError, advice: str | None = None) -> str:
    """The API's refusal without its form fields (``domain_column`` …), which this page has
    not: the picker, or the headers the finder knows, name a column instead."""
    cause = exc.__cause__
    if not isinstance(cause, UploadError):
        return exc.detail
    advice = advice or f"{PERSON_HEADERS_ADVICE[:-1]}, and upload the file again."
    return cause.reworded(FINDER_FIELDS, advice if cause.advice else "")


@router.post("/finder/upload")
async def finder_upload(request: Request, account: CurrentAccount, store: StoreDep) -> Response:
    """A CSV of people: streamed to disk with the API's size cap, then a finder job; a file
    whose columns are not all recognised waits while the column picker asks for them."""
    _refuse_if_disabled(account)
    settings = app_settings(request)
    folder = uploads_dir(request) / uuid.uuid4().hex
    received = ReceivedUpload()
    async with plan_limits(request, account):
        try:
            received = await receive_upload(
                request, folder / "upload.csv", max_bytes=settings.upload_max_bytes
            )
            check_csrf(request, received.fields.get("csrf_token"))
            if received.size == 0 and not received.filename:
                raise ApiError(422, "Choose a CSV file of people.")
            job, _hook = await create_from_upload(request, account, store, settings, received)
        except ApiError as exc:
            if _columns_missing(exc):
                return await _picker(request, account, store, folder, received.filename, exc)
            shutil.rmtree(folder, ignore_errors=True)  # nothing was stored
            return await _page(request, account, store, exc.status_code, error=_words(exc))
        except BaseException:
            shutil.rmtree(folder, ignore_errors=True)
            raise
    await start_run(request, store, job)
    return redirect(f"{PREFIX}/jobs/{job.id}")


def _columns_missing(exc: ApiError) -> bool:
    """A refusal the picker answers: columns not found by their headers (not a bad file)."""
    cause = exc.__cause__
    return isinstance(cause, UploadError) and bool(cause.advice) and bool(cause.fields)


PERSON_FIELDS = (
    ("first_name_column", "First name", FIRST_NAME_HEADERS),
    ("last_name_column", "Last name", LAST_NAME_HEADERS),
    ("domain_column", "Company domain", DOMAIN_HEADERS),
)


async def _picker(
    request: Request,
    account: Account,
    store: StoreDep,
    folder: Path,
    filename: str | None,
    exc: ApiError,
) -> Response:
    """Keep the file and ask which columns hold the first names, last names and domains
    (each preselected where a header was recognised), like the verify upload's picker."""
    settings = app_settings(request)
    path = folder / "upload.csv"
    try:
        max_rows = settings.upload_max_rows
        columns, rows, width = await to_thread.run_sync(upload_preview, path, max_rows)
    except UploadError as refused:
        shutil.rmtree(folder, ignore_errors=True)
        return await _page(request, account, store, 422, error=refused.detail)
    if len(columns) < 2:  # (nothing to choose: first and last names need two columns)
        shutil.rmtree(folder, ignore_errors=True)
        return await _page(request, account, store, 422, error=_words(exc))
    token = await keep_pending(request, account.id, folder, filename)
    chosen = {name: column_by_header(columns, headers) for name, _label, headers in PERSON_FIELDS}
    picker = {
        "token": token,
        "columns": columns,
        "rows": rows,
        "width": width,
        "filename": filename,
        "fields": [(name, label, chosen[name]) for name, label, _ in PERSON_FIELDS],
        "why": _words(exc, advice="Choose the columns below."),
    }
    return await _page(request, account, store, picker=picker)


@router.post("/finder/upload/columns")
async def finder_upload_columns(
    request: Request, account: CurrentAccount, store: StoreDep, form: CheckedForm
) -> Response:
    """The picker's answer: the pending upload and its three columns; then the finder job."""
    _refuse_if_disabled(account)
    claimed = claim_pending(request, account.id, text_field(form, "upload", 4096))
    if claimed is None:
        return await _page(request, account, store, 410, error=GONE)
    folder, data = claimed
    fields = {name: text_field(form, name, 300).strip() for name, _, _ in PERSON_FIELDS}
    try:
        async with plan_limits(request, account):
            folder = out_of_pending(request, folder)
            received = ReceivedUpload(
                path=folder / "upload.csv",
                filename=data.get("filename"),
                size=(folder / "upload.csv").stat().st_size,
                fields={name: value for name, value in fields.items() if value},
            )
            try:
                settings = app_settings(request)
                job, _hook = await create_from_upload(request, account, store, settings, received)
            except ApiError as exc:
                shutil.rmtree(folder, ignore_errors=True)
                return await _page(request, account, store, exc.status_code, error=_words(exc))
    finally:
        release_claim(request, folder)
    await start_run(request, store, job)
    return redirect(f"{PREFIX}/jobs/{job.id}")
