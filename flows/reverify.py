"""The ``reverify-stored`` flow: verify a stored list again and report what changed.

What to re-verify, in this order: a customer's list on its schedule (``account_id`` and
``list_job_id``: see below), a past job (``job_id``), a file (``file_path``), or — on the
weekly schedule, with no parameters — every address whose latest verification is older
than ``older_than_days``. Runs of the last three are operator work: nothing is charged.

A list's scheduled run plans the schedule's next run (``flows/planner.py``), then
makes a re-verification job of the owner's, charged like any bulk job (skipped, with the
reason in its history and this run's log, when the balance is short), and runs it as a
``bulk-verify`` subflow (whose next runs, a deferred retry pass, this run hands on): the
job's download and its webhook carry the transitions.

Writes the new results to the history and a change report CSV
(``<data_dir>/reports/reverify-<time>.csv``: email, previous_status, status,
previous_verified_at, reason) and returns the transitions counted, e.g.
``{"valid->invalid": 3}``. Addresses the servers put off are parked for deferred retry
passes (``jobs/reverify_parking.py``): follow-up runs of this flow (``retry_of``,
``retry_pass``) ask them again later and update the same report.
"""

from __future__ import annotations

import asyncio
import re
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from prefect import flow, get_run_logger
from prefect.context import get_run_context
from pydantic.json_schema import SkipJsonSchema

from verimail.config import Settings, current_settings
from verimail.files import change_report as report_file
from verimail.files.bulk_io import results_frame
from verimail.flows import planner
from verimail.flows.failures import refused
from verimail.flows.summary import name_this_run, publish_table, transition_rows
from verimail.jobs import retries
from verimail.jobs import reverify as lists
from verimail.jobs import reverify_parking as parking
from verimail.jobs.context import store_for
from verimail.jobs.forms import FormError
from verimail.schemas.results import VerificationResult
from verimail.store import jobs as job_store
from verimail.store import reverify as reverify_store
from verimail.tasks.job_files import record_history
from verimail.tasks.pipeline import verify_pass


def _artifact_name(job_id: int | None, file_path: str | None, older_than_days: int) -> str:
    """One artifact key per list re-verified (its versions are the list's history)."""
    if job_id is not None:
        return f"reverify-job-{job_id}"
    if file_path is not None:
        stem = re.sub(r"[^a-z0-9]+", "-", Path(file_path).stem.lower()).strip("-")
        return f"reverify-file-{stem or 'file'}"
    return f"reverify-older-than-{older_than_days}-days"


@flow(name="reverify-stored", persist_result=False, log_prints=True)
async def reverify_stored(
    job_id: int | SkipJsonSchema[None] = None,
    file_path: str | SkipJsonSchema[None] = None,
    older_than_days: int = 30,
    retry_unknowns: bool = True,
    account_id: SkipJsonSchema[int | None] = None,
    list_job_id: SkipJsonSchema[int | None] = None,
    retry_of: SkipJsonSchema[str | None] = None,
    retry_pass: SkipJsonSchema[int] = 0,
) -> Any:
    """Re-verify a job's, a file's, or all stale addresses; report status changes.

    Args:
        job_id: A completed bulk job to verify again (its number). Leave empty for a file
            or for the stale addresses.
        file_path: A CSV file inside the shared data dir (e.g. inbox/leads.csv) to verify
            again and compare with the history. Leave empty for a job or the stale addresses.
        older_than_days: With neither a job nor a file: re-verify every address whose
            latest verification is older than this many days.
        retry_unknowns: Ask greylisted and temporarily failed addresses again later (a
            follow-up run, after VERIMAIL_JOB_RETRY_DELAY), updating the report; off: the
            report is final after this run.
        account_id: (Set by a list's schedule, hidden from the form.) The list's owner.
        list_job_id: (Set by a list's schedule, hidden from the form.) The list's first job.
        retry_of: (Set by a parked run, hidden from the form.) The report to update.
        retry_pass: (Set by a parked run, hidden from the form.) Which retry pass this is.
    """
    settings = current_settings()
    if list_job_id is not None:  # a customer's list, on its schedule
        if account_id is None:
            return refused("A list's scheduled run needs both its account and its list.")
        outcome = await run_scheduled(settings, account_id, list_job_id)
    elif retry_of is not None:  # an operator run's deferred retry pass
        outcome = await _retry_pass(settings, retry_of, retry_pass)
    else:  # an operator run: a job, a file, or the stale addresses
        outcome = await _operator_run(settings, job_id, file_path, older_than_days, retry_unknowns)
    return await planner.hand_over(settings, outcome)


async def _operator_run(
    settings: Settings,
    job_id: int | None,
    file_path: str | None,
    older_than_days: int,
    retry_unknowns: bool,
) -> Any:
    """Verify a job's, a file's or the stale addresses again (charging no one), write the
    change report, and park what the servers put off for a later pass."""
    what = (
        f"job {job_id}"
        if job_id is not None
        else Path(file_path).name
        if file_path is not None
        else f"addresses older than {older_than_days} days"
    )
    await name_this_run(f"reverify {what}")
    try:
        addresses = await asyncio.to_thread(
            lists.addresses_to_reverify, settings, job_id, file_path, older_than_days
        )
    except FormError as exc:
        return refused(str(exc))
    follows = retries.wanted(settings, retry_unknowns) and (
        retries.plan(settings, 0, 0.0) is not None
    )
    greylist_retries = retries.in_pass_greylist_retries(settings, deferred_pass_follows=follows)
    results = await _verify(addresses, what, greylist_retries)
    previous = await asyncio.to_thread(
        report_file.previous_statuses, settings.data_dir, addresses, results
    )
    await _to_history(settings, addresses, results, job_id)
    reports = parking.reports_dir(settings)
    reports.mkdir(parents=True, exist_ok=True)
    report = reports / f"reverify-{datetime.now(UTC):%Y%m%dT%H%M%S%f}.csv"
    changed = report_file.changes(addresses, results, previous)
    await asyncio.to_thread(report_file.write_report, report, changed)
    done = parking.Parked.model_construct(  # (unchecked: a weekly run's list is long)
        report=report.name, retry_pass=0, next_retry_at=datetime.now(UTC), waited=0.0,
        addresses=addresses, previous=previous, mail_from=settings.smtp_mail_from,
        job_id=job_id, what=what, artifact=_artifact_name(job_id, file_path, older_than_days),
    )  # fmt: skip
    waiting = parking.retryable(zip(addresses, results, strict=True))
    if not retries.wanted(settings, retry_unknowns):
        waiting = []
    return await _end_pass(settings, done, changed, waiting)


async def _retry_pass(settings: Settings, report_name: str, retry_pass: int) -> Any:
    """A parked run's follow-up: ask its parked addresses again, replace their rows in its
    report, then park what is still put off again or end."""
    logger = get_run_logger()
    try:
        parked = await asyncio.to_thread(parking.take, settings, report_name, retry_pass)
    except ValueError as exc:
        return refused(str(exc))
    if parked is None:
        gone = "this pass does not wait (another run took it, or the retries ended)"
        logger.info("%s: nothing to do: %s", report_name, gone)
        return {"report": report_name, "retry_pass": retry_pass, "skipped": gone}
    try:
        if parked.mail_from != settings.smtp_mail_from:
            logger.warning(
                "%s: the first pass's envelope sender was %s, this run's is %s: greylisting "
                "servers take this retry for a new try",
                report_name, parked.mail_from, settings.smtp_mail_from,
            )  # fmt: skip
        addresses = parked.addresses
        follows = retries.plan(settings, retry_pass, parked.waited) is not None
        greylist_retries = retries.in_pass_greylist_retries(settings, deferred_pass_follows=follows)
        results = await _verify(
            addresses, f"{parked.what}, retry pass {retry_pass}", greylist_retries
        )
        await _to_history(settings, addresses, results, parked.job_id)
        report = parking.reports_dir(settings) / report_name
        fresh = report_file.changes(addresses, results, parked.previous)
        changed = await asyncio.to_thread(report_file.update_report, report, addresses, fresh)
        waiting = parking.retryable(zip(addresses, results, strict=True))
        return await _end_pass(settings, parked, changed, waiting)
    finally:
        await asyncio.to_thread(parking.release, settings, report_name)


async def _end_pass(
    settings: Settings, done: parking.Parked, changed: list[dict[str, Any]], waiting: list[str]
) -> dict[str, Any]:
    """After pass ``done`` (``retry_pass`` 0: the first run), ``changed`` being the report's
    rows now: park ``waiting`` for the next pass if one is left, then say so (log, artifact,
    the return value)."""
    logger = get_run_logger()
    report = parking.reports_dir(settings) / done.report
    parked = await _park(settings, done, waiting) if waiting else None
    transitions = report_file.transitions(changed)
    summary = f"{len(done.addresses)} addresses re-verified, {len(changed)} changed status"
    if done.retry_pass:
        summary = (
            f"retry pass {done.retry_pass}: {len(done.addresses)} addresses re-verified, the "
            f"report now has {len(changed)} status changes"
        )
    if parked is not None:
        summary += (
            f"; {len(waiting)} addresses parked, retry pass {parked.retry_pass} at "
            f"{parked.next_retry_at:%Y-%m-%d %H:%M:%S} UTC, report will be updated"
        )
    elif done.retry_pass:
        summary += "; the report is final"
    logger.info("%s: %s", done.report, summary)
    await publish_table(
        settings,
        done.artifact,
        transition_rows(transitions),
        f"reverify {done.what}: {summary}; report {report}",
    )
    return {
        "addresses": len(done.addresses),
        "changed": len(changed),
        "transitions": dict(transitions),
        "report": str(report),
        "retry_pass": done.retry_pass,
        "retry_waiting": len(waiting) if parked is not None else 0,
        "next_retry_at": parked.next_retry_at.isoformat() if parked is not None else None,
    }


async def _park(
    settings: Settings, done: parking.Parked, waiting: list[str]
) -> parking.Parked | None:
    """After pass ``done`` (``retry_pass`` 0: the first run): park ``waiting`` for the next
    pass — its run planned in Prefect, what it needs saved beside the report — and return
    it; None when no pass is left (``job_retry_passes``, ``job_retry_max_wait``), or when
    Prefect cannot plan the run (logged): the report then stays as this pass left it."""
    planned = retries.plan(settings, done.retry_pass, done.waited)
    if planned is None:
        return None
    retry_pass, at, waited = planned
    try:
        request = planner.RunRequest(
            "reverify",
            {"retry_of": done.report, "retry_pass": retry_pass},
            f"reverify {done.what} · retry pass {retry_pass} of {settings.job_retry_passes}",
            at=at,
            tags=(planner.RETRY_RUN_TAG,),
        )
        run_id = await planner.plan_later(settings, request)
    except Exception as exc:
        get_run_logger().warning(
            "could not plan retry pass %s of %s: %s", retry_pass, done.report, exc
        )
        return None
    parked = done.model_copy(
        update={
            "retry_pass": retry_pass,
            "next_retry_at": at,
            "waited": waited,
            "addresses": waiting,
            "previous": {a: done.previous[a] for a in waiting if a in done.previous},
            "flow_run_id": run_id,
        }
    )
    await asyncio.to_thread(parking.save, settings, parked)
    return parked


async def _verify(
    addresses: list[str], what: str, greylist_retries: int
) -> list[VerificationResult]:
    """Each address's result, in order (the verify pipeline: Prefect tasks per chunk of
    mail-host groups; ``greylist_retries``: in-pass, none when a deferred pass follows)."""
    results: dict[str, VerificationResult] = {}
    passing = verify_pass(addresses, what=f"reverify {what}", greylist_retries=greylist_retries)
    async for settled in passing:
        results.update(settled)
    return [results[a] for a in addresses]


async def _to_history(
    settings: Settings,
    addresses: list[str],
    results: list[VerificationResult],
    job_id: int | None,
) -> None:
    await record_history(
        settings.data_dir,
        results_frame(dict(zip(addresses, results, strict=True))),
        job_id=job_id,
        account_id=None,
        source="reverify",
    )


async def run_scheduled(settings: Settings, account_id: int, list_job: int) -> dict[str, Any]:
    """A list's scheduled run: plan the next one, then re-verify as the owner's job."""
    logger = get_run_logger()
    store = store_for(settings)
    me = str(get_run_context().flow_run.id)  # type: ignore[union-attr]
    schedule = await asyncio.to_thread(
        reverify_store.get_schedule, store.engine, account_id, list_job
    )
    changed = "the list's schedule was changed or cancelled after this run was planned"
    if schedule is None or schedule.flow_run_id != me:
        logger.info("list %s: nothing to do: %s", list_job, changed)
        return {"list_job_id": list_job, "skipped": changed}
    # The successor first: a run that fails below must not end the schedule.
    when = lists.next_after(schedule.next_run_at, schedule.every_days, datetime.now(UTC))
    planned = await planner.plan_list_run(settings, store, account_id, list_job, when)
    if not await asyncio.to_thread(
        reverify_store.set_flow_run,
        store.engine,
        schedule.id,
        planned.flow_run_id,
        when,
        expected=me,
    ):  # (changed or cancelled this very moment: neither run is the schedule's)
        await planner.cancel_run(planned.flow_run_id, "the schedule changed meanwhile")
        logger.info("list %s: nothing to do: %s", list_job, changed)
        return {"list_job_id": list_job, "skipped": changed}
    previous = await asyncio.to_thread(
        reverify_store.latest_completed, store.engine, account_id, list_job
    )
    webhook_url, secret = await asyncio.to_thread(lists.list_webhook, store, account_id, list_job)
    reason = None
    job = None
    if previous is None:
        reason = "the list has no completed run to compare with"
    else:
        try:
            job = await asyncio.to_thread(
                lists.create_reverify_job, store, settings, previous,
                webhook_url=webhook_url, webhook_secret=secret,
                schedule_id=schedule.id, flow_run_id=me,
            )  # fmt: skip
        except lists.NotReverifiable as exc:
            reason = str(exc)
        else:
            if job is None:
                reason = await asyncio.to_thread(lists.short_of_credits, store, previous)
    if job is None:
        await asyncio.to_thread(
            reverify_store.record_run, store.engine, None, account_id=account_id,
            list_job=list_job, previous_job_id=previous.id if previous else list_job,
            schedule_id=schedule.id, skipped_reason=reason, flow_run_id=me,
        )  # fmt: skip
        logger.warning("list %s of account %s skipped: %s", list_job, account_id, reason)
        return {"list_job_id": list_job, "skipped": reason, "next_run_at": when.isoformat()}
    logger.info("list %s of account %s: re-verifying as job %s", list_job, account_id, job.id)
    ran = await planner.run_inline(planner.job_request(settings, job))
    done = await asyncio.to_thread(job_store.get_job_any, store.engine, job.id)
    return {
        "list_job_id": list_job,
        "job_id": job.id,
        "status": done.status if done else None,
        "transitions": (done.options or {}).get("transitions") if done else None,
        "next_run_at": when.isoformat(),
        "next_runs": ran.get("next_runs") if isinstance(ran, dict) else None,
    }
