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
from typing import Any

from anyio import to_thread
from fastapi import APIRouter, Request
from fastapi.responses import Response
from pydantic import ValidationError

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
from verimail.api.jobs import dropped_on_failure, start_run, uploads_dir
from verimail.api.routes.finder import (
    FINDER_DISABLED,
    FindEmailRequest,
    app_settings,
    domain_pattern_route,
    find_email_route,
)
from verimail.api.routes.finder_csv import create_from_upload
from verimail.api.uploads import receive_upload
from verimail.store.accounts import Account
from verimail.store.billing.pools import balance
from verimail.store.billing.prices import price

router = APIRouter(prefix=PREFIX, route_class=DashboardRoute, include_in_schema=False)

DISABLED_WHY = (
    f"{FINDER_DISABLED} The service's operators switch it on per account "
    "(`verimail accounts set --id N --finder`); ask them, quoting your account id."
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
        "charge": price("find", 1, app_settings(request)),
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


@router.post("/finder/upload")
async def finder_upload(request: Request, account: CurrentAccount, store: StoreDep) -> Response:
    """A CSV of people: streamed to disk with the API's size cap, then a finder job."""
    _refuse_if_disabled(account)
    settings = app_settings(request)
    folder = uploads_dir(request) / uuid.uuid4().hex
    async with plan_limits(request, account):
        try:
            with dropped_on_failure(folder):
                received = await receive_upload(
                    request, folder / "upload.csv", max_bytes=settings.upload_max_bytes
                )
                check_csrf(request, received.fields.get("csrf_token"))
                if received.size == 0 and not received.filename:
                    raise ApiError(422, "Choose a CSV file of people.")
                job, _hook = await create_from_upload(request, account, store, settings, received)
        except ApiError as exc:  # nothing was stored (dropped_on_failure removed it)
            shutil.rmtree(folder, ignore_errors=True)
            return await _page(request, account, store, exc.status_code, error=exc.detail)
    await start_run(request, store, job)
    return redirect(f"{PREFIX}/jobs/{job.id}")
