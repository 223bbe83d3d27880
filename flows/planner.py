"""The run planner: the one place verimail makes a Prefect flow run.

Every run of a flow is asked for as a :class:`RunRequest` — which flow (by its key in
``schemas/flows.py``), its parameters, a name that says what it does ("bulk job 12 · shard 3
of 7", "bulk job 12 · retry pass 1 of 2", "bulk job 12 · merge") and a key that makes it
one run — and made here, in one of four ways:

- **to the pool** (:func:`submit_to_pool`): a run of the flow's deployment, which any worker
  takes, with the key as Prefect's idempotency key: asked twice (a timer and the reaper, two
  shards ending together), Prefect gives the first run back instead of a second one;
- **here** (:func:`run_here`): the local runner's thread runs the flow itself, named at once
  (the local runner keeps its own set of keys in flight);
- **later** (:func:`plan_later`): a Scheduled run in Prefect for a list's next
  re-verification or an operator run's retry pass (with workers the deployment's; with the
  local runner a tagged run that its sweep claims when due);
- **inline** (:func:`run_inline`): a subflow of the run at hand (a list's scheduled run works
  its job as a ``bulk-verify`` subflow).

Flows and the job-run service *return* the runs that come next, in their outcome's
``next_runs``; the flow's last step is :func:`hand_over`, which submits them to the pool when
the run is a deployment's (no one else sees its outcome there) and otherwise leaves them to
the local runner that called the flow. Why here and not in ``runners/``: the flows hand
their next runs over from inside a worker's process, and flows may not import the runners;
the runners import this module.
"""

from __future__ import annotations

import asyncio
import importlib
import logging
import uuid
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from verimail.config import Settings, using_settings
from verimail.flows.failures import prefect_api_error
from verimail.flows.summary import installation_id, job_words, run_name
from verimail.jobs.context import store_for
from verimail.jobs.reverify import run_name as list_run_name
from verimail.schemas.flows import BY_KEY, flow_of_job
from verimail.store import job_shards
from verimail.store import jobs as job_store

log = logging.getLogger(__name__)

LIST_RUN_TAG = "verimail-reverify-schedule"
"""Tag of every scheduled re-verification of a list (the local runner claims them by it)."""
RETRY_RUN_TAG = "verimail-reverify-retry"
"""Tag of every planned retry pass of an operator's re-verification."""
SUBMIT_TRIES = 4
"""A run handed to the pool is asked for up to this many times while Prefect answers with an
error (1, 2, 4 s apart): a Prefect server that is restarting must not lose a job's next run.
The idempotency key makes a retried request that did reach Prefect the same run."""


@dataclass(frozen=True)
class RunRequest:
    """One flow run asked for: what it runs, what it is called, what makes it one run."""

    flow: str
    """The flow's key in ``schemas/flows.py``."""
    parameters: dict[str, Any]
    name: str
    key: str = ""
    """One run per key (Prefect's idempotency key; the local runner's key in flight); empty
    for a run planned for later (:func:`plan_later`)."""
    at: datetime | None = None
    """When it starts (a deferred retry pass); None: now."""
    tags: tuple[str, ...] = ()
    job_id: int | None = None
    """The job whose run this is: its run id is recorded on the job (or the shard) once made."""
    shard: int | None = None


def _key(settings: Settings, what: str) -> str:
    """A run's key, unique to this installation (several may share one Prefect database)."""
    return f"verimail-{installation_id(settings)}-{what}"


def job_request(
    settings: Settings,
    job: job_store.Job,
    *,
    attempt: int | None = None,
    retry_pass: int = 0,
    at: datetime | None = None,
) -> RunRequest:
    """Run ``attempt`` (default: the job's run now) of a job: its first pass, or with
    ``retry_pass`` that deferred pass, starting at ``at``."""
    attempt = job.attempt if attempt is None else attempt
    parameters: dict[str, Any] = {"job_id": job.id, "attempt": attempt}
    name, what = run_name(job), f"job-{job.id}-run-{attempt}"
    if retry_pass:
        parameters["retry_pass"] = retry_pass
        name = f"{job_words(job)} · retry pass {retry_pass} of {settings.job_retry_passes}"
        what += f"-retry-{retry_pass}"
    flow = flow_of_job(job.kind).key
    tags = (job_tag(settings, job.id),)
    return RunRequest(flow, parameters, name, _key(settings, what), at, tags, job_id=job.id)


def merge_request(settings: Settings, job: job_store.Job) -> RunRequest:
    """The merge of a sharded job whose shards are all done: a ``bulk-verify`` run of the job
    (its run now), which puts the shards' results together and ends the job."""
    parameters = {"job_id": job.id, "attempt": job.attempt}
    what = f"job-{job.id}-run-{job.attempt}-merge"
    name = f"{job_words(job)} · merge"
    tags = (job_tag(settings, job.id),)
    return RunRequest("bulk", parameters, name, _key(settings, what), tags=tags, job_id=job.id)


def shard_request(
    settings: Settings, job: job_store.Job, shard: int, attempt: int, total: int
) -> RunRequest:
    """Run ``attempt`` of shard ``shard`` (from 0) of a big bulk job of ``total`` shards."""
    parameters = {"job_id": job.id, "shard": shard, "attempt": attempt}
    what = f"job-{job.id}-shard-{shard}-run-{attempt}"
    name = f"{job_words(job)} · shard {shard + 1} of {total}"
    tags = (job_tag(settings, job.id),)
    key = _key(settings, what)
    return RunRequest("shard", parameters, name, key, tags=tags, job_id=job.id, shard=shard)


def job_tag(settings: Settings, job_id: int) -> str:
    """The tag every run of a job carries (``verimail-<installation>-job-12``): a job's runs
    at a glance in the Prefect UI's filter, whatever their names."""
    return _key(settings, f"job-{job_id}")


def from_deployment() -> bool:
    """The flow run this code runs in is a deployment's (a worker took it from the work pool),
    not the local runner's, a subflow or a direct call. A run it plans for later belongs to
    that deployment too, whatever the worker's own ``runner`` setting says."""
    try:
        from prefect.context import get_run_context

        return get_run_context().flow_run.deployment_id is not None  # type: ignore[union-attr]
    except Exception:  # (no run here)
        return False


def _record(settings: Settings, request: RunRequest, flow_run_id: str) -> None:
    """Keep the run's id on the job (or its shard): the reaper reads its state to tell a run
    queued for a worker from a dead one. Refused when a later run has the job."""
    if request.job_id is None:
        return
    engine = store_for(settings).engine
    attempt = request.parameters.get("attempt")
    if request.shard is not None:
        job_shards.set_flow_run(engine, request.job_id, request.shard, flow_run_id, attempt)
    else:
        job_store.set_flow_run_id(engine, request.job_id, flow_run_id, attempt=attempt)


async def submit_to_pool(settings: Settings, request: RunRequest) -> str:
    """A run of the flow's deployment, in the work pool (Scheduled at ``request.at``); its
    id. The same key gives the same run."""
    from prefect.deployments import run_deployment

    entry = BY_KEY[request.flow]
    for tries in range(1, SUBMIT_TRIES + 1):
        try:
            run = await run_deployment(  # type: ignore[misc]
                entry.deployment,
                parameters=request.parameters,
                scheduled_time=request.at,
                flow_run_name=request.name,
                tags=list(request.tags) or None,
                idempotency_key=request.key,
                timeout=0,
                as_subflow=False,
            )
            break
        except Exception as exc:
            if tries == SUBMIT_TRIES or not prefect_api_error(exc):
                raise
            log.warning("handing %r to the pool failed (%r); trying again", request.name, exc)
            await asyncio.sleep(2 ** (tries - 1))
    await asyncio.to_thread(_record, settings, request, str(run.id))
    return str(run.id)


def submit_to_pool_now(settings: Settings, request: RunRequest) -> str:
    """:func:`submit_to_pool` from synchronous code (the API's request threads, the reaper)."""
    from prefect.utilities.asyncutils import run_coro_as_sync

    return run_coro_as_sync(submit_to_pool(settings, request))  # type: ignore[return-value]


def load_flow(key: str) -> Any:
    """The flow object registered as ``key`` (imported now: ``import prefect`` takes ~2 s)."""
    entry = BY_KEY[key]
    return getattr(importlib.import_module(f"verimail.{entry.module}"), entry.attr)


def _named(request: RunRequest) -> Any:
    # (Prefect formats a run name with the parameters: braces in a file name are escaped.)
    name = request.name.replace("{", "{{").replace("}", "}}")
    return load_flow(request.flow).with_options(flow_run_name=name)


def run_here(settings: Settings, request: RunRequest) -> Any:
    """Run the flow in this thread, on an event loop of its own; its outcome."""
    from prefect import tags

    with using_settings(settings), tags(*request.tags):
        return asyncio.run(_named(request)(**request.parameters))


async def run_inline(request: RunRequest) -> Any:
    """Run the flow as a subflow of the run at hand; its outcome."""
    return await _named(request)(**request.parameters)


async def hand_over(settings: Settings, outcome: Any) -> Any:
    """A flow's last step: the runs its work says come next (``next_runs``), submitted to the
    pool when this run is a deployment's; otherwise left in the outcome for the runner that
    called the flow (the local runner runs them itself, a parent flow hands them on)."""
    requests: list[RunRequest] = outcome.get("next_runs") if isinstance(outcome, dict) else None
    if not requests or not from_deployment():
        return outcome
    for request in requests:
        await submit_to_pool(settings, request)
    return {**outcome, "next_runs": [request.name for request in requests]}


async def plan_later(settings: Settings, request: RunRequest) -> str:
    """A Scheduled run at ``request.at``; its id. With workers (or in a worker's run) it is
    the deployment's and a worker takes it when due; with the local runner it belongs to no
    deployment and the API process's sweep claims it by its tag (``runners/sweep.py``)."""
    from prefect.client.orchestration import get_client
    from prefect.states import Scheduled

    state = Scheduled(scheduled_time=request.at)
    entry = BY_KEY[request.flow]
    async with get_client() as client:
        if settings.runner == "deployment" or from_deployment():
            deployment = await client.read_deployment_by_name(entry.deployment)
            run = await client.create_flow_run_from_deployment(
                deployment.id,
                parameters=request.parameters,
                state=state,
                name=request.name,
                tags=list(request.tags),
            )
        else:
            run = await client.create_flow_run(
                load_flow(request.flow),
                name=request.name,
                parameters=request.parameters,
                tags=list(request.tags),
                state=state,
            )
    return str(run.id)


@dataclass(frozen=True)
class PlannedRun:
    flow_run_id: str
    scheduled_time: datetime


async def plan_list_run(
    settings: Settings, store: Any, account_id: int, list_job: int, when: datetime
) -> PlannedRun:
    """The Scheduled ``reverify-stored`` run that re-verifies a list at ``when``. (No key: a
    schedule moved back to a date it had before must not get its cancelled run back.)"""
    request = RunRequest(
        "reverify",
        {"account_id": account_id, "list_job_id": list_job},
        list_run_name(store, account_id, list_job),
        at=when,
        tags=(LIST_RUN_TAG, f"account:{account_id}", f"list:{list_job}"),
    )
    return PlannedRun(await plan_later(settings, request), when)


def run_claimed(settings: Settings, key: str, flow_run: Any) -> Any:
    """Run a flow run that Prefect already has and this process claimed (a warm worker's, the
    local runner's planned runs) to its end on this thread's own event loop; its outcome."""
    from prefect.flow_engine import run_flow

    with using_settings(settings):
        result = run_flow(load_flow(key), flow_run=flow_run, parameters=flow_run.parameters)
        if asyncio.iscoroutine(result):
            return asyncio.run(result)
        return result


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
