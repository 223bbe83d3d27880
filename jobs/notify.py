"""Telling a job's webhook that the job ended (completed or failed); never fails the job."""

from __future__ import annotations

import asyncio
import logging
from concurrent.futures import Future, ThreadPoolExecutor
from datetime import timedelta

from verimail.config import Settings
from verimail.jobs.context import store_for
from verimail.jobs.webhook import Delivery, deliver
from verimail.schemas.jobs import BulkJob, FinderJob
from verimail.store import jobs as job_store
from verimail.store.job_webhooks import claim_webhook, owed_webhooks, webhook_done

log = logging.getLogger(__name__)

# Deliveries for jobs settled outside a flow. Not daemon threads: a process that exits
# right after failing a job still sends its webhook (bounded by the delivery's retries).
_LATER = ThreadPoolExecutor(max_workers=2, thread_name_prefix="verimail-webhook")


async def notify_job(settings: Settings, job_id: int) -> Delivery | None:
    """POST the final job to its ``webhook_url`` (if any), signed with the job's secret.

    Never raises: a receiver that is down must not turn a finished job into a failed one.
    """
    try:
        return await _notify(settings, job_id)
    except Exception:
        log.exception("webhook of job %s failed", job_id)
        return None


def webhook_lease(settings: Settings) -> timedelta:
    """How long a delivery may take (3 attempts, their back-off) and a margin: a claim on
    a job's webhook older than this is a process that died delivering it."""
    return timedelta(seconds=3 * settings.webhook_timeout + 60)


async def _notify(settings: Settings, job_id: int) -> Delivery | None:
    engine = store_for(settings).engine
    job = await asyncio.to_thread(job_store.get_job_any, engine, job_id)
    if job is None or not job.webhook_url or not job.finished:
        return None
    lease = webhook_lease(settings)
    if not await asyncio.to_thread(claim_webhook, engine, job_id, lease):
        return None  # delivered already, or being delivered by another process
    model = FinderJob if job.kind == "finder_csv" else BulkJob
    payload = model.of(job).model_dump(mode="json")
    secret = str((job.options or {}).get("webhook_secret", ""))
    delivery = await deliver(
        job.webhook_url,
        payload,
        secret,
        allow_networks=settings.webhook_allow_networks,
        timeout=settings.webhook_timeout,
    )
    error = None if delivery.delivered else delivery.detail
    if error:
        log.warning("webhook of job %s not delivered: %s", job_id, error)
    await asyncio.to_thread(webhook_done, engine, job_id, error=error)
    return delivery


def deliver_owed_webhooks(settings: Settings) -> list[int]:
    """Deliver (from worker threads) the webhooks of finished jobs that no delivery has
    ended: the process that finished them died before or while it delivered. At least
    once: a process that died right after a delivery makes it twice."""
    owed = owed_webhooks(store_for(settings).engine, webhook_lease(settings))
    for job_id in owed:
        notify_job_soon(settings, job_id)
    return owed


def notify_job_soon(settings: Settings, job_id: int) -> Future[Delivery | None]:
    """:func:`notify_job` from a worker thread, for code that settles a job outside its
    flow — the reaper, the runner's clean-up — which must not wait on a slow receiver."""
    return _LATER.submit(asyncio.run, notify_job(settings, job_id))
