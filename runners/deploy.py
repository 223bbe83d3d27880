"""Registering the flows as Prefect deployments on a work pool (``verimail deploy``).

Module-path entrypoints (``verimail.flows.bulk:bulk_verify``) mean a worker needs only the
installed ``verimail`` package, not a checkout of this repository. ``prefect.yaml`` holds
the same five deployments for teams that prefer ``prefect deploy --all``.
"""

from __future__ import annotations

import contextlib

from prefect.client.orchestration import get_client
from prefect.client.schemas.actions import WorkPoolCreate
from prefect.client.schemas.schedules import CronSchedule
from prefect.deployments.runner import EntrypointType
from prefect.exceptions import ObjectAlreadyExists
from prefect.utilities.asyncutils import run_coro_as_sync

REVERIFY_CRON = "0 3 * * 1"  # Mondays 03:00 UTC: stale addresses (older than 30 days)
RETENTION_CRON = "30 2 * * *"  # daily 02:30 UTC: jobs ended more than retention_days ago


async def _ensure_pool(name: str) -> None:
    async with get_client() as client:
        with contextlib.suppress(ObjectAlreadyExists):
            await client.create_work_pool(WorkPoolCreate(name=name, type="process"))


def register_deployments(pool: str, *, schedule: bool = True) -> list[str]:
    """Create the work pool if needed and apply the deployments; returns their names."""
    from verimail.flows.bulk import bulk_verify
    from verimail.flows.finder import find_emails
    from verimail.flows.retention import purge_expired_jobs
    from verimail.flows.reverify import reverify_stored
    from verimail.flows.shard import verify_shard

    run_coro_as_sync(_ensure_pool(pool))
    names = []
    for flow, name, schedules in (
        (bulk_verify, "bulk-verify", None),
        (find_emails, "find-emails", None),
        (verify_shard, "verify-shard", None),
        (
            reverify_stored,
            "reverify-stored",
            [CronSchedule(cron=REVERIFY_CRON, timezone="UTC")] if schedule else None,
        ),
        (
            purge_expired_jobs,
            "purge-expired-jobs",
            [CronSchedule(cron=RETENTION_CRON, timezone="UTC")] if schedule else None,
        ),
    ):
        deployment = flow.to_deployment(
            name=name,
            work_pool_name=pool,
            entrypoint_type=EntrypointType.MODULE_PATH,
            schedules=schedules,
        )
        deployment.apply()
        names.append(f"{flow.name}/{name}")
    return names
