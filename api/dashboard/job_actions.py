"""The job page's Cancel and Delete buttons (``POST /dashboard/jobs/{id}/cancel`` and
``…/delete``): the API's own operations (``api/routes/job_actions.py``) for the signed-in
account, behind the dashboard's CSRF check; the page asks for confirmation first.
"""

from __future__ import annotations

from fastapi import APIRouter, Request
from fastapi.responses import Response

from verimail.api.dashboard.web import (
    PREFIX,
    CheckedForm,
    CurrentAccount,
    DashboardRoute,
    StoreDep,
    own_job,
    redirect,
)
from verimail.api.deps import JobId
from verimail.api.routes.job_actions import cancel_owned, delete_owned

router = APIRouter(prefix=PREFIX, route_class=DashboardRoute, include_in_schema=False)


@router.post("/jobs/{job_id}/cancel")
async def cancel_job(
    request: Request, job_id: JobId, account: CurrentAccount, store: StoreDep, form: CheckedForm
) -> Response:
    """Stop the job: its page then shows it cancelled, with its settled rows to download."""
    job = await own_job(store, account.id, job_id)
    await cancel_owned(request, store, job, f"Job {job_id}")
    return redirect(f"{PREFIX}/jobs/{job_id}")


@router.post("/jobs/{job_id}/delete")
async def delete_job(
    request: Request, job_id: JobId, account: CurrentAccount, store: StoreDep, form: CheckedForm
) -> Response:
    """Delete the job and its data; back to the list of jobs, where it is no more."""
    await delete_owned(request, store, await own_job(store, account.id, job_id))
    return redirect(f"{PREFIX}/jobs")
