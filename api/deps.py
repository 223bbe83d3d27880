"""Request dependencies: the store, the engine, the caller's account and its plan's limits.

Order matters and is fixed here: authenticate (401) → request rate (429) → concurrency
(429). Only authenticated requests count against an account; unauthenticated ones are
refused before any counter moves. Every authenticated request counts against the rate,
whatever its outcome (402, 422 …), as the plan table is about requests, not credits.
"""

from __future__ import annotations

import time
from collections.abc import AsyncIterator
from typing import Annotated

from anyio import to_thread
from fastapi import Depends, Request, Security
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer
from pydantic import BeforeValidator

from verimail.api.errors import DATABASE_RETRY_AFTER, DATABASE_UNAVAILABLE, ApiError
from verimail.api.ratelimit import Limiter
from verimail.engine import Engine
from verimail.store.accounts import KEY_PREFIX, Account, authenticate
from verimail.store.db import Store, migrate
from verimail.store.plans import get_plan

bearer_scheme = HTTPBearer(
    auto_error=False,
    bearerFormat="vm_<43 characters>",
    description="Your API key: `Authorization: Bearer <API_KEY>`. Keys are issued per account.",
)

_CHALLENGE = {"WWW-Authenticate": "Bearer"}
_HOW = "send the header `Authorization: Bearer <API_KEY>`"


def _unauthorized(detail: str) -> ApiError:
    return ApiError(401, detail, dict(_CHALLENGE))


MIGRATE_RETRY_SECONDS = 2.0
"""While the database is down, a new migration attempt at most this often (others: 503)."""


async def get_store(request: Request) -> Store:
    """The app's store, migrated; retries the start-up migration if the database was down.

    Attempts are spaced by :data:`MIGRATE_RETRY_SECONDS` so that a burst of requests to a
    dead database answers 503 at once instead of queueing on connection attempts.
    """
    state = request.app.state
    if state.store_migrated:
        return state.store
    unavailable = ApiError(503, DATABASE_UNAVAILABLE, {"Retry-After": str(DATABASE_RETRY_AFTER)})
    async with state.migrate_lock:
        if state.store_migrated:
            return state.store
        if time.monotonic() < state.migrate_retry_at:
            raise unavailable
        try:
            await to_thread.run_sync(migrate, state.store.engine)
        except Exception as exc:
            state.migrate_retry_at = time.monotonic() + MIGRATE_RETRY_SECONDS
            raise unavailable from exc
        state.store_migrated = True
    return state.store


async def get_engine(request: Request) -> Engine:
    """The app's verification engine (one per app, shared by all requests)."""
    engine: Engine | None = request.app.state.engine
    if engine is None:
        raise ApiError(
            503,
            "The verifier is not ready (no DNS resolver could be configured); nothing was charged.",
            {"Retry-After": str(DATABASE_RETRY_AFTER)},
        )
    return engine


def _bearer_token(request: Request) -> str:
    """The raw key from ``Authorization: Bearer <key>``, or a 401 saying what is wrong."""
    header = request.headers.get("authorization")
    if header is None or not header.strip():
        raise _unauthorized(f"Missing API key: {_HOW}.")
    scheme, _, token = header.strip().partition(" ")
    if scheme.lower() != "bearer":
        if KEY_PREFIX in scheme:  # the key alone, or glued to "Bearer:": never echo it back
            raise _unauthorized(f"The API key must follow the word Bearer and a space: {_HOW}.")
        if scheme.isascii() and scheme.isalpha() and len(scheme) <= 20:  # Basic, Token, ...
            raise _unauthorized(f"Unsupported authorization scheme {scheme!r}: {_HOW}.")
        raise _unauthorized(f"Unsupported Authorization header: {_HOW}.")  # (maybe a secret)
    token = token.strip()
    if not token or " " in token:
        raise _unauthorized(f"Malformed Authorization header: {_HOW}.")
    return token


async def current_account(
    request: Request,
    store: Annotated[Store, Depends(get_store)],
    _credentials: Annotated[HTTPAuthorizationCredentials | None, Security(bearer_scheme)],
) -> Account:
    """The account owning the presented key; 401 for missing, malformed, unknown or revoked.

    Looked up on every request (one indexed read), so a revoked key stops working at once.
    ``_credentials`` is declared only so OpenAPI shows the Bearer scheme; the header is
    parsed here to give a precise reason.
    """
    token = _bearer_token(request)
    account = await to_thread.run_sync(authenticate, store.engine, token)
    if account is None:
        raise _unauthorized("Invalid API key: it is unknown or has been revoked.")
    return account


async def limited_account(
    request: Request, account: Annotated[Account, Depends(current_account)]
) -> AsyncIterator[Account]:
    """The account, after its plan's rate and concurrency limits admitted this request.

    The concurrency slot is held until the endpoint returns (``scope="function"`` where
    this is used), i.e. released before the response is sent, so a client that waits for
    each answer never trips its own cap.
    """
    limiter: Limiter = request.app.state.limiter
    plan = get_plan(account.plan)
    refusal = await limiter.hit(account.id, plan.requests_per_minute)
    if refusal is not None:
        raise ApiError(429, refusal.detail, {"Retry-After": str(refusal.retry_after)})
    async with limiter.slot(account.id, plan.concurrent) as refusal:
        if refusal is not None:
            raise ApiError(429, refusal.detail, {"Retry-After": str(refusal.retry_after)})
        yield account


StoreDep = Annotated[Store, Depends(get_store)]
EngineDep = Annotated[Engine, Depends(get_engine)]
AccountDep = Annotated[Account, Depends(limited_account, scope="function")]
"""The caller's account with its limits enforced: what authenticated endpoints take."""


def _decimal_id(value: object) -> object:
    """A job id in a path is plain decimal digits: int() alone also took ``1_0`` (job 10),
    ``+1`` and `` 1``, so one job answered at many URLs."""
    if isinstance(value, str) and not (value.isascii() and value.isdigit()):
        raise ValueError("a job id is a number")
    return value


JobId = Annotated[int, BeforeValidator(_decimal_id)]
"""A numeric job id in a path (a malformed one is answered like an unknown job)."""
