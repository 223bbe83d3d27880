"""The API process gives back the memory of wide uploads (issue 47.4): after twenty uploads
of a one-row CSV with 1,000,000 columns, each accepted, the API's RSS had gone from 350 to
967 MB and stayed. Now such a file is refused (413, over the 20,000-column limit) and the
widest accepted files, verified in between, leave the RSS where it was.

A real ``verimail serve`` (the local runner: the jobs run in that process) on the session's
Prefect server and the testbed; RSS read from ``/proc``."""

from __future__ import annotations

from pathlib import Path

import httpx
import pytest
from api_helpers import api_world, make_customer, poll_job, serve_processes
from hardening_helpers import serve_env

from verimail.config import Settings
from verimail.files.csv_detect import MAX_COLUMNS
from verimail.store.billing.pools import balance
from verimail.store.db import init_store

pytestmark = pytest.mark.usefixtures("prefect_harness")

UPLOADS = 20
GROWTH_MIB = 100


def _rss_mib(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    raise AssertionError(f"no VmRSS for {pid}")


def _one_row(columns: int) -> bytes:
    """A header of ``columns`` names (``email`` first) and one row: an address."""
    header = "email," + ",".join(f"c{i}" for i in range(1, columns))
    return f"{header}\nalice@acme.test{',' * (columns - 1)}\n".encode()


async def test_twenty_wide_uploads_leave_the_api_where_it_was(testbed_factory, tmp_path):
    tb = testbed_factory(api_world())
    data = tmp_path / "data"
    url = f"sqlite:///{tmp_path / 'verimail.db'}"
    store = init_store(Settings(data_dir=data, database_url=url))
    credits = UPLOADS + 1
    customer = make_customer(store, credits=credits)
    million, widest = _one_row(1_000_000), _one_row(MAX_COLUMNS)
    with serve_processes(1, serve_env(tb, url, data), tmp_path) as (server,):
        pid = server.process.pid
        async with httpx.AsyncClient(base_url=server.base_url, timeout=120) as client:

            async def upload(body: bytes) -> httpx.Response:
                files = {"file": ("wide.csv", body, "text/csv")}
                return await client.post("/api/bulk", headers=customer.headers, files=files)

            async def verified(body: bytes) -> None:
                made = await upload(body)
                assert made.status_code == 200, made.text
                done = await poll_job(
                    client, f"/api/bulk/{made.json()['job_id']}", customer.headers, 120
                )
                assert done["status"] == "completed", done

            await verified(widest)  # (the first job sets up Prefect's client and the engine)
            start = _rss_mib(pid)
            seen = []
            for n in range(UPLOADS):
                if n % 2:
                    await verified(widest)
                else:
                    refused = await upload(million)
                    assert refused.status_code == 413, refused.text
                    assert f"at most {MAX_COLUMNS:,} columns" in refused.json()["detail"]
                seen.append(round(_rss_mib(pid)))
    # (after a refused million-column upload the RSS stands ~80 MB higher, one parse's
    # peak, until the next upload: the figure that matters is the last, after all twenty)
    assert seen[-1] - start < GROWTH_MIB, (round(start), seen)
    assert balance(store.engine, customer.account_id).total == credits - 1 - UPLOADS // 2
