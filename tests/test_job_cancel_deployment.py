"""Issue 45 point 2 with workers (deployment mode, PostgreSQL store, a process worker): a
parked job's planned retry pass is cancelled in Prefect when its owner cancels the job, and
a job whose worker was killed mid-run is cancelled exactly once — the reaper does not
resume it afterwards, and the ledger adds up."""

from __future__ import annotations

import asyncio

import pytest
from api_helpers import running_app
from hardening_helpers import assert_ledger_exact
from test_deployment_mode import (
    SLOW_HOST,
    _grey_world,
    _pool,
    _register,
    _scheduled_pass,
    _slow_world,
    _worker_env,
)

from verimail.jobs.recovery import recover_stale_jobs
from verimail.runners.testing import kill_tree, prefect_worker
from verimail.store import jobs as job_store
from verimail.store.billing.pools import balance
from verimail.store.testing import temporary_database_url

pytestmark = [pytest.mark.usefixtures("prefect_harness"), pytest.mark.prefect]


async def test_cancelling_a_parked_job_cancels_its_planned_pass_in_prefect(
    testbed_factory, testbed_settings, tmp_path
):
    from prefect.client.orchestration import get_client

    tb = testbed_factory(_grey_world("alice", "dora"))
    pool = _pool()
    retry = {"VERIMAIL_JOB_RETRY_DELAY": "900", "VERIMAIL_SMTP_GREYLIST_RETRIES": "0"}
    with temporary_database_url("postgres", tmp_path) as url:
        settings = testbed_settings(
            tb, tmp_path, database_url=url, runner="deployment", prefect_work_pool=pool,
            job_retry_delay=900.0, smtp_greylist_retries=0,
        )  # fmt: skip
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
                body, run = await _scheduled_pass(
                    app,
                    f"/api/verify/bulk/{job_id}",
                    customer.headers,
                    lambda: job_store.get_job_any(app.store.engine, job_id),
                    log,
                )
                assert run.state.type.name == "SCHEDULED" and body["retry_waiting"] == 2
                cancelled = await app.client.post(
                    f"/api/bulk/{job_id}/cancel", headers=customer.headers
                )
                assert cancelled.status_code == 200, cancelled.text
                assert cancelled.json()["credits_refunded"] == 2  # the two parked addresses
                async with get_client() as client:
                    after = await client.read_flow_run(run.id)
                assert after.state.type.name == "CANCELLED", after.state
                assert_ledger_exact(app.store, customer.account_id)
                assert balance(app.store.engine, customer.account_id).total == 49


async def test_a_job_whose_worker_was_killed_is_cancelled_once_and_never_resumed(
    testbed_factory, testbed_settings, tmp_path
):
    rows, credits = 24, 100
    tb = testbed_factory(_slow_world(rows))
    pool = _pool()
    with temporary_database_url("postgres", tmp_path) as url:
        settings = testbed_settings(
            tb, tmp_path, database_url=url, runner="deployment", prefect_work_pool=pool,
            job_stale_after=2,
        )  # fmt: skip
        await _register(pool)
        env = _worker_env(tb, url, tmp_path, VERIMAIL_JOB_STALE_AFTER="2")
        # (the app's own reaper stays out of it: this test runs the sweep itself)
        async with running_app(settings.model_copy(update={"job_stale_after": 3600})) as app:
            customer = app.customer(credits=credits)
            emails = [f"user{i}@tortoise.test" for i in range(rows)]
            with prefect_worker(pool, env, tmp_path / "first-worker.log") as first:
                created = await app.client.post(
                    "/api/verify/bulk", headers=customer.headers, json={"emails": emails}
                )
                job_id = created.json()["job_id"]
                reached = await asyncio.to_thread(
                    tb.wait_until, lambda t: t.host_stats(SLOW_HOST).active >= 1, 120
                )
                assert reached, (tmp_path / "first-worker.log").read_text(errors="replace")
                kill_tree(first.pid)  # the worker and its flow-run process, at once
            answers = await asyncio.gather(
                *(
                    app.client.post(f"/api/bulk/{job_id}/cancel", headers=customer.headers)
                    for _ in range(2)
                )
            )
            assert [a.status_code for a in answers] == [200, 200], [a.text for a in answers]
            job = job_store.get_job_any(app.store.engine, job_id)
            assert job is not None and job.status == "failed"
            assert job.credits_used + job.credits_refunded == rows
            # The job's heartbeat went stale long ago: the sweep must not resume it.
            handled = await asyncio.to_thread(recover_stale_jobs, settings, app.app.state.runner)
            assert job_id not in [h[0] for h in handled], handled
            again = await app.client.get(f"/api/verify/bulk/{job_id}", headers=customer.headers)
            assert again.json()["status"] == "failed" and again.json()["cancelled_at"]
            refunds = [
                r
                for r in assert_ledger_exact(app.store, customer.account_id)
                if r.reference == f"job:{job_id}" and r.kind == "refund"
            ]
            assert len(refunds) == 1 and refunds[0].delta == job.credits_refunded
            assert (
                balance(app.store.engine, customer.account_id).total == credits - job.credits_used
            )
