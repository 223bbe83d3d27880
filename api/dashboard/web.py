"""The dashboard's plumbing: per-app state, HTML errors, the session cookie, CSRF, login.

Every dashboard route uses :class:`DashboardRoute`, which

* loads the session from its signed cookie before the endpoint (and its dependencies) run,
  and writes the cookie back afterwards when it changed;
* turns errors into HTML pages with the right status — the API's handlers answer JSON,
  which is right for API clients and unreadable in a browser — and a missing login into
  a redirect to the login page;
* adds headers every page needs: ``Cache-Control: no-store`` (pages show balances and,
  once, new API keys), a strict Content-Security-Policy (no inline script or style; no
  framing), ``nosniff`` and a same-origin referrer policy.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import AsyncIterator, Callable, Coroutine
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Annotated, Any
from urllib.parse import quote, unquote, urlsplit

import anyio
from anyio import to_thread
from fastapi import Depends, Request, Response
from fastapi.exceptions import RequestValidationError
from fastapi.routing import APIRoute
from fastapi.templating import Jinja2Templates
from sqlalchemy import Engine
from sqlalchemy.exc import OperationalError
from starlette.datastructures import FormData
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.responses import RedirectResponse

from verimail.api.dashboard import labels
from verimail.api.dashboard.security import (
    COOKIE_PATH,
    SESSION_COOKIE,
    SESSION_MAX_AGE,
    Session,
    Signer,
    Throttle,
)
from verimail.api.deps import get_store, limited_account
from verimail.api.errors import DATABASE_UNAVAILABLE, ApiError, validation_detail
from verimail.schemas.limits import MAX_INT
from verimail.schemas.status_groups import groups
from verimail.store.accounts import Account, get_account
from verimail.store.db import Store
from verimail.store.jobs import Job, get_job
from verimail.store.sessions import session_ended

log = logging.getLogger("verimail.dashboard")

PACKAGE_DIR = Path(__file__).resolve().parent.parent
TEMPLATES_DIR = PACKAGE_DIR / "templates"
STATIC_DIR = PACKAGE_DIR / "static"
PREFIX = "/dashboard"

SECURITY_HEADERS = {
    "Cache-Control": "no-store",
    "Content-Security-Policy": (
        "default-src 'self'; script-src 'self'; style-src 'self'; img-src 'self' data:; "
        "connect-src 'self'; form-action 'self'; frame-ancestors 'none'; base-uri 'none'; "
        "object-src 'none'"
    ),
    "X-Frame-Options": "DENY",
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "same-origin",
}


def _when(value: datetime | str | None) -> str:
    """A time as people read it; an API field's ISO 8601 text too (a page once showed
    ``2026-12-07T12:53:41.215039Z``)."""
    if isinstance(value, str):
        try:
            value = datetime.fromisoformat(value)
        except ValueError:
            return value
    return value.strftime("%Y-%m-%d %H:%M UTC") if value else "—"


def _number(value: int | None) -> str:
    return "—" if value is None else f"{value:,}"


templates = Jinja2Templates(directory=str(TEMPLATES_DIR))
templates.env.filters["when"] = _when
templates.env.filters["number"] = _number
templates.env.filters["status_groups"] = groups  # (the one grouping: schemas/status_groups)
templates.env.filters.update(
    kind_label=labels.kind_label,
    status_label=labels.status_label,
    sub_status_label=labels.sub_status_label,
    ledger_kind_label=labels.ledger_kind_label,
    reason_label=labels.reason_label,
    reference_label=labels.reference_label,
)


@dataclass
class DashboardState:
    """Made at app start-up: the secret's signer, the throttle, the hashing cap."""

    signer: Signer
    throttle: Throttle
    hash_slots: anyio.CapacityLimiter


def dashboard_state(request: Request) -> DashboardState:
    return request.app.state.dashboard


def session_of(request: Request) -> Session:
    """The request's session (loaded by :class:`DashboardRoute`)."""
    return request.state.dashboard_session


# --- errors and redirects ------------------------------------------------------------------


class LoginRequired(Exception):
    """The page needs a signed-in account: answered with a redirect to the login form."""


class CsrfRejected(Exception):
    """A form without a valid CSRF token (or sent from another site): a 403 page."""


CSRF_DETAIL = (
    "This form has expired or did not come from this site, so it was not processed. "
    "Go back, reload the page and send it again. (Are cookies blocked?)"
)


def safe_next(target: str | None) -> str:
    """``target`` when it is a dashboard path on this site, else the overview (no open redirect)."""
    if not target or "\\" in target or any(ord(c) < 32 for c in target):
        return PREFIX
    parts = urlsplit(target)
    if parts.scheme or parts.netloc or not target.startswith("/"):
        return PREFIX
    if parts.path != PREFIX and not parts.path.startswith(PREFIX + "/"):
        return PREFIX
    # A browser resolves dot segments (also percent-encoded) before it asks: "/dashboard/.."
    # leaves the dashboard, and "/dashboard/..//host" becomes a path starting "//".
    segments = unquote(parts.path).split("/")[1:]
    if any(segment in (".", "..", "") for segment in segments[:-1]) or segments[-1] in (".", ".."):
        return PREFIX
    return target


def redirect(url: str) -> RedirectResponse:
    """303: the browser follows with a GET, so a reload never re-sends a form."""
    return RedirectResponse(url, status_code=303)


def render(
    request: Request,
    template: str,
    context: dict[str, Any] | None = None,
    *,
    status_code: int = 200,
    account: Account | None = None,
    headers: dict[str, str] | None = None,
) -> Response:
    """A page: ``template`` with the session's CSRF token and the signed-in account."""
    session = session_of(request)
    values = {
        "account": account,
        "csrf_token": dashboard_state(request).signer.csrf_token(session),
        "prefix": PREFIX,
        **(context or {}),
    }
    return templates.TemplateResponse(
        request, template, values, status_code=status_code, headers=headers
    )


def error_page(
    request: Request, status_code: int, detail: str, headers: dict[str, str] | None = None
) -> Response:
    titles = {
        400: "Bad request",
        402: "Not enough credits",
        403: "Forbidden",
        404: "Not found",
        409: "Not ready yet",
        413: "Upload too large",
        422: "Cannot use this request",
        429: "Too many requests",
        500: "Something went wrong",
        503: "Temporarily unavailable",
    }
    return render(
        request,
        "error.html",
        {"status": status_code, "title": titles.get(status_code, "Error"), "detail": detail},
        status_code=status_code,
        headers=headers,
    )


def _http_detail(exc: StarletteHTTPException) -> str:
    if exc.status_code == 404:
        return "There is no such page, or it belongs to another account."
    if exc.status_code == 405:
        return "This page cannot be used that way."
    return str(exc.detail)


def _finish(request: Request, response: Response) -> Response:
    """Write the session cookie back if it changed; add the security headers."""
    session: Session | None = getattr(request.state, "dashboard_session", None)
    if session is not None and session.changed:
        signer = dashboard_state(request).signer
        response.set_cookie(
            SESSION_COOKIE,
            signer.dump_session(session),
            max_age=SESSION_MAX_AGE if session.account_id is not None else None,
            path=COOKIE_PATH,
            secure=request.url.scheme == "https",
            httponly=True,
            samesite="lax",
        )
    for name, value in SECURITY_HEADERS.items():
        response.headers.setdefault(name, value)
    return response


class DashboardRoute(APIRoute):
    """An APIRoute that speaks HTML: session in, cookie and headers out, errors as pages."""

    def get_route_handler(self) -> Callable[[Request], Coroutine[Any, Any, Response]]:
        original = super().get_route_handler()

        async def handler(request: Request) -> Response:
            signer = dashboard_state(request).signer
            session = signer.load_session(request.cookies.get(SESSION_COOKIE)) or Session.new()
            request.state.dashboard_session = session
            try:
                response = await original(request)
            except LoginRequired:
                target = request.url.path
                if request.method == "GET" and request.url.query:
                    target += "?" + request.url.query
                response = redirect(f"{PREFIX}/login?next={quote(target, safe='/')}")
            except CsrfRejected:
                response = error_page(request, 403, CSRF_DETAIL)
            except ApiError as exc:
                response = error_page(request, exc.status_code, exc.detail, exc.headers)
            except StarletteHTTPException as exc:
                response = error_page(request, exc.status_code, _http_detail(exc), exc.headers)
            except RequestValidationError as exc:
                response = error_page(request, 422, validation_detail(exc.errors()))
            except OperationalError as exc:
                log.warning("database unavailable during %s: %s", request.url.path, exc)
                response = error_page(request, 503, DATABASE_UNAVAILABLE, {"Retry-After": "5"})
            except Exception:
                log.exception("unexpected error in %s %s", request.method, request.url.path)
                response = error_page(request, 500, "Internal error; nothing was charged.")
            return _finish(request, response)

        return handler


# --- dependencies --------------------------------------------------------------------------

StoreDep = Annotated[Store, Depends(get_store)]


def _signed_in(engine: Engine, account_id: int, sid: str) -> Account | None:
    """The session's account, unless the session was logged out (from another copy)."""
    return None if session_ended(engine, sid) else get_account(engine, account_id)


async def optional_account(request: Request, store: StoreDep) -> Account | None:
    """The signed-in account, or None. Logging out, a deleted account or a changed password
    ends the session (every copy of its cookie)."""
    session = session_of(request)
    if session.account_id is None:
        return None
    account = await to_thread.run_sync(_signed_in, store.engine, session.account_id, session.sid)
    signer = dashboard_state(request).signer
    if (
        account is None
        or account.password_hash is None
        or session.pw is None
        or signer.password_fingerprint(account.password_hash) != session.pw
    ):
        session.log_out()
        return None
    return account


async def require_account(
    account: Annotated[Account | None, Depends(optional_account)],
) -> Account:
    """The signed-in account; anyone else is sent to the login form."""
    if account is None:
        raise LoginRequired
    return account


MaybeAccount = Annotated[Account | None, Depends(optional_account)]
CurrentAccount = Annotated[Account, Depends(require_account)]


def check_origin(request: Request) -> None:
    """Refuse a form a browser says came from another site (the token is checked as well)."""
    if request.headers.get("sec-fetch-site") == "cross-site":
        raise CsrfRejected


def check_csrf(request: Request, token: object) -> None:
    """Raise :class:`CsrfRejected` unless ``token`` is this session's CSRF token."""
    check_origin(request)
    if not dashboard_state(request).signer.csrf_ok(session_of(request), token):
        raise CsrfRejected


async def csrf_form(request: Request) -> FormData:
    """The submitted (URL-encoded) form, once its CSRF token checked out."""
    check_origin(request)
    try:
        form = await request.form(max_files=0, max_fields=20)
    except Exception:
        raise CsrfRejected from None
    check_csrf(request, form.get("csrf_token"))
    return form


CheckedForm = Annotated[FormData, Depends(csrf_form)]


def text_field(form: FormData, name: str, max_length: int = 1024) -> str:
    """A text field of the form (files and oversized values count as empty)."""
    value = form.get(name)
    if not isinstance(value, str) or len(value) > max_length:
        return ""
    return value


PAGE_SIZE = 25
"""Rows per page of the dashboard's paged lists (ledger, jobs, the operators' accounts)."""


def page_number(page: int) -> int:
    """A page number the queries can take: from 1 to the last page an Integer id allows
    (beyond that every page is empty anyway)."""
    return min(max(page, 1), MAX_INT // PAGE_SIZE)


async def own_job(store: Store, account_id: int, job_id: int) -> Job:
    """The account's job ``job_id``; another account's is a 404 exactly like an unknown one."""
    job = await to_thread.run_sync(get_job, store.engine, account_id, job_id)
    if job is None:
        raise ApiError(404, f"You have no job {job_id}.")
    return job


def client_address(request: Request) -> str:
    return request.client.host if request.client else "unknown"


@contextlib.asynccontextmanager
async def plan_limits(request: Request, account: Account) -> AsyncIterator[None]:
    """The API's per-plan rate and concurrency limits (429) around work the dashboard starts.

    Trying an address or uploading a list here is the same work as through the API, so it
    counts the same: the API's own dependency is reused as a context manager.
    """
    async with contextlib.asynccontextmanager(limited_account)(request, account):
        yield
