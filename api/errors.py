"""One error shape for every failure: ``{"detail": "<a sentence a person understands>"}``.

FastAPI and Starlette answer some errors themselves (unknown path, wrong method, invalid
body) with terse or structured ``detail`` values; the handlers here rewrite those into
readable strings so that clients can always show ``detail`` to a person. Validation errors
keep the machine-readable list under ``errors``. An unexpected exception becomes a 500
without a stack trace; every credit charge runs inside :func:`verimail.api.billing.charged`,
which refunds on any exception, so "nothing was charged" is true when this handler runs.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import Any

from fastapi import FastAPI, Request
from fastapi.encoders import jsonable_encoder
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from sqlalchemy.exc import OperationalError
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.routing import Match

from verimail.schemas.errors import ErrorBody

log = logging.getLogger("verimail.api")

INTERNAL_ERROR = "Internal error; nothing was charged."
DATABASE_UNAVAILABLE = (
    "The database is unavailable right now; nothing was charged. Try again shortly."
)
DATABASE_RETRY_AFTER = 5  # seconds suggested to clients when the database is down


class ApiError(Exception):
    """An error with a status and a readable detail, raised anywhere in a request."""

    def __init__(self, status_code: int, detail: str, headers: dict[str, str] | None = None):
        super().__init__(detail)
        self.status_code = status_code
        self.detail = detail
        self.headers = headers


def error_response(
    status_code: int, detail: str, headers: dict[str, str] | None = None
) -> JSONResponse:
    """The one way this API answers an error."""
    return JSONResponse({"detail": detail}, status_code=status_code, headers=headers)


def error_doc(description: str, **extra: Any) -> dict[str, Any]:
    """An OpenAPI ``responses`` entry for an error status with the ``{"detail"}`` model."""
    return {"model": ErrorBody, "description": description, **extra}


RETRY_AFTER_HEADER = {
    "Retry-After": {
        "description": "Whole seconds to wait before retrying (at least 1).",
        "schema": {"type": "integer", "minimum": 1},
    }
}

COMMON_ERRORS: dict[int | str, dict[str, Any]] = {
    500: error_doc(f"Unexpected server error. The body is always `{INTERNAL_ERROR}`"),
    503: error_doc(
        "Not possible right now — the database is unreachable, the verifier is not ready, or "
        "a job could not be started; nothing was charged (a job's reservation is refunded). "
        "Retry after `Retry-After` seconds.",
        headers=RETRY_AFTER_HEADER,
    ),
}

AUTH_ERRORS: dict[int | str, dict[str, Any]] = {
    401: error_doc(
        "Missing, malformed, unknown or revoked API key "
        "(`Authorization: Bearer <API_KEY>`). Carries `WWW-Authenticate: Bearer`.",
        headers={
            "WWW-Authenticate": {"description": "Always `Bearer`.", "schema": {"type": "string"}}
        },
    ),
    429: error_doc(
        "Too many requests per minute, or too many requests in flight at once, for the "
        "account's plan.",
        headers=RETRY_AFTER_HEADER,
    ),
}


def pick_error_docs(
    table: dict[int | str, dict[str, Any]], codes: Sequence[int]
) -> dict[int | str, dict[str, Any]]:
    """An endpoint's documented errors: the auth and common ones, plus ``codes`` of ``table``."""
    merged = {**AUTH_ERRORS, **table, **COMMON_ERRORS}
    keep = {*AUTH_ERRORS, *COMMON_ERRORS, *codes}
    return {k: v for k, v in sorted(merged.items(), key=lambda i: str(i[0])) if k in keep}


# --- readable validation messages ---------------------------------------------------------


def _where(loc: Sequence[str | int]) -> str:
    """``("body", "emails", 3)`` -> ``emails[3]``; the body itself -> ``request body``."""
    parts = list(loc)
    if parts and parts[0] in ("body", "query", "path", "header", "cookie"):
        parts = parts[1:]
    text = ""
    for part in parts:
        if isinstance(part, int):
            text += f"[{part}]"
        else:
            text += f".{part}" if text else str(part)
    return text or "request body"


def _plural(n: int, noun: str) -> str:
    if n == 1:
        return f"{n} {noun}"
    return f"{n} {noun}es" if noun.endswith("s") else f"{n} {noun}s"


def describe_issue(error: dict[str, Any]) -> str:
    """One validation error as ``where: what``, worded for people rather than validators."""
    kind = error.get("type", "")
    loc = tuple(error.get("loc", ()))
    ctx = error.get("ctx") or {}
    where = _where(loc)
    field = next((p for p in reversed(loc) if isinstance(p, str)), "")
    noun = "address" if field == "emails" else "item"
    if kind == "json_invalid":
        position = loc[1] if len(loc) > 1 and isinstance(loc[1], int) else None
        at = f" at character {position}" if position is not None else ""
        return f"request body is not valid JSON ({ctx.get('error', 'parse error')}{at})"
    if kind == "missing":
        if where == "request body":
            return "request body required: send a JSON object (Content-Type: application/json)"
        return f"{where}: field required"
    if kind in ("model_attributes_type", "dict_type", "model_type"):
        if where == "request body":
            return (
                "request body must be a JSON object (send it with Content-Type: application/json)"
            )
        return f"{where}: must be a JSON object"
    if kind == "string_type":
        return f"{where}: must be a string"
    if kind == "list_type":
        return f"{where}: must be a JSON array of strings"
    if kind == "string_too_long":
        return f"{where}: at most {_plural(ctx.get('max_length', 0), 'character')}"
    if kind == "string_too_short":
        return f"{where}: at least {_plural(ctx.get('min_length', 0), 'character')}"
    if kind == "too_long":
        suffix = " per request" if field == "emails" else ""
        return f"{where}: at most {_plural(ctx.get('max_length', 0), noun)}{suffix}"
    if kind == "too_short":
        return f"{where}: at least {_plural(ctx.get('min_length', 0), noun)}"
    msg = str(error.get("msg", "invalid value"))
    if msg[1:2].islower():  # "Field required" -> "field required"; "URL scheme …" stays
        msg = msg[:1].lower() + msg[1:]
    return f"{where}: {msg}"


def _issues(errors: Sequence[Any]) -> list[dict[str, Any]]:
    """The structured list without the echoed input (which can be 500 addresses long)."""
    out = []
    for error in errors:
        item = {
            "type": error.get("type", ""),
            "loc": list(error.get("loc", ())),
            "msg": str(error.get("msg", "")),
        }
        if error.get("ctx"):
            item["ctx"] = jsonable_encoder(
                {
                    k: (v if isinstance(v, int | float | str | bool) else str(v))
                    for k, v in error["ctx"].items()
                }
            )
        out.append(item)
    return out


MAX_DETAIL_ISSUES = 5
"""Problems spelled out in ``detail``; the rest are counted (all are in ``errors``)."""


def validation_detail(errors: Sequence[Any]) -> str:
    """The problems in one string, duplicates removed, in the order found."""
    seen: list[str] = []
    for error in errors:
        text = describe_issue(error)
        if text not in seen:
            seen.append(text)
    if len(seen) > MAX_DETAIL_ISSUES:
        more = len(seen) - MAX_DETAIL_ISSUES
        seen = [*seen[:MAX_DETAIL_ISSUES], f"and {more} more (see `errors`)"]
    return "; ".join(seen) or "request is invalid"


# --- handlers ------------------------------------------------------------------------------


HTTP_METHODS = ("DELETE", "GET", "HEAD", "OPTIONS", "PATCH", "POST", "PUT")


def _allowed_methods(request: Request) -> str:
    """Every method some route serves at this path, for ``Allow``.

    Starlette names only the methods of the first route whose path matched, so a path
    served by several routes (GET, PUT and DELETE of one resource) listed one of three.
    """
    routes = request.app.router.routes
    allowed = [
        method
        for method in HTTP_METHODS
        if any(
            route.matches({**request.scope, "method": method})[0] is Match.FULL for route in routes
        )
    ]
    return ", ".join(allowed)


def _http_detail(
    request: Request, exc: StarletteHTTPException, headers: dict[str, str] | None
) -> str:
    """Starlette's own one-word details, made into sentences (``headers``: the answer's)."""
    detail = exc.detail
    if exc.status_code == 404 and detail == "Not Found":
        return (
            f"Not found: there is no endpoint at {request.url.path}. The API is described at /docs."
        )
    if exc.status_code == 405 and detail == "Method Not Allowed":
        allowed = (headers or {}).get("Allow") or ""
        hint = f"; use {allowed}" if allowed else ""
        return f"Method {request.method} is not allowed on {request.url.path}{hint}."
    if not isinstance(detail, str):
        return str(detail)
    return detail


UNREADABLE_BODY = "There was an error parsing the body"
"""FastAPI's 400 for a body it could not decode at all (e.g. JSON that is not UTF-8)."""


async def _on_http_exception(request: Request, exc: Exception) -> JSONResponse:
    assert isinstance(exc, StarletteHTTPException)
    if exc.status_code == 400 and exc.detail == UNREADABLE_BODY:
        # Undocumented, and the same fault as invalid JSON: answer it as the 422 that is.
        # (not UTF-8, or nested too deeply for the parser)
        issue = {"type": "json_invalid", "loc": ["body"], "msg": "body could not be read as JSON"}
        detail = "request body could not be read as JSON (it must be UTF-8, not nested too deeply)"
        return JSONResponse({"detail": detail, "errors": [issue]}, status_code=422)
    headers = exc.headers
    if exc.status_code == 405 and exc.detail == "Method Not Allowed":
        allowed = _allowed_methods(request)
        if allowed:
            headers = {**(headers or {}), "Allow": allowed}
    return error_response(exc.status_code, _http_detail(request, exc, headers), headers)


async def _on_api_error(request: Request, exc: Exception) -> JSONResponse:
    assert isinstance(exc, ApiError)
    return error_response(exc.status_code, exc.detail, exc.headers)


async def _on_validation_error(request: Request, exc: Exception) -> JSONResponse:
    assert isinstance(exc, RequestValidationError)
    errors = exc.errors()
    if any(tuple(e.get("loc", ()))[:2] == ("path", "job_id") for e in errors):
        # A job id that is not a number names no job: SPEC §4 gives endpoints 4 and 5 a
        # 404 for that, not a 422 (the range check of store/jobs answers the same).
        wanted = request.path_params.get("job_id", "")
        return error_response(404, f"No bulk job {wanted!r} for this account.")
    return JSONResponse(
        {"detail": validation_detail(errors), "errors": _issues(errors)}, status_code=422
    )


async def _on_database_error(request: Request, exc: Exception) -> JSONResponse:
    log.warning("database unavailable during %s %s: %s", request.method, request.url.path, exc)
    return error_response(503, DATABASE_UNAVAILABLE, {"Retry-After": str(DATABASE_RETRY_AFTER)})


async def _on_unexpected(request: Request, exc: Exception) -> JSONResponse:
    # Starlette logs the traceback after this handler answered; the client sees no trace.
    log.error("unexpected error in %s %s", request.method, request.url.path, exc_info=exc)
    return error_response(500, INTERNAL_ERROR)


def install_error_handlers(app: FastAPI) -> None:
    """Route every kind of failure to a ``{"detail": str}`` body."""
    app.add_exception_handler(StarletteHTTPException, _on_http_exception)
    app.add_exception_handler(ApiError, _on_api_error)
    app.add_exception_handler(RequestValidationError, _on_validation_error)
    app.add_exception_handler(OperationalError, _on_database_error)
    app.add_exception_handler(Exception, _on_unexpected)
