"""Registering the flows as Prefect deployments on a work pool (``verimail deploy``).

Module-path entrypoints (``verimail.flows.bulk:bulk_verify``) mean a worker needs only the
installed ``verimail`` package, not a checkout of this repository. ``prefect.yaml`` holds
the same deployments for teams that prefer ``prefect deploy --all`` (a test keeps it equal to
the registry, ``schemas/flows.py``).
"""

from __future__ import annotations

import contextlib

from prefect.client.orchestration import get_client
from prefect.client.schemas.actions import WorkPoolCreate
from prefect.client.schemas.schedules import CronSchedule
from prefect.deployments.runner import EntrypointType
from prefect.exceptions import ObjectAlreadyExists
from prefect.utilities.asyncutils import run_coro_as_sync

from verimail.flows.planner import load_flow
from verimail.schemas.flows import FLOWS


async def _ensure_pool(name: str) -> None:
    async with get_client() as client:
        with contextlib.suppress(ObjectAlreadyExists):
            await client.create_work_pool(WorkPoolCreate(name=name, type="process"))


def register_deployments(pool: str, *, schedule: bool = True) -> list[str]:
    """Create the work pool if needed and apply a deployment per registered flow
    (``schemas/flows.py``); returns their names. ``schedule``: the flows' standing schedules
    too (the weekly re-verification)."""
    run_coro_as_sync(_ensure_pool(pool))
    names = []
    for entry in FLOWS:
        cron = entry.cron if schedule else None
        deployment = load_flow(entry.key).to_deployment(
            name=entry.name,
            description=entry.description,
            work_pool_name=pool,
            entrypoint_type=EntrypointType.MODULE_PATH,
            schedules=[CronSchedule(cron=cron, timezone="UTC")] if cron else None,
        )
        deployment.apply()
        names.append(entry.deployment)
    return names
