"""The access log of ``verimail serve`` outlives the first Prefect flow run (issue 47, point
2): Prefect's logging set-up, which ran at the first flow run in the API process, took over
the ``uvicorn`` loggers (WARNING, its own handler) and reset ``uvicorn.access``, so no
answer was logged after it — though docs/http-limits.md promises every answer there."""

from __future__ import annotations

import re

import httpx
from api_helpers import api_world, json_bulk_job, make_customer, serve_processes
from hardening_helpers import serve_env

from verimail.config import Settings
from verimail.store.db import init_store


async def test_access_lines_are_logged_after_a_job_has_run(
    prefect_harness, testbed_factory, tmp_path
):
    tb = testbed_factory(api_world())
    data = tmp_path / "data"
    store = init_store(Settings(data_dir=data))
    customer = make_customer(store, credits=10)
    store.close()
    env = serve_env(tb, f"sqlite:///{data / 'verimail.db'}", data, VERIMAIL_RUNNER="local")
    with serve_processes(1, env, tmp_path, args=("--log-level", "info")) as (server,):
        async with httpx.AsyncClient(base_url=server.base_url, timeout=60) as client:
            job = await json_bulk_job(client, customer, ["alice@acme.test", "nobody@acme.test"])
            assert job["status"] == "completed", job
            # After the run: a 200, a 404 and a 401, each with a path of its own.
            for path, headers in (
                ("/api/health?after=run", {}),
                ("/api/verify/bulk/999999", customer.headers),
                ("/api/verify/bulk/1?unauthenticated=1", {}),
            ):
                await client.get(path, headers=headers)
        log = server.log()
    for line in (
        r'"GET /api/health\?after=run HTTP/1.1" 200',
        r'"GET /api/verify/bulk/999999 HTTP/1.1" 404',
        r'"GET /api/verify/bulk/1\?unauthenticated=1 HTTP/1.1" 401',
    ):
        assert re.search(line, log), f"no access line {line!r} in:\n{log}"
