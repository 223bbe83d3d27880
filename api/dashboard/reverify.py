"""The job page's re-verification panel: re-verify the list now, its schedule (set, change,
cancel) and its history with each run's change report — the API's operations
(``api/routes/reverify.py``) for the signed-in account, as forms.

The panel is its own template (``_reverify.html``) fed by :func:`reverify_panel`, so the job
page only includes it.
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

from anyio import to_thread
from fastapi import APIRouter, Request, Response

from verimail.api.dashboard.web import (
    PREFIX,
    CheckedForm,
    CurrentAccount,
    DashboardRoute,
    StoreDep,
    redirect,
    text_field,
)
from verimail.api.deps import JobId
from verimail.api.errors import ApiError
from verimail.api.routes import reverify as api
from verimail.schemas.limits import MAX_EVERY_DAYS
from verimail.store import jobs as job_store
from verimail.store import reverify as reverify_store
from verimail.store.db import Store

router = APIRouter(prefix=PREFIX, route_class=DashboardRoute, include_in_schema=False)


async def reverify_panel(store: Store, job: job_store.Job) -> dict[str, Any]:
    """What ``_reverify.html`` shows for ``job`` (nothing for a finder job)."""
    if job.kind not in api.BULK_KINDS:
        return {}
    list_job = reverify_store.list_job_id(job)

    def read() -> dict[str, Any]:
        engine = store.engine
        return {
            "list_job_id": list_job,
            "schedule": reverify_store.get_schedule(engine, job.account_id, list_job),
            "history": reverify_store.history(engine, job.account_id, list_job),
            "reverify_of": (job.options or {}).get("reverify_of"),
            "can_reverify": job.status == "completed",
            "max_every_days": MAX_EVERY_DAYS,
        }

    return {"reverify": await to_thread.run_sync(read)}


def _job_page(job_id: int) -> str:
    return f"{PREFIX}/jobs/{job_id}"


@router.post("/jobs/{job_id}/reverify")
async def reverify_now(
    request: Request, job_id: JobId, account: CurrentAccount, store: StoreDep, form: CheckedForm
) -> Response:
    """Re-verify the job's addresses as a new job (charged like an upload); its page next."""
    previous = await api.own_job(store, account.id, job_id)
    job, _secret = await api.start_reverification(request, store, previous)
    return redirect(_job_page(job.id))


@router.post("/jobs/{job_id}/reverify-schedule")
async def set_schedule(
    request: Request, job_id: JobId, account: CurrentAccount, store: StoreDep, form: CheckedForm
) -> Response:
    """Re-verify the job's list every N days, the first run N days from now."""
    raw = text_field(form, "every_days", 10).strip()
    if not raw.isdigit() or not 1 <= int(raw) <= MAX_EVERY_DAYS:
        raise ApiError(
            422, f"Re-verify every how many days: a whole number from 1 to {MAX_EVERY_DAYS}."
        )
    job = await api.own_job(store, account.id, job_id)
    every = int(raw)
    await api.save_schedule(request, store, job, every, datetime.now(UTC) + timedelta(days=every))
    return redirect(_job_page(job_id))


@router.post("/jobs/{job_id}/reverify-schedule/cancel")
async def cancel_schedule(
    job_id: JobId, account: CurrentAccount, store: StoreDep, form: CheckedForm
) -> Response:
    await api.cancel_schedule(store, await api.own_job(store, account.id, job_id))
    return redirect(_job_page(job_id))


@router.get("/jobs/{job_id}/changes")
async def change_report(
    request: Request, job_id: JobId, account: CurrentAccount, store: StoreDep
) -> Response:
    """A re-verification's change report, for its owner only (404 for anyone else)."""
    return await api.change_report(job_id, request, account, store)
