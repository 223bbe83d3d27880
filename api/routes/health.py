"""``GET /api/health``: open to everyone, cheap enough for load balancers to poll.

``database_connected`` is a real ``SELECT 1`` (bounded by a timeout so a hung database
cannot hang the probe). ``verifier_ready`` is decided once at start-up from the engine's
resolver configuration — no DNS traffic per health check (see :func:`verifier_ready`).
``smtp_egress`` is what the app's background egress checks found last
(:class:`~verimail.engine.smtp.egress_check.EgressMonitor`): read from memory, never awaited.
"""

from __future__ import annotations

import asyncio
import logging
import time
from datetime import UTC, datetime

from anyio import to_thread
from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse
from sqlalchemy import text

from verimail import API_VERSION
from verimail.api.errors import COMMON_ERRORS
from verimail.engine import Engine
from verimail.schemas.api import HealthResult
from verimail.store.db import Store

log = logging.getLogger("verimail.api.health")

router = APIRouter(tags=["health"])

PROVIDER = "verimail"
DB_CHECK_TIMEOUT = 3.0  # seconds


def verifier_ready(engine: Engine | None) -> bool:
    """The engine exists and its resolver has nameservers to ask (no network I/O)."""
    if engine is None:
        return False
    resolver = getattr(engine.resolver, "_resolver", None)
    return bool(getattr(resolver, "nameservers", None))


def _select_one(store: Store) -> bool:
    with store.engine.connect() as conn:
        return conn.execute(text("SELECT 1")).scalar_one() == 1


async def database_connected(store: Store) -> bool:
    """True when the database answers ``SELECT 1`` within :data:`DB_CHECK_TIMEOUT`."""
    try:
        return await asyncio.wait_for(
            to_thread.run_sync(_select_one, store, abandon_on_cancel=True), DB_CHECK_TIMEOUT
        )
    except Exception as exc:
        log.warning("health: database check failed: %s", exc)
        return False


def _smtp_egress(state: object) -> dict[str, object] | None:
    """The background egress checks' last round, from memory (never run here)."""
    monitor = getattr(state, "egress_monitor", None)
    return monitor.summary() if monitor is not None else None


@router.get(
    "/api/health",
    response_model=HealthResult,
    summary="Service health",
    description="Whether the service can verify addresses now. No authentication. "
    "200 when healthy; 503 with the same body when the database does not answer or the "
    "verifier is not ready.",
    responses={
        503: {"model": HealthResult, "description": "Unhealthy; the body says which part."},
        500: COMMON_ERRORS[500],
    },
)
async def health(request: Request) -> JSONResponse:
    state = request.app.state
    db_ok = await database_connected(state.store)
    ready = state.verifier_ready
    healthy = db_ok and ready
    body = HealthResult(
        status="healthy" if healthy else "unhealthy",
        version=API_VERSION,
        uptime_seconds=round(time.monotonic() - state.started_monotonic, 3),
        database_connected=db_ok,
        verifier_ready=ready,
        verification_provider=PROVIDER,
        timestamp=datetime.now(UTC),
        smtp_egress=_smtp_egress(state),
    )
    return JSONResponse(body.model_dump(mode="json"), status_code=200 if healthy else 503)
