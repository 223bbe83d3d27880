"""The dashboard's table of contents: :func:`page_routers` lists every module of pages
(results, the finder, re-verification, uploads, the account's own pages, "try one
address", jobs) in the order the app includes them, and this module's router ends them with
the catch-all that answers any other path. Its lifespan sets up, once the app's own start-up
made the settings and the limiter, the state every page uses (session signer, login
throttle, password-hash slots).

Everything an account sees is read with its own id (``get_job(engine, account_id, …)``,
``revoke_key(engine, account_id, …)``), so another account's job or key is a 404 exactly
like an unknown one. Work that costs credits goes through the same code as the API:
:func:`~verimail.api.billing.charged` for a single address, under the plan's limits.
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator
from typing import Any

from anyio import to_thread
from fastapi import APIRouter, Request
from fastapi.responses import Response
from fastapi.routing import APIRoute

from verimail.api.dashboard import account as account_pages
from verimail.api.dashboard import finder as finder_pages
from verimail.api.dashboard import job_actions as job_action_pages
from verimail.api.dashboard import jobs as job_pages
from verimail.api.dashboard import results as results_pages
from verimail.api.dashboard import reverify as reverify_pages
from verimail.api.dashboard import uploads as upload_pages
from verimail.api.dashboard import verify as verify_pages
from verimail.api.dashboard.security import Signer, Throttle, load_secret, new_hash_slots
from verimail.api.dashboard.web import (
    PREFIX,
    DashboardRoute,
    DashboardState,
    error_page,
    redirect,
)


@contextlib.asynccontextmanager
async def lifespan(app: Any) -> AsyncIterator[None]:
    """Inside the app's lifespan (which made settings and limiter): the dashboard's state."""
    settings = app.state.settings
    secret = await to_thread.run_sync(load_secret, settings)
    limiter = app.state.limiter
    throttle = Throttle(limiter.redis_url, prefix=limiter.prefix)
    app.state.dashboard = DashboardState(Signer(secret), throttle, new_hash_slots())
    try:
        yield
    finally:
        await throttle.close()


router = APIRouter(
    prefix=PREFIX, route_class=DashboardRoute, include_in_schema=False, lifespan=lifespan
)


_ANY_METHOD = ["GET", "HEAD", "POST", "PUT", "PATCH", "DELETE", "OPTIONS"]


@router.api_route("/{rest:path}", methods=_ANY_METHOD)
async def not_found(request: Request, rest: str) -> Response:
    """Unknown dashboard paths get an HTML 404, not the API's JSON one; a page asked with a
    method it does not take gets an HTML 405 naming those it does (before, Starlette's JSON
    405, without the dashboard's security headers)."""
    allowed = _methods_for(request)
    if allowed:
        return error_page(
            request, 405, "This page cannot be used that way.", {"Allow": ", ".join(allowed)}
        )
    if rest == "" and request.method == "GET":
        return redirect(PREFIX)
    return error_page(request, 404, "There is no such page.")


def page_routers() -> tuple[APIRouter, ...]:
    """Every router of dashboard pages, in the order the app includes them: the modules split
    by resource first, this one (whose catch-all ends the dashboard) last. The one list both
    the app and the catch-all's ``Allow`` read, so a new page module cannot miss either."""
    return (
        results_pages.router,
        finder_pages.router,
        reverify_pages.router,
        upload_pages.router,
        account_pages.router,
        verify_pages.router,
        job_pages.router,
        job_action_pages.router,
        router,
    )


def _methods_for(request: Request) -> list[str]:
    """The methods the dashboard's other routes take at this path (none: no such page)."""
    methods: set[str] = set()
    for route in (route for pages in page_routers() for route in pages.routes):
        others = isinstance(route, APIRoute) and route.endpoint is not not_found
        if others and route.path_regex.match(request.url.path):
            methods |= route.methods or set()
    return sorted(methods)
