"""Re-verifying a customer's list: the new job, and the Prefect runs of its schedule.

A re-verification is a bulk job of its own (the owner's, reserving 1 credit per address
like any upload) over a copy of the list's upload, compared with the list's previous run
(``options["reverify_of"]``): the ``bulk-verify`` flow writes ``previous_status`` /
``status_changed`` into its files and the transitions onto the job.

A schedule is one Prefect flow run of ``reverify-stored`` at a time, in state Scheduled at
the list's next date and named for its owner and list; when it runs it first plans its
successor (``every_days`` later), then re-verifies. With the deployment runner the
run belongs to the ``reverify-stored`` deployment and a worker picks it up when due; with
the local runner the API process is the worker: its reaper sweep claims due runs (the
store says when one is due, so Prefect is asked only then) and runs them in its threads.
"""

from __future__ import annotations

import contextlib
import logging
import shutil
import uuid
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

from verimail.config import Settings
from verimail.jobs.context import store_for
from verimail.jobs.create import NotEnoughCredits, create_verify_job, stored_info
from verimail.store import jobs as job_store
from verimail.store import reverify as reverify_store
from verimail.store.accounts import get_account
from verimail.store.billing.pools import balance
from verimail.store.db import Store

log = logging.getLogger(__name__)

RUN_TAG = "verimail-reverify-schedule"
"""Tag of every scheduled re-verification run (the local runner looks for it)."""
VERIFIABLE_KINDS = ("bulk_csv", "bulk_json")


class NotReverifiable(ValueError):
    """The job cannot be re-verified (not a completed bulk job, or its upload is gone)."""


def check_reverifiable(job: job_store.Job) -> None:
    """Raise :class:`NotReverifiable` with what stops ``job`` from being re-verified now."""
    if job.kind not in VERIFIABLE_KINDS:
        raise NotReverifiable(f"Job {job.id} is not a verification job.")
    if job.status == "failed":
        raise NotReverifiable(
            f"Job {job.id} failed, so it has no results to compare with; upload the list again."
        )
    if job.status != "completed":
        raise NotReverifiable(
            f"Job {job.id} is {job.status} ({job.processed_emails} of {job.total_emails} "
            "verified); re-verify it once its status is completed."
        )
    if not job.upload_path or not Path(job.upload_path).is_file():
        raise NotReverifiable(f"Job {job.id}'s upload is no longer stored; upload it again.")


def create_reverify_job(
    store: Store,
    settings: Settings,
    previous: job_store.Job,
    *,
    webhook_url: str | None,
    webhook_secret: str | None,
    schedule_id: int | None = None,
    flow_run_id: str | None = None,
) -> job_store.Job | None:
    """The job re-verifying ``previous`` (pending, its credits reserved) and its entry in
    the list's history; None, with nothing stored or charged, when the balance is short."""
    check_reverifiable(previous)
    folder = Path(settings.data_dir) / "uploads" / uuid.uuid4().hex
    folder.mkdir(parents=True)
    upload = folder / "upload.csv"
    list_job = reverify_store.list_job_id(previous)
    options: dict[str, Any] = {"reverify_of": previous.id, "list_job_id": list_job}
    if filename := (previous.options or {}).get("filename"):
        options["filename"] = filename
    if webhook_url and webhook_secret:
        options["webhook_secret"] = webhook_secret
    try:
        shutil.copyfile(str(previous.upload_path), upload)
        job = create_verify_job(
            store,
            previous.account_id,
            previous.total_emails,
            upload=upload,
            kind=previous.kind,  # type: ignore[arg-type]
            info=stored_info(settings, previous),  # (the same bytes: no need to inspect them again)
            email_column=previous.email_column,
            options=options,
            webhook_url=webhook_url if webhook_secret else None,
            flow_run_id=flow_run_id,
        )
    except NotEnoughCredits:
        shutil.rmtree(folder, ignore_errors=True)
        return None
    except BaseException:
        shutil.rmtree(folder, ignore_errors=True)
        raise
    reverify_store.record_run(
        store.engine,
        job,
        account_id=job.account_id,
        list_job=list_job,
        previous_job_id=previous.id,
        schedule_id=schedule_id,
        flow_run_id=flow_run_id,
    )
    return job


def short_of_credits(store: Store, previous: job_store.Job) -> str:
    """Why a re-verification of ``previous`` was not made: the balance against the need."""
    have = balance(store.engine, previous.account_id).total
    return (
        f"Not enough credits: re-verifying this list needs {previous.total_emails} "
        f"(1 per address), the balance is {have}. Nothing was charged."
    )


def list_webhook(store: Store, account_id: int, list_job: int) -> tuple[str | None, str | None]:
    """The list's webhook URL and secret (its upload's), which scheduled runs report to."""
    job = job_store.get_job(store.engine, account_id, list_job)
    if job is None or not job.webhook_url:
        return None, None
    return job.webhook_url, (job.options or {}).get("webhook_secret")


# --- schedules in Prefect -----------------------------------------------------------------


def next_after(planned: datetime, every_days: int, now: datetime) -> datetime:
    """The first date after ``now`` on the schedule through ``planned`` (runs missed while
    nothing ran are not made up: one run, then the schedule goes on)."""
    step = timedelta(days=every_days)
    upcoming = planned + step
    if upcoming <= now:
        upcoming += step * ((now - upcoming) // step + 1)
    return upcoming


def run_name(store: Store, account_id: int, list_job: int) -> str:
    """``reverify list 17 of owner@example.com``: how the run shows in the Prefect UI."""
    account = get_account(store.engine, account_id)
    owner = account.email if account is not None and account.email else f"account {account_id}"
    return f"reverify list {list_job} of {owner}"


@dataclass(frozen=True)
class PlannedRun:
    flow_run_id: str
    scheduled_time: datetime


async def plan_run(
    settings: Settings, store: Store, account_id: int, list_job: int, when: datetime
) -> PlannedRun:
    """Create the Scheduled ``reverify-stored`` flow run that re-verifies the list at ``when``."""
    run_id = await create_planned_run(
        settings,
        {"account_id": account_id, "list_job_id": list_job},
        when,
        name=run_name(store, account_id, list_job),
        tags=[RUN_TAG, f"account:{account_id}", f"list:{list_job}"],
    )
    return PlannedRun(run_id, when)


async def create_planned_run(
    settings: Settings, parameters: dict[str, Any], when: datetime, *, name: str, tags: list[str]
) -> str:
    """A ``reverify-stored`` flow run in state Scheduled at ``when``; its id. With workers it
    is the deployment's (a worker takes it when due; a worker's own run plans one there
    too, whatever its ``runner`` setting); with the local runner it belongs to no
    deployment and the API process's sweep claims it by its tag (:func:`claim_due_runs`)."""
    from prefect.client.orchestration import get_client
    from prefect.states import Scheduled

    from verimail.flows.runner import DEPLOYMENTS, from_deployment

    state = Scheduled(scheduled_time=when)
    async with get_client() as client:
        if settings.runner == "deployment" or from_deployment():
            deployment = await client.read_deployment_by_name(DEPLOYMENTS["reverify"])
            run = await client.create_flow_run_from_deployment(
                deployment.id, parameters=parameters, state=state, name=name, tags=tags
            )
        else:
            from verimail.flows.reverify import reverify_stored

            run = await client.create_flow_run(
                reverify_stored, name=name, parameters=parameters, tags=tags, state=state
            )
    return str(run.id)


async def cancel_run(flow_run_id: str, why: str) -> None:
    """Cancel a planned run that no schedule names any more (best effort: a run that is
    gone or already running is left as it is, and finds itself unnamed when it starts)."""
    from prefect.client.orchestration import get_client
    from prefect.states import Cancelled

    try:
        async with get_client() as client:
            run = await client.read_flow_run(uuid.UUID(flow_run_id))
            if run.state is not None and run.state.is_scheduled():
                await client.set_flow_run_state(run.id, Cancelled(message=why), force=True)
    except Exception as exc:
        log.warning("could not cancel scheduled run %s: %s", flow_run_id, exc)


def any_due(settings: Settings) -> bool:
    """Whether the store says a list's scheduled run is due (one query, no Prefect)."""
    return reverify_store.any_due(store_for(settings).engine, datetime.now(UTC))


def claim_due_runs(settings: Settings, tags: Sequence[str] = (RUN_TAG,)) -> list[Any]:
    """Due planned ``reverify-stored`` runs that no deployment serves (the local runner's)
    with any of ``tags`` (lists' schedules by default), each claimed for this process
    (moved to Pending: Prefect refuses a second claim)."""
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.filters import (
        FlowRunFilter,
        FlowRunFilterDeploymentId,
        FlowRunFilterNextScheduledStartTime,
        FlowRunFilterState,
        FlowRunFilterStateType,
        FlowRunFilterTags,
    )
    from prefect.client.schemas.objects import StateType
    from prefect.client.schemas.responses import SetStateStatus
    from prefect.states import Pending

    claimed = []
    with get_client(sync_client=True) as client:
        due = client.read_flow_runs(
            flow_run_filter=FlowRunFilter(
                tags=FlowRunFilterTags(any_=list(tags)),
                deployment_id=FlowRunFilterDeploymentId(is_null_=True),
                state=FlowRunFilterState(type=FlowRunFilterStateType(any_=[StateType.SCHEDULED])),
                next_scheduled_start_time=FlowRunFilterNextScheduledStartTime(
                    before_=datetime.now(UTC)
                ),
            ),
            limit=50,
        )
        for run in due:
            result = client.set_flow_run_state(run.id, Pending())
            if result.status == SetStateStatus.ACCEPT:
                claimed.append(client.read_flow_run(run.id))
    return claimed


def replan_lost_runs(settings: Settings) -> list[int]:
    """Due schedules whose planned run will never come — deleted or cancelled in the Prefect
    UI, gone with a reset Prefect database, ended without starting — get their next run
    planned (the lost date is skipped, with the reason in the list's history), so a lost
    run never ends a schedule silently. Returns the schedules replanned."""
    import asyncio

    from prefect.client.orchestration import get_client
    from prefect.exceptions import ObjectNotFound

    store = store_for(settings)
    now = datetime.now(UTC)
    replanned = []
    with get_client(sync_client=True) as client:
        for schedule in reverify_store.due_schedules(store.engine, now):
            run = None
            with contextlib.suppress(ObjectNotFound, ValueError, TypeError):
                run = client.read_flow_run(uuid.UUID(str(schedule.flow_run_id)))
            if run is not None and run.state is not None and not run.state.is_final():
                continue  # (planned, late, or being run)
            when = next_after(schedule.next_run_at, schedule.every_days, now)
            planned = asyncio.run(
                plan_run(settings, store, schedule.account_id, schedule.list_job_id, when)
            )
            if not reverify_store.set_flow_run(
                store.engine, schedule.id, planned.flow_run_id, when,
                expected=str(schedule.flow_run_id),
            ):  # fmt: skip
                asyncio.run(cancel_run(planned.flow_run_id, "the schedule changed meanwhile"))
                continue
            reverify_store.record_run(
                store.engine, None, account_id=schedule.account_id,
                list_job=schedule.list_job_id, previous_job_id=schedule.list_job_id,
                schedule_id=schedule.id, skipped_reason=LOST_RUN,
            )  # fmt: skip
            log.warning("list %s: its planned run was lost; next run planned", schedule.list_job_id)
            replanned.append(schedule.id)
    return replanned


LOST_RUN = (
    "Its planned run was cancelled or removed in Prefect before it ran; the schedule goes on "
    "from its next date."
)
