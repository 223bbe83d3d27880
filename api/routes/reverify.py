"""Re-verifying a customer's list: ``POST /api/bulk/{id}/reverify`` (now), its change
report, and the list's schedule (``/api/bulk/{id}/reverify-schedule``,
``GET /api/reverify-schedules``) and history (``GET /api/bulk/{id}/reverifications``).

A list is the job its owner uploaded; re-verifying any run of it (the upload or a later
re-verification) compares with that run and adds to the list's history. Another account's
job is a 404, as everywhere.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from typing import Annotated, Any

from anyio import to_thread
from fastapi import APIRouter, Body, Request, Response
from sqlalchemy import Engine

from verimail.api.deps import AccountDep, JobId, StoreDep
from verimail.api.downloads import WholeFileResponse
from verimail.api.errors import (
    DATABASE_RETRY_AFTER,
    ApiError,
    error_doc,
    pick_error_docs,
)
from verimail.api.jobs import start_run, webhook_options
from verimail.api.routes.bulk import BULK_KINDS
from verimail.files.bulk_io import change_report_csv, job_dir
from verimail.flows.planner import cancel_run, load_flow, plan_list_run
from verimail.jobs import reverify as lists
from verimail.schemas.errors import ValidationErrorBody
from verimail.schemas.jobs import BulkJob
from verimail.schemas.limits import MAX_EVERY_DAYS
from verimail.schemas.reverify import (
    Reverification,
    ReverifyRequest,
    ReverifySchedule,
    ScheduleRequest,
)
from verimail.store import jobs as job_store
from verimail.store import reverify as reverify_store
from verimail.store.db import Store

router = APIRouter(tags=["re-verification"])

_ERRORS: dict[int | str, dict[str, Any]] = {
    402: error_doc("Not enough credits for 1 per address of the list; nothing was charged."),
    404: error_doc("No such job (or schedule) for this account; other accounts' jobs alike."),
    409: error_doc(
        "The job has not completed (or it failed, or it is not a re-verification): `detail` "
        "says which."
    ),
    422: {
        "model": ValidationErrorBody,
        "description": "A bad job id or body field; `detail` says which.",
    },
}


def _docs(*codes: int) -> dict[int | str, dict[str, Any]]:
    return pick_error_docs(_ERRORS, (*codes, 422))


async def own_job(store: Store, account_id: int, job_id: int) -> job_store.Job:
    job = await to_thread.run_sync(lambda: job_store.get_job(store.engine, account_id, job_id))
    if job is None or job.kind not in BULK_KINDS:
        raise ApiError(404, f"No bulk job {job_id} for this account.")
    return job


@router.post(
    "/api/bulk/{job_id}/reverify",
    response_model=BulkJob,
    summary="Re-verify a completed job's list as a new job",
    description="Verifies the addresses of a completed bulk job again, as a new job of the "
    "same account that reserves 1 credit per address (like `POST /api/bulk`; unused credits "
    "come back). Poll `GET /api/bulk/{new job_id}`: once completed it carries `reverify_of` "
    'and `transitions` (rows whose status changed, e.g. `{"valid->invalid": 31}`); its '
    "download is the original file with `Safe to Send`, `previous_status` and "
    "`status_changed` added, and `GET /api/bulk/{new job_id}/changes` lists only the rows "
    "that changed.",
    responses=_docs(402, 404, 409),
    openapi_extra={
        "requestBody": {
            "required": False,
            "content": {
                "application/json": {
                    "examples": {
                        "plain": {"summary": "No body: the list's webhook", "value": {}},
                        "webhook": {
                            "summary": "Tell another URL",
                            "value": {"webhook_url": "https://hooks.example.com/verimail"},
                        },
                    }
                }
            },
        }
    },
)
async def reverify_job(
    job_id: JobId,
    request: Request,
    account: AccountDep,
    store: StoreDep,
    body: Annotated[ReverifyRequest | None, Body()] = None,
) -> BulkJob:
    previous = await own_job(store, account.id, job_id)
    webhook_url = str(body.webhook_url) if body is not None and body.webhook_url else None
    job, secret = await start_reverification(request, store, previous, webhook_url)
    out = BulkJob.of(job)
    out.webhook_secret = secret
    return out


async def start_reverification(
    request: Request, store: Store, previous: job_store.Job, webhook_url: str | None = None
) -> tuple[job_store.Job, str | None]:
    """Re-verify ``previous`` (the caller's own job) as a new job and start its run; the
    job, and the new webhook secret when ``webhook_url`` was given (without it, the list's
    webhook is told, signed with its secret). 409, 402 and 503 as documented above."""
    try:
        lists.check_reverifiable(previous)
    except lists.NotReverifiable as exc:
        raise ApiError(409, str(exc)) from exc
    settings = request.app.state.settings
    new_secret = None
    if webhook_url is not None:
        secret = new_secret = (await webhook_options(request, webhook_url)).get("webhook_secret")
    else:
        list_job = reverify_store.list_job_id(previous)
        webhook_url, secret = await to_thread.run_sync(
            lists.list_webhook, store, previous.account_id, list_job
        )

    def create() -> job_store.Job | None:
        return lists.create_reverify_job(
            store, settings, previous, webhook_url=webhook_url, webhook_secret=secret
        )

    try:
        job = await to_thread.run_sync(create)
    except lists.NotReverifiable as exc:  # (its upload went between the check and now)
        raise ApiError(409, str(exc)) from exc
    if job is None:
        raise ApiError(402, await to_thread.run_sync(lists.short_of_credits, store, previous))
    await start_run(request, store, job)
    return job, new_secret


@router.get(
    "/api/bulk/{job_id}/changes",
    summary="A re-verification's change report (CSV)",
    description="The rows of a completed re-verification whose status changed: `row` (data "
    "row, from 1), `email`, `previous_status`, `status`, `reason`. UTF-8.",
    response_class=WholeFileResponse,
    responses={200: {"content": {"text/csv": {}}}, **_docs(404, 409)},
)
async def change_report(
    job_id: JobId, request: Request, account: AccountDep, store: StoreDep
) -> WholeFileResponse:
    job = await own_job(store, account.id, job_id)
    if (job.options or {}).get("reverify_of") is None:
        raise ApiError(409, f"Job {job.id} is not a re-verification, so it has no changes.")
    if job.status != "completed":
        raise ApiError(
            409, f"Job {job.id} is {job.status}; its change report comes once it completes."
        )
    directory = job_dir(request.app.state.settings.data_dir, job.id)
    path = await to_thread.run_sync(change_report_csv, directory)
    return WholeFileResponse(
        path, media_type="text/csv; charset=utf-8", filename=f"bulk-{job.id}-changes.csv"
    )


# --- schedules -----------------------------------------------------------------------------


CLOCK_SKEW = timedelta(minutes=1)
"""A ``first_run_at`` this far in the past is taken as now (the client's clock may lag)."""


def _first_run(body: ScheduleRequest) -> datetime:
    """When the schedule's first run is made. A time in the past is refused rather than
    moved: a client that sends one has a bug or a wrong zone, and a run at once charges."""
    now = datetime.now(UTC)
    if body.first_run_at is None:
        return now + timedelta(days=body.every_days)
    when = body.first_run_at
    if when < now - CLOCK_SKEW:
        raise ApiError(
            422,
            f"first_run_at: {when.isoformat()} is in the past (now is "
            f"{now.replace(microsecond=0).isoformat()}); give a time to come, or leave it "
            "out for every_days from now.",
        )
    if when > now + timedelta(days=MAX_EVERY_DAYS):
        raise ApiError(422, "first_run_at: at most a year ahead.")
    return max(when, now)


@router.put(
    "/api/bulk/{job_id}/reverify-schedule",
    response_model=ReverifySchedule,
    summary="Put a list on a re-verification schedule (or change it)",
    description="Re-verifies the job's list every `every_days` days, each run a new job of "
    "this account reserving 1 credit per address (a run the balance cannot cover is "
    "skipped, with the reason in the list's history, and the schedule goes on). Each run "
    "tells the list's webhook (its upload's) the new job, `transitions` included. Any run "
    "of a list names the list; a list has one schedule, which this replaces.",
    responses=_docs(404, 409),
)
async def put_schedule(
    job_id: JobId, body: ScheduleRequest, request: Request, account: AccountDep, store: StoreDep
) -> ReverifySchedule:
    first_run = _first_run(body)  # (the request's own checks before the job is looked up)
    job = await own_job(store, account.id, job_id)
    schedule = await save_schedule(request, store, job, body.every_days, first_run)
    return ReverifySchedule.of(schedule)


async def save_schedule(
    request: Request, store: Store, job: job_store.Job, every_days: int, first_run: datetime
) -> reverify_store.Schedule:
    """Put the list of ``job`` (the caller's own) on a schedule, or change it: plan its
    first run in Prefect, save, and cancel the run the schedule named before."""
    list_job = reverify_store.list_job_id(job)
    account_id = job.account_id
    latest = await to_thread.run_sync(
        reverify_store.latest_completed, store.engine, account_id, list_job
    )
    if latest is None:
        raise ApiError(409, f"List {list_job} has no completed run yet; schedule it once it has.")
    settings = request.app.state.settings
    try:
        async with asyncio.timeout(SCHEDULER_WAIT):
            # (in a thread the wait may leave: it goes on starting Prefect for the retry)
            await asyncio.to_thread(_scheduler_ready, request)
            planned = await plan_list_run(settings, store, account_id, list_job, first_run)
    except Exception as exc:
        raise ApiError(
            503,
            "The schedule could not be planned right now (the scheduler did not answer, or is "
            "still starting); nothing was changed. Try again shortly.",
            {"Retry-After": str(DATABASE_RETRY_AFTER)},
        ) from exc
    try:
        schedule, old = await to_thread.run_sync(
            lambda: reverify_store.put_schedule(
                store.engine, account_id, list_job, every_days, first_run, planned.flow_run_id
            )
        )
    except BaseException:
        await cancel_run(planned.flow_run_id, "the schedule could not be saved")
        raise
    if old is not None:
        await cancel_run(old, "the schedule was changed")
    return schedule


SCHEDULER_WAIT = 5.0
"""Seconds a schedule write waits for Prefect before answering 503. It waited for as long
as Prefect took: the first write after a start waited behind the start of the embedded
server (13.7 s seen, issue 47), and one to a Prefect API that does not answer for the
client's whole time-out."""


def _scheduler_ready(request: Request) -> None:
    """Prefect ready to plan a run: the local runner starts Prefect's embedded server once,
    for every thread (two starting it at once would both pick one port); other runners need
    nothing. The flow is imported here too (it loads Prefect, seconds the first time), so
    the planner finds it loaded: never on the event loop."""
    ready = getattr(request.app.state.runner, "prefect_ready", None)
    if ready is not None:
        ready()
    load_flow("reverify")


@router.get(
    "/api/bulk/{job_id}/reverify-schedule",
    response_model=ReverifySchedule,
    summary="A list's re-verification schedule",
    description="The schedule of the job's list (any run of the list names it): how often "
    "it is re-verified and when the next run is made. 404 when the list has none.",
    responses=_docs(404),
)
async def get_schedule(job_id: JobId, account: AccountDep, store: StoreDep) -> ReverifySchedule:
    job = await own_job(store, account.id, job_id)
    return ReverifySchedule.of(await _list_schedule(store, job, reverify_store.get_schedule))


async def _list_schedule(
    store: Store,
    job: job_store.Job,
    action: Callable[[Engine, int, int], reverify_store.Schedule | None],
) -> reverify_store.Schedule:
    """``action(engine, account, list)`` on the schedule of the job's list; 404 without one."""
    list_job = reverify_store.list_job_id(job)
    schedule = await to_thread.run_sync(action, store.engine, job.account_id, list_job)
    if schedule is None:
        raise ApiError(404, f"List {list_job} has no re-verification schedule.")
    return schedule


@router.delete(
    "/api/bulk/{job_id}/reverify-schedule",
    status_code=204,
    summary="Cancel a list's re-verification schedule",
    description="The planned run is cancelled; the list's history stays.",
    responses=_docs(404),
)
async def delete_schedule(job_id: JobId, account: AccountDep, store: StoreDep) -> Response:
    await cancel_schedule(store, await own_job(store, account.id, job_id))
    return Response(status_code=204)


async def cancel_schedule(store: Store, job: job_store.Job) -> None:
    """Cancel the schedule of ``job``'s list (the caller's own job) and its planned run."""
    schedule = await _list_schedule(store, job, reverify_store.delete_schedule)
    if schedule.flow_run_id:
        await cancel_run(schedule.flow_run_id, "the schedule was cancelled")


@router.get(
    "/api/reverify-schedules",
    response_model=list[ReverifySchedule],
    summary="This account's re-verification schedules",
    description="Every list of this account that is on a re-verification schedule, with "
    "when its next run is made; an empty list when there are none.",
    # No parameters and no body: nothing to validate, so no 422.
    responses=pick_error_docs(_ERRORS, ()),
)
async def list_schedules(account: AccountDep, store: StoreDep) -> list[ReverifySchedule]:
    schedules = await to_thread.run_sync(reverify_store.list_schedules, store.engine, account.id)
    return [ReverifySchedule.of(s) for s in schedules]


# --- history -------------------------------------------------------------------------------


@router.get(
    "/api/bulk/{job_id}/reverifications",
    response_model=list[Reverification],
    summary="A list's re-verification history",
    description="The list's re-verifications (of any of its runs), newest first, at most 50.",
    responses=_docs(404),
)
async def reverifications(
    job_id: JobId, account: AccountDep, store: StoreDep
) -> list[Reverification]:
    job = await own_job(store, account.id, job_id)
    entries = await to_thread.run_sync(
        reverify_store.history, store.engine, account.id, reverify_store.list_job_id(job)
    )
    return [Reverification.of(e) for e in entries]
