"""Deployment mode for real: deployments registered on a Prefect server, a worker process
on a `process` work pool, the API handing a bulk job to it with `run_deployment`, and the
job completing as seen through the API. Store on PostgreSQL, as several machines would."""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
from pathlib import Path

import pytest
from api_helpers import clean_env, env_for_testbed, poll_job, running_app

from verimail.store.testing import temporary_database_url

pytestmark = [pytest.mark.usefixtures("prefect_harness"), pytest.mark.prefect]


async def test_bulk_job_runs_on_a_worker(testbed_factory, testbed_settings, tmp_path):
    from api_helpers import api_world
    from prefect.settings import PREFECT_API_URL

    from verimail.flows.deploy import register_deployments

    tb = testbed_factory(api_world())
    pool = f"verimail-test-{os.getpid()}"
    with temporary_database_url("postgres", tmp_path) as url:
        settings = testbed_settings(
            tb, tmp_path, database_url=url, runner="deployment", prefect_work_pool=pool
        )
        assert await asyncio.to_thread(register_deployments, pool, schedule=False)
        env = clean_env(
            {
                **env_for_testbed(tb),
                "VERIMAIL_DATABASE_URL": url,
                "VERIMAIL_DATA_DIR": str(tmp_path),
                "PREFECT_API_URL": str(PREFECT_API_URL.value()),
                "PREFECT_WORKER_QUERY_SECONDS": "1",
                "PREFECT_SERVER_ANALYTICS_ENABLED": "false",
            }
        )
        log = (tmp_path / "worker.log").open("wb")
        worker = subprocess.Popen(
            [str(Path(sys.executable).parent / "prefect"), "worker", "start", "--pool", pool],
            env=env,
            stdout=log,
            stderr=subprocess.STDOUT,
            cwd=tmp_path,
        )
        try:
            async with running_app(settings) as app:
                customer = app.customer(credits=50)
                created = await app.client.post(
                    "/api/verify/bulk",
                    headers=customer.headers,
                    json={"emails": ["alice@acme.test", "nobody@acme.test"]},
                )
                assert created.status_code == 200, created.text
                job_id = created.json()["job_id"]
                done = await poll_job(
                    app.client, f"/api/verify/bulk/{job_id}", customer.headers, timeout=240
                )
                worker_log = (tmp_path / "worker.log").read_text(errors="replace")
                assert done["status"] == "completed", (done, worker_log[-3000:])
                assert [r["status"] for r in done["results"]] == ["valid", "invalid"]
        finally:
            worker.terminate()
            try:
                worker.wait(timeout=20)
            except subprocess.TimeoutExpired:
                worker.kill()
            log.close()
