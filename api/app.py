"""The FastAPI application: ``create_app(settings)`` wires routes, errors and shared state.

Per app (set up in the lifespan, torn down with it): the store (migrated at start-up), one
verification :class:`~verimail.engine.core.Engine` shared by all requests (its DNS cache
and SMTP politeness limits only work if requests share it), the rate/concurrency
:class:`~verimail.api.ratelimit.Limiter`, and the start time for ``uptime_seconds``.

A database that is down at start-up does not stop the app: it starts, reports itself
unhealthy (503) and retries the migration on the next request that needs the store. An
orchestrator then sees a clear health signal instead of a crash loop. Start-up stays fast:
nothing here imports Prefect.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from datetime import UTC, datetime

from anyio import to_thread
from fastapi import FastAPI
from fastapi_offline import FastAPIOffline
from sqlalchemy.exc import OperationalError

from verimail import API_VERSION
from verimail.api import docs_pages
from verimail.api.body_limit import BodyLimitMiddleware
from verimail.api.dashboard import install_dashboard
from verimail.api.errors import install_error_handlers
from verimail.api.metrics import install_metrics
from verimail.api.openapi_doc import install_openapi
from verimail.api.ratelimit import Limiter
from verimail.api.routes import (
    account,
    bulk,
    finder,
    finder_csv,
    health,
    job_actions,
    job_list,
    reverify,
    usage,
    verify,
)
from verimail.api.routes.health import verifier_ready
from verimail.config import Settings, get_settings
from verimail.engine import Engine
from verimail.jobs.create import JobRunner
from verimail.jobs.recovery import Reaper
from verimail.runners import LocalRunner, make_runner
from verimail.store.db import Store, init_store, make_engine

log = logging.getLogger("verimail.api")

DOCS_ASSETS_URL = "/docs-assets"  # Swagger UI and ReDoc scripts, served by the app

DESCRIPTION = """\
Email verification: syntax, DNS/MX, live SMTP and catch-all checks, billed in credits.

Every endpoint except `/api/health` needs an API key: `Authorization: Bearer <API_KEY>`.
Every error body is `{"detail": "<readable explanation>"}` (422 adds a structured `errors`).
Requests per minute and requests in flight are limited per account by its plan; over the
limit the answer is 429 with `Retry-After`.

The server bounds every request before it reaches an endpoint: a body over the body limit
(4 MiB by default; CSV uploads have their own, larger limit) is 413 and a body that stops
arriving is 408, whatever the endpoint; a request line and headers over 16 KiB are 431;
headers not complete within 10 s are 408; a connection over the server's connection cap
gets 503 with `Retry-After`. Each of these closes the connection.
"""


def _open_store(settings: Settings) -> tuple[Store, bool]:
    """The migrated store, or an unmigrated one (and False) when the database is down."""
    try:
        return init_store(settings), True
    except OperationalError as exc:
        log.warning("database unavailable at start-up, will retry on demand: %s", exc)
        return Store(engine=make_engine(settings), settings=settings), False


def _make_engine(settings: Settings) -> Engine | None:
    try:
        return Engine(settings)
    except Exception:  # e.g. no nameservers configured and no /etc/resolv.conf
        log.exception("verification engine could not be created; verifier not ready")
        return None


def _start_jobs(settings: Settings) -> tuple[JobRunner, Reaper]:
    """The job runner of ``settings.runner`` and the reaper that keeps jobs from sticking.

    With the local runner the Prefect embedded server is warmed in the background, so the
    first job does not wait for it and start-up is not slowed either.
    """
    runner = make_runner(settings)
    if settings.prefect_warm_up and isinstance(runner, LocalRunner):
        runner.warm_up()
    return runner, Reaper(settings, runner).start()


def create_app(settings: Settings | None = None, *, rate_limit_prefix: str = "verimail") -> FastAPI:
    """The API for ``settings`` (default: from the environment).

    ``rate_limit_prefix`` namespaces the Redis keys of the limiter, so that several
    deployments (or tests) can share one Redis without sharing counters.
    """
    settings = settings or get_settings()

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        state = app.state
        state.settings = settings
        state.started_monotonic = time.monotonic()
        state.started_at = datetime.now(UTC)
        state.store, state.store_migrated = await to_thread.run_sync(_open_store, settings)
        state.migrate_lock = asyncio.Lock()
        state.migrate_retry_at = 0.0  # monotonic time of the next retry allowed
        state.engine = _make_engine(settings)
        state.verifier_ready = verifier_ready(state.engine)
        state.limiter = Limiter(settings.redis_url, prefix=rate_limit_prefix)
        await state.limiter.warm_up()
        state.runner, state.reaper = _start_jobs(settings)
        state.egress_monitor = None
        if settings.doctor_interval > 0:  # (port 25 through each egress, in the background)
            from verimail.engine import EgressMonitor

            state.egress_monitor = EgressMonitor(settings)
            state.egress_monitor.start()
        try:
            yield
        finally:
            if state.egress_monitor is not None:
                await state.egress_monitor.stop()
            state.reaper.stop()
            state.runner.shutdown()
            await state.limiter.close()
            if state.engine is not None:
                state.engine.close()
            state.store.close()

    # Swagger UI (/docs) and ReDoc (/redoc) load their scripts from the app itself (the
    # fastapi-offline package ships them), not from a CDN: the pages work without internet.
    app = FastAPIOffline(
        title="verimail",
        version=API_VERSION,
        description=DESCRIPTION,
        openapi_url="/openapi.json",
        docs_url="/docs",
        redoc_url=None,  # (api/docs_pages.py serves /redoc, its logo from the app too)
        static_url=DOCS_ASSETS_URL,
        lifespan=lifespan,
    )
    install_error_handlers(app)
    install_openapi(app)
    app.include_router(docs_pages.router)
    app.include_router(health.router)
    app.include_router(verify.router)
    app.include_router(finder.router)
    app.include_router(bulk.router)
    app.include_router(reverify.router)
    app.include_router(finder_csv.router)
    app.include_router(job_actions.router)
    app.include_router(account.router)
    app.include_router(job_list.router)
    app.include_router(usage.router)
    install_dashboard(app)
    install_metrics(app, settings)
    app.add_middleware(
        BodyLimitMiddleware,
        max_bytes=settings.http_max_body_bytes,
        read_timeout=settings.http_body_timeout,
    )
    return app
