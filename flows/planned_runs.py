"""Flow runs planned for later, in state Scheduled: a list's next re-verification and a
re-verification's deferred retry pass.

With workers such a run belongs to the ``reverify-stored`` deployment and a worker takes it
when due; with the local runner it belongs to no deployment, tagged, and the API process's
sweep claims it once due (``runners/sweep.py``). The planning run hands in the flow object
(``reverify_stored``) rather than this module importing the flow that imports it.
"""

from __future__ import annotations

import logging
import uuid
from dataclasses import dataclass
from datetime import datetime
from typing import TYPE_CHECKING, Any

from verimail.config import Settings
from verimail.flows.deployments import DEPLOYMENTS, from_deployment
from verimail.jobs.reverify import run_name
from verimail.store.db import Store

if TYPE_CHECKING:
    from prefect import Flow

log = logging.getLogger(__name__)

LIST_RUN_TAG = "verimail-reverify-schedule"
"""Tag of every scheduled re-verification of a list (the local runner claims them by it)."""
RETRY_RUN_TAG = "verimail-reverify-retry"
"""Tag of every planned retry pass of an operator's re-verification."""


@dataclass(frozen=True)
class PlannedRun:
    flow_run_id: str
    scheduled_time: datetime


async def plan_list_run(
    settings: Settings,
    store: Store,
    flow: Flow[..., Any],
    account_id: int,
    list_job: int,
    when: datetime,
) -> PlannedRun:
    """Create the Scheduled ``reverify-stored`` run (``flow``) that re-verifies the list at
    ``when``."""
    run_id = await create_planned_run(
        settings,
        flow,
        {"account_id": account_id, "list_job_id": list_job},
        when,
        name=run_name(store, account_id, list_job),
        tags=[LIST_RUN_TAG, f"account:{account_id}", f"list:{list_job}"],
    )
    return PlannedRun(run_id, when)


async def create_planned_run(
    settings: Settings,
    flow: Flow[..., Any],
    parameters: dict[str, Any],
    when: datetime,
    *,
    name: str,
    tags: list[str],
) -> str:
    """A ``reverify-stored`` flow run (``flow``) in state Scheduled at ``when``; its id.
    With workers it is the deployment's (a worker takes it when due; a worker's own run
    plans one there too, whatever its ``runner`` setting); with the local runner it belongs
    to no deployment and the API process's sweep claims it by its tag
    (``runners/sweep.py``)."""
    from prefect.client.orchestration import get_client
    from prefect.states import Scheduled

    state = Scheduled(scheduled_time=when)
    async with get_client() as client:
        if settings.runner == "deployment" or from_deployment():
            deployment = await client.read_deployment_by_name(DEPLOYMENTS["reverify"])
            run = await client.create_flow_run_from_deployment(
                deployment.id, parameters=parameters, state=state, name=name, tags=tags
            )
        else:
            run = await client.create_flow_run(
                flow, name=name, parameters=parameters, tags=tags, state=state
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
