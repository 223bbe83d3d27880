"""The account's own pages under ``/dashboard``: sign-up, login and logout, the overview,
credits, plan and API keys, and the operators' list of every account.

An account's keys are read and revoked with its own id (``revoke_key(engine, account_id, …)``),
so another account's key is a 404 exactly like an unknown one.
"""

from __future__ import annotations

from datetime import timedelta
from typing import Any

from anyio import to_thread
from email_validator import EmailNotValidError, validate_email
from fastapi import APIRouter, Request
from fastapi.responses import Response
from sqlalchemy.exc import IntegrityError

from verimail.api.dashboard.insights import account_charts
from verimail.api.dashboard.jobs import job_rows
from verimail.api.dashboard.security import (
    LOGIN_FAILURES,
    LOGIN_WINDOW_SECONDS,
    SESSION_MAX_AGE,
    hash_password,
    password_problem,
    verify_password,
)
from verimail.api.dashboard.web import (
    PAGE_SIZE,
    PREFIX,
    CheckedForm,
    CurrentAccount,
    DashboardRoute,
    MaybeAccount,
    StoreDep,
    client_address,
    dashboard_state,
    page_number,
    redirect,
    render,
    safe_next,
    session_of,
    text_field,
)
from verimail.api.errors import ApiError
from verimail.store import accounts as acc
from verimail.store import jobs as job_store
from verimail.store.billing import balance, ledger, quote
from verimail.store.db import utcnow
from verimail.store.plans import PLANS, get_plan
from verimail.store.sessions import end_session

router = APIRouter(prefix=PREFIX, route_class=DashboardRoute, include_in_schema=False)

NOTICES = {
    "welcome": "Welcome! Your account is ready, with its free credits, and you are signed "
    "in. Create an API key below to use the API, or upload a list to verify it right away.",
    "taken": "This address already has an account: log in with its password. (Forgotten "
    "it? The service's operators can set a new one.)",
    "logged_out": "You are logged out.",
    "revoked": "The key was revoked: requests using it now get 401.",
}
"""Messages a redirect may ask for by name (no text from the URL is ever shown)."""

LOGIN_FAILED = "Email or password is incorrect."
"""The same words for an unknown email and a wrong password: no account enumeration."""


def _notice(name: str | None) -> str | None:
    return NOTICES.get(name or "")


def _normalise_email(raw: str) -> str | None:
    """The address as stored (normalised, lower case), or None when it is not one."""
    try:
        checked = validate_email(raw.strip(), check_deliverability=False)
    except EmailNotValidError:
        return None
    return checked.normalized.lower()


def _email_problem(raw: str) -> str:
    """Why an address is refused, in the validator's words: "Enter a valid email address."
    alone left a person signing up with ``newbie@example.test`` guessing (``.test`` and
    the other reserved names cannot receive mail)."""
    try:
        validate_email(raw.strip(), check_deliverability=False)
    except EmailNotValidError as exc:
        return f"Enter a valid email address: {exc}"
    return "Enter a valid email address."


# --- sign-up, login, logout ----------------------------------------------------------------


@router.get("/signup")
async def signup_form(request: Request, account: MaybeAccount) -> Response:
    if account is not None:
        return redirect(PREFIX)
    return render(request, "signup.html", {"email": ""})


@router.post("/signup")
async def signup(request: Request, store: StoreDep, form: CheckedForm) -> Response:
    """Create the account and sign it in (on to the keys page: the next step); a taken
    address gets the login form with the address filled in, saying so."""
    state = dashboard_state(request)
    raw_email = text_field(form, "email", 320)
    password = text_field(form, "password", 4096)
    confirm = text_field(form, "password_confirm", 4096)
    email = _normalise_email(raw_email)
    problem = _email_problem(raw_email) if email is None else password_problem(password, confirm)
    if problem is not None:
        return render(
            request, "signup.html", {"email": raw_email, "error": problem}, status_code=422
        )
    wait = await state.throttle.signup_allowed(client_address(request))
    if wait is not None:
        return render(
            request,
            "signup.html",
            {"email": raw_email, "error": "Too many sign-ups from your address; try later."},
            status_code=429,
            headers={"Retry-After": str(wait)},
        )
    password_hash = await hash_password(password, state.hash_slots)
    settings = request.app.state.settings

    def create() -> acc.Account | None:
        if acc.email_taken(store.engine, email):
            return None
        try:
            return acc.create_account(
                store.engine, settings, plan="free", email=email, password_hash=password_hash
            )
        except IntegrityError:  # taken meanwhile
            return None

    account = await to_thread.run_sync(create)
    if account is None:
        # Said plainly (sign-ups are throttled per address, so this is no cheap way to
        # list accounts); the owner's password is not checked here: that is the login's job.
        context = {"email": raw_email, "next": PREFIX, "notice": NOTICES["taken"]}
        return render(request, "login.html", context, status_code=409)
    session_of(request).log_in(account.id, state.signer.password_fingerprint(password_hash))
    return redirect(f"{PREFIX}/keys?notice=welcome")


@router.get("/login")
async def login_form(
    request: Request,
    account: MaybeAccount,
    next: str | None = None,
    notice: str | None = None,
) -> Response:
    if account is not None:
        return redirect(safe_next(next))
    return render(
        request, "login.html", {"email": "", "next": safe_next(next), "notice": _notice(notice)}
    )


@router.post("/login")
async def login(request: Request, store: StoreDep, form: CheckedForm) -> Response:
    state = dashboard_state(request)
    raw_email = text_field(form, "email", 320)
    password = text_field(form, "password", 4096)
    target = safe_next(text_field(form, "next", 2000))
    email = _normalise_email(raw_email) or raw_email.strip().lower()
    address = client_address(request)
    context = {"email": raw_email, "next": target}
    wait = await state.throttle.login_attempt(email, address)
    if wait is not None:
        minutes = LOGIN_WINDOW_SECONDS // 60
        context["error"] = (
            f"Too many failed logins ({LOGIN_FAILURES} in {minutes} minutes). "
            f"Try again in {max(1, round(wait / 60))} minute(s)."
        )
        return render(
            request, "login.html", context, status_code=429, headers={"Retry-After": str(wait)}
        )

    account = await to_thread.run_sync(acc.get_account_by_email, store.engine, email)
    if account is None and raw_email.strip() and raw_email.strip() != email:
        # Accounts made with the CLI keep the address as it was typed.
        account = await to_thread.run_sync(
            acc.get_account_by_email, store.engine, raw_email.strip()
        )
    stored = account.password_hash if account is not None else None
    ok, rehash = await verify_password(stored, password, state.hash_slots)
    if not ok or account is None or stored is None:  # (login_attempt counted it already)
        context["error"] = LOGIN_FAILED
        return render(request, "login.html", context, status_code=400)
    await state.throttle.login_succeeded(email, address)
    if rehash:
        stored = await hash_password(password, state.hash_slots)
        await to_thread.run_sync(acc.set_password_hash, store.engine, account.id, stored)
    session_of(request).log_in(account.id, state.signer.password_fingerprint(stored))
    return redirect(target)


@router.post("/logout")
async def logout(request: Request, form: CheckedForm, store: StoreDep) -> Response:
    session = session_of(request)
    if session.account_id is not None:  # every copy of this cookie stops working too
        until = utcnow() + timedelta(seconds=SESSION_MAX_AGE)
        await to_thread.run_sync(end_session, store.engine, session.sid, until)
    session.log_out()
    return redirect(f"{PREFIX}/login?notice=logged_out")


# --- overview, credits, plan ---------------------------------------------------------------


@router.get("")
async def overview(request: Request, account: CurrentAccount, store: StoreDep) -> Response:
    bal = await to_thread.run_sync(balance, store.engine, account.id)
    recent = await to_thread.run_sync(
        lambda: job_store.list_jobs(store.engine, account.id, limit=5)
    )
    charts = await account_charts(store.engine, account.id)
    return render(
        request,
        "overview.html",
        {"balance": bal, "plan": get_plan(account.plan), "jobs": job_rows(recent), **charts},
        account=account,
    )


@router.get("/credits")
async def credits_page(
    request: Request, account: CurrentAccount, store: StoreDep, page: int = 1
) -> Response:
    page = page_number(page)
    bal = await to_thread.run_sync(balance, store.engine, account.id)
    rows = await to_thread.run_sync(
        lambda: ledger(store.engine, account.id, limit=PAGE_SIZE + 1, offset=(page - 1) * PAGE_SIZE)
    )
    return render(
        request,
        "credits.html",
        {
            "balance": bal,
            "entries": rows[:PAGE_SIZE],
            "page": page,
            "has_next": len(rows) > PAGE_SIZE,
        },
        account=account,
    )


@router.get("/plan")
async def plan_page(request: Request, account: CurrentAccount, store: StoreDep) -> Response:
    bal = await to_thread.run_sync(balance, store.engine, account.id)
    return render(
        request,
        "plan.html",
        {
            "plan": get_plan(account.plan),
            "plans": list(PLANS.values()),
            "balance": bal,
            "finder_charge": quote("find", 1, request.app.state.settings),
        },
        account=account,
    )


# --- API keys ------------------------------------------------------------------------------


async def _keys_page(
    request: Request,
    account: acc.Account,
    store: StoreDep,
    *,
    new_key: str | None = None,
    notice: str | None = None,
    error: str | None = None,
    status_code: int = 200,
) -> Response:
    keys = await to_thread.run_sync(acc.list_keys, store.engine, account.id)
    return render(
        request,
        "keys.html",
        {"keys": keys, "new_key": new_key, "notice": notice, "error": error},
        account=account,
        status_code=status_code,
    )


@router.get("/keys")
async def keys_page(
    request: Request, account: CurrentAccount, store: StoreDep, notice: str | None = None
) -> Response:
    return await _keys_page(request, account, store, notice=_notice(notice))


@router.post("/keys")
async def create_key(
    request: Request, account: CurrentAccount, store: StoreDep, form: CheckedForm
) -> Response:
    """Issue a key and show it on this one page only (it is not stored, only its hash)."""
    raw = form.get("name")
    name = (raw if isinstance(raw, str) else "").strip() or "default"
    if problem := acc.key_name_problem(name):
        return await _keys_page(request, account, store, error=problem, status_code=422)
    raw_key, _info = await to_thread.run_sync(acc.create_api_key, store.engine, account.id, name)
    return await _keys_page(request, account, store, new_key=raw_key)


@router.post("/keys/{key_id}/revoke")
async def revoke_key(
    key_id: int, account: CurrentAccount, store: StoreDep, form: CheckedForm
) -> Response:
    keys = await to_thread.run_sync(acc.list_keys, store.engine, account.id)
    if not any(k.id == key_id for k in keys):
        raise ApiError(404, f"You have no API key {key_id}.")
    await to_thread.run_sync(acc.revoke_key, store.engine, account.id, key_id)
    return redirect(f"{PREFIX}/keys?notice=revoked")


# --- operators -----------------------------------------------------------------------------


@router.get("/admin/accounts")
async def admin_accounts(
    request: Request, account: CurrentAccount, store: StoreDep, page: int = 1
) -> Response:
    """Every account, read-only, for operator accounts (``verimail accounts create --admin``)."""
    if not account.is_admin:
        raise ApiError(404, "There is no such page, or it belongs to another account.")
    page = page_number(page)

    def read() -> list[tuple[acc.Account, Any]]:
        rows = acc.list_accounts(store.engine, PAGE_SIZE + 1, (page - 1) * PAGE_SIZE)
        return [(a, balance(store.engine, a.id)) for a in rows]

    rows = await to_thread.run_sync(read)
    return render(
        request,
        "admin_accounts.html",
        {"rows": rows[:PAGE_SIZE], "page": page, "has_next": len(rows) > PAGE_SIZE},
        account=account,
    )
