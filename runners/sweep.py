"""The runners' sweep of planned ``reverify-stored`` runs (the reaper calls it through
``start_due_runs``): claim the due runs that no deployment serves, for the local runner to
run in its own threads; replan a list's schedule whose planned run was lost; forget a
parked retry pass whose run was. Prefect is asked only when the store or a parked pass's
file says something is due. With the local runner the sweep also applies retention
(``VERIMAIL_RETENTION_DAYS``), which workers do in the ``purge-expired-jobs`` deployment.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import uuid
from collections.abc import Sequence
from datetime import UTC, datetime, timedelta
from typing import Any

from verimail.config import Settings
from verimail.flows.planner import cancel_run, plan_list_run
from verimail.jobs import reverify_parking as parking
from verimail.jobs.context import store_for
from verimail.jobs.delete import purge_expired
from verimail.jobs.reverify import next_after
from verimail.store import reverify as reverify_store

log = logging.getLogger(__name__)

RETENTION_EVERY = 600.0
"""Seconds between two retention sweeps of the local runner (the first at start-up)."""


def purge_expired_data(settings: Settings) -> list[int]:
    """Retention's turn in the local runner's sweep (``jobs/delete.py``): the jobs deleted.
    A failure is logged and left to the next turn, so it never holds up the due runs."""
    try:
        return purge_expired(settings, store_for(settings))
    except Exception as exc:
        log.warning("retention sweep failed (tried again in %.0f s): %s", RETENTION_EVERY, exc)
        return []


def claim_due_runs(settings: Settings, tags: Sequence[str]) -> list[Any]:
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
                plan_list_run(settings, store, schedule.account_id, schedule.list_job_id, when)
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


def drop_lost_runs(settings: Settings) -> list[str]:
    """Parked passes overdue by more than ``job_stale_after`` whose planned run will never
    take them (cancelled or deleted in Prefect, ended without starting): their files are
    removed, so the sweep stops asking, and the reports stay as they are. Returns their
    reports' names."""
    from prefect.client.orchestration import get_client
    from prefect.exceptions import ObjectNotFound

    overdue = datetime.now(UTC) - timedelta(seconds=settings.job_stale_after)
    dropped = []
    with get_client(sync_client=True) as client:
        for path, parked in parking.waiting_passes(settings):
            if parked.next_retry_at > overdue:
                continue
            run = None
            with contextlib.suppress(ObjectNotFound, ValueError, TypeError):
                run = client.read_flow_run(uuid.UUID(str(parked.flow_run_id)))
            if run is not None and run.state is not None and not run.state.is_final():
                continue  # (late, claimed, or running)
            if (
                parking.read_parked(path) != parked
            ):  # (its run took it and parked the next pass just now)
                continue
            path.unlink(missing_ok=True)
            log.warning(
                "%s: retry pass %s was not run (its planned run %s was cancelled or removed "
                "in Prefect); the report stays as it is",
                parked.report,
                parked.retry_pass,
                parked.flow_run_id,
            )
            dropped.append(parked.report)
    return dropped
