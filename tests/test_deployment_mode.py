"""Deployment mode for real: deployments registered on a Prefect server, worker processes
on a `process` work pool, the API handing bulk jobs to them with `run_deployment`, and the
jobs completing as seen through the API. Store on PostgreSQL, as several machines would.

A worker that dies mid-job (the worker and its flow-run process killed, as when its machine
goes away) leaves the job's heartbeat to go stale; the API's reaper hands the job to the
pool again, another worker completes it, and it is charged once.
"""

from __future__ import annotations

import asyncio
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx
import pytest
from api_helpers import (
    STALE_AFTER,
    api_world,
    env_for_testbed,
    make_customer,
    poll_job,
    running_app,
)
from hardening_helpers import assert_ledger_exact
from sqlalchemy import update

from verimail.runners import deployment as runner_module
from verimail.runners.testing import kill_tree, prefect_worker, worker_env
from verimail.schemas.flows import DEPLOYMENTS
from verimail.store import jobs as job_store
from verimail.store.billing.pools import balance
from verimail.store.billing.prices import price
from verimail.store.tables import jobs
from verimail.store.testing import temporary_database_url
from verimail.testbed.server import Testbed
from verimail.testbed.world import DomainSpec, HostBehaviour, HostSpec, World

pytestmark = [pytest.mark.usefixtures("prefect_harness"), pytest.mark.prefect]


def _worker_env(tb: Testbed, url: str, data: Path, **extra: str) -> dict[str, str]:
    return worker_env(env_for_testbed(tb), database_url=url, data_dir=data, **extra)


def _pool() -> str:
    return f"verimail-test-{os.getpid()}"


async def _register(pool: str) -> None:
    from verimail.runners.deploy import register_deployments

    assert await asyncio.to_thread(register_deployments, pool, schedule=False)


async def test_bulk_job_runs_on_a_worker(testbed_factory, testbed_settings, tmp_path):
    tb = testbed_factory(api_world())
    pool = _pool()
    with temporary_database_url("postgres", tmp_path) as url:
        settings = testbed_settings(
            tb, tmp_path, database_url=url, runner="deployment", prefect_work_pool=pool
        )
        await _register(pool)
        log = tmp_path / "worker.log"
        with prefect_worker(pool, _worker_env(tb, url, tmp_path), log):
            async with running_app(settings) as app:
                customer = app.customer(credits=50)
                created = await app.client.post(
                    "/api/verify/bulk",
                    headers=customer.headers,
                    json={"emails": ["alice@acme.test", "nobody@acme.test"]},
                )
                assert created.status_code == 200, created.text
                job_id = created.json()["job_id"]
                done = await poll_job(app.client, f"/api/verify/bulk/{job_id}", customer.headers)
                worker_log = log.read_text(errors="replace")
                assert done["status"] == "completed", (done, worker_log[-3000:])
                assert [r["status"] for r in done["results"]] == ["valid", "invalid"]


SLOW_HOST = "mx.tortoise.test"


def _slow_world(rows: int) -> World:
    mailboxes = {f"user{i}" for i in range(0, rows, 2)}
    return World.of(
        [HostSpec(SLOW_HOST, HostBehaviour(mailboxes=mailboxes, reply_delay=0.1))],
        [DomainSpec("tortoise.test", mx=[(10, SLOW_HOST)])],
    )


async def test_a_killed_worker_s_job_completes_on_another_worker(
    testbed_factory, testbed_settings, tmp_path
):
    rows, credits = 24, 100
    tb = testbed_factory(_slow_world(rows))
    pool = _pool()
    with temporary_database_url("postgres", tmp_path) as url:
        settings = testbed_settings(
            tb,
            tmp_path,
            database_url=url,
            runner="deployment",
            prefect_work_pool=pool,
            job_stale_after=STALE_AFTER,
        )
        await _register(pool)
        env = _worker_env(tb, url, tmp_path, VERIMAIL_JOB_STALE_AFTER=str(STALE_AFTER))
        async with running_app(settings) as app:
            customer = app.customer(credits=credits)
            emails = [f"user{i}@tortoise.test" for i in range(rows)]
            with prefect_worker(pool, env, tmp_path / "first-worker.log") as first:
                created = await app.client.post(
                    "/api/verify/bulk", headers=customer.headers, json={"emails": emails}
                )
                assert created.status_code == 200, created.text
                job_id = created.json()["job_id"]
                # Mid-job: the first worker's flow run holds a session on the slow host.
                reached = await asyncio.to_thread(
                    tb.wait_until, lambda t: t.host_stats(SLOW_HOST).active >= 1
                )
                assert reached, (tmp_path / "first-worker.log").read_text(errors="replace")
                kill_tree(first.pid)  # the worker and its flow-run process, at once
            sessions_before = tb.host_stats(SLOW_HOST).sessions
            with prefect_worker(pool, env, tmp_path / "second-worker.log"):
                done = await poll_job(app.client, f"/api/verify/bulk/{job_id}", customer.headers)
            logs = "".join(
                (tmp_path / f"{n}-worker.log").read_text(errors="replace")
                for n in ("first", "second")
            )
            assert done["status"] == "completed", (done, logs[-3000:])
            assert done["processed_emails"] == rows
            assert (done["valid_count"], done["invalid_count"]) == (rows // 2, rows // 2)
            assert tb.host_stats(SLOW_HOST).sessions > sessions_before  # the second did it
            job = job_store.get_job_any(app.store.engine, int(job_id))
            assert job is not None and (job.options or {}).get("attempts") == 2
            assert (job.credits_reserved, job.credits_refunded) == (rows, 0)
            assert_ledger_exact(app.store, customer.account_id)
            assert balance(app.store.engine, customer.account_id).total == credits - rows


async def test_a_queued_job_is_held_and_a_dead_run_is_resumed(
    testbed_settings, tmp_path, monkeypatch
):
    """No worker at all: the job's flow run waits in the pool (Scheduled), which is queued,
    not dead, however old its heartbeat — the reaper leaves it alone, also while Prefect
    cannot be asked (it took the job for dead, failed to resubmit it and failed it). Once
    Prefect shows the run Running with a silent heartbeat (its worker died), the reaper
    resumes it."""
    from prefect.client.orchestration import get_client
    from prefect.states import Running

    from verimail.config import Settings
    from verimail.jobs.recovery import recover_stale_jobs
    from verimail.runners.deployment import DeploymentRunner
    from verimail.store.db import init_store, utcnow

    pool = _pool()
    await _register(pool)
    with temporary_database_url("postgres", tmp_path) as url:
        settings = Settings(
            data_dir=tmp_path, database_url=url, runner="deployment", prefect_work_pool=pool
        )
        store = init_store(settings)
        try:
            customer = make_customer(store, credits=10)
            job = job_store.create_job(store.engine, customer.account_id, "bulk_json", 1, reserve=1)
            assert job is not None
            runner = DeploymentRunner(settings)
            await asyncio.to_thread(runner.submit, "bulk", job.id)
            run_id = job_store.get_job_any(store.engine, job.id).flow_run_id
            assert run_id

            def silence() -> None:  # its last sign of life, long ago (keep_alive never
                # moves a heartbeat back, so the test writes it itself)
                with store.engine.begin() as conn:
                    long_ago = utcnow().replace(year=2000)
                    conn.execute(
                        update(jobs).where(jobs.c.id == job.id).values(heartbeat_at=long_ago)
                    )

            silence()
            assert await asyncio.to_thread(recover_stale_jobs, settings, runner) == []
            queued = job_store.get_job_any(store.engine, job.id)
            assert queued.status == "pending" and (queued.options or {}).get("attempts", 1) == 1

            def prefect_down(run_ids: list) -> dict:
                raise httpx.ConnectError("All connection attempts failed")

            with monkeypatch.context() as outage:
                outage.setattr(runner_module, "_flow_run_states", prefect_down)
                silence()
                assert await asyncio.to_thread(recover_stale_jobs, settings, runner) == []
            held = job_store.get_job_any(store.engine, job.id)
            assert held.status == "pending" and (held.options or {}).get("attempts", 1) == 1

            async with get_client() as client:
                await client.set_flow_run_state(run_id, Running(), force=True)
            silence()
            handled = await asyncio.to_thread(recover_stale_jobs, settings, runner)
            assert handled == [(job.id, "resumed")]
            resumed = job_store.get_job_any(store.engine, job.id)
            assert (resumed.options or {}).get("attempts") == 2
            assert resumed.flow_run_id not in (None, run_id)  # a new run was handed to the pool
        finally:
            store.close()


def _grey_world(plain_mailbox: str, grey_mailbox: str) -> World:
    """``acme.test`` answers at once; ``grey.test`` greylists each recipient for 2 s."""
    return World.of(
        [
            HostSpec("mx.acme.test", HostBehaviour(mailboxes={plain_mailbox})),
            HostSpec("mx.grey.test", HostBehaviour(mailboxes={grey_mailbox}, greylist_delay=2.0)),
        ],
        [
            DomainSpec("acme.test", mx=[(10, "mx.acme.test")]),
            DomainSpec("grey.test", mx=[(10, "mx.grey.test")]),
        ],
    )


async def _scheduled_pass(
    app, url: str, headers: dict[str, str], job_row: Callable[[], job_store.Job], log: Path
) -> tuple[dict[str, Any], Any]:
    """Poll the job at ``url`` until it is parked and the Prefect run of its first retry
    pass exists: (the job's body then, that flow run). The parking run schedules the
    pass after the job shows it waits, so both are waited for."""
    from prefect.client.orchestration import get_client

    deadline = asyncio.get_running_loop().time() + 180
    async with get_client() as client:
        while True:
            body = (await app.client.get(url, headers=headers)).json()
            assert body["status"] in ("pending", "processing"), body
            flow_run_id = job_row().flow_run_id
            if body.get("phase") == "waiting_to_retry" and flow_run_id:
                run = await client.read_flow_run(flow_run_id)
                if run.parameters.get("retry_pass") == 1:
                    return body, run
            assert asyncio.get_running_loop().time() < deadline, log.read_text()[-3000:]
            await asyncio.sleep(0.2)


async def test_a_parked_job_waits_as_a_scheduled_flow_run_and_frees_the_worker(
    testbed_factory, testbed_settings, tmp_path
):
    """Deferred retries with workers (issue 22): the first pass parks the greylisted
    addresses and schedules the next pass as a Prefect ``Scheduled`` flow run; meanwhile the
    one worker runs another job to the end; then the pass runs and settles them."""
    tb = testbed_factory(_grey_world("alice", "dora"))
    pool = _pool()
    retry = {"VERIMAIL_JOB_RETRY_DELAY": "25", "VERIMAIL_SMTP_GREYLIST_RETRIES": "0"}
    with temporary_database_url("postgres", tmp_path) as url:
        settings = testbed_settings(
            tb,
            tmp_path,
            database_url=url,
            runner="deployment",
            prefect_work_pool=pool,
            job_retry_delay=25.0,
            smtp_greylist_retries=0,
        )
        await _register(pool)
        log = tmp_path / "worker.log"
        with prefect_worker(pool, _worker_env(tb, url, tmp_path, **retry), log):
            async with running_app(settings) as app:
                customer = app.customer(credits=50)
                created = await app.client.post(
                    "/api/verify/bulk",
                    headers=customer.headers,
                    json={"emails": ["dora@grey.test", "nobody@grey.test", "alice@acme.test"]},
                )
                job_id = created.json()["job_id"]
                first = f"/api/verify/bulk/{job_id}"
                body, run = await _scheduled_pass(
                    app,
                    first,
                    customer.headers,
                    lambda: job_store.get_job_any(app.store.engine, job_id),
                    log,
                )
                assert body["retry_waiting"] == 2
                assert run.state.type.name == "SCHEDULED"
                second = await app.client.post(
                    "/api/verify/bulk",
                    headers=customer.headers,
                    json={"emails": ["alice@acme.test"]},
                )
                other = await poll_job(
                    app.client,
                    f"/api/verify/bulk/{second.json()['job_id']}",
                    customer.headers,
                )
                assert other["status"] == "completed"
                still = (await app.client.get(first, headers=customer.headers)).json()
                assert still["phase"] == "waiting_to_retry", still  # the other job went first
                done = await poll_job(app.client, first, customer.headers)
                assert done["status"] == "completed", (done, log.read_text()[-3000:])
                got = {r["email"]: r["status"] for r in done["results"]}
                assert got == {
                    "dora@grey.test": "valid",
                    "nobody@grey.test": "invalid",
                    "alice@acme.test": "valid",
                }


async def test_a_parked_finder_job_waits_as_a_scheduled_run_of_its_deployment(
    testbed_factory, testbed_settings, tmp_path
):
    """Finder CSV jobs park with workers too (issue 22): the worker's first pass parks the
    greylisted row and schedules ``find-emails`` again (not ``bulk-verify``) as a Prefect
    ``Scheduled`` run; the pass finds the person on the worker, charged once."""
    from prefect.client.orchestration import get_client

    tb = testbed_factory(_grey_world("ann.lee", "ddiaz"))
    pool = _pool()
    retry = {"VERIMAIL_JOB_RETRY_DELAY": "6", "VERIMAIL_SMTP_GREYLIST_RETRIES": "0"}
    people = "first_name,last_name,domain\nAnn,Lee,acme.test\nDora,Diaz,grey.test\n"
    with temporary_database_url("postgres", tmp_path) as url:
        settings = testbed_settings(
            tb,
            tmp_path,
            database_url=url,
            runner="deployment",
            prefect_work_pool=pool,
            job_retry_delay=6.0,
            smtp_greylist_retries=0,
        )
        await _register(pool)
        log = tmp_path / "worker.log"
        with prefect_worker(pool, _worker_env(tb, url, tmp_path, **retry), log):
            async with running_app(settings) as app:
                customer = app.customer(credits=100)
                created = await app.client.post(
                    "/api/find-email/csv",
                    headers=customer.headers,
                    files={"file": ("people.csv", people.encode(), "text/csv")},
                )
                assert created.status_code == 200, created.text
                public_id = created.json()["job_id"]
                url_ = f"/api/find-email/csv/{public_id}"
                body, scheduled = await _scheduled_pass(
                    app,
                    url_,
                    customer.headers,
                    lambda: job_store.get_job_by_public_id(
                        app.store.engine, customer.account_id, public_id
                    ),
                    log,
                )
                async with get_client() as client:
                    deployment = await client.read_deployment(scheduled.deployment_id)
                assert body["retry_waiting"] == 1
                assert deployment.name == DEPLOYMENTS["finder"].split("/")[1]
                done = await poll_job(app.client, url_, customer.headers)
                assert done["status"] == "completed", (done, log.read_text()[-3000:])
                charge = price("find", 1, settings)
                assert (done["found_count"], done["credits_used"]) == (2, 2 * charge), done
