"""Credits under load on PostgreSQL: two real ``verimail serve`` processes take single and
batch verifications, a CSV and a JSON bulk job on one account at once, while one of them
also resumes a stale job that then fails and refunds. Afterwards the ledger reads as one
exact running balance, never below zero; each job's reservation, use and refund add up;
and every 200 was charged exactly once.
"""

from __future__ import annotations

import asyncio
from collections import Counter
from pathlib import Path

import httpx
import pytest
from api_helpers import STALE_AFTER, api_world, make_customer, poll_job, serve_processes
from hardening_helpers import assert_ledger_exact, assert_no_open_jobs, scaled, serve_env

from verimail.config import Settings
from verimail.store import jobs as job_store
from verimail.store.billing.pools import balance
from verimail.store.db import init_store, utcnow
from verimail.store.testing import temporary_database_url

pytestmark = [pytest.mark.postgres, pytest.mark.usefixtures("prefect_harness")]

SINGLE, BATCH = "/api/verify/single", "/api/verify/batch"


@pytest.mark.parametrize("scale", [1, pytest.param(scaled(2), marks=pytest.mark.slow)])
async def test_two_processes_and_a_bulk_job_share_one_account(
    testbed_factory, tmp_path: Path, scale: int
) -> None:
    singles, batches, batch_size, bulk_rows, json_rows = 30 * scale, 8 * scale, 5, 20, 15
    credits = 70 * scale  # less than asked for: some requests must be refused with 402
    tb = testbed_factory(api_world())
    data = tmp_path / "data"
    with temporary_database_url("postgres", tmp_path) as url:
        store = init_store(Settings(data_dir=data, database_url=url))
        try:
            customer = make_customer(store, plan="enterprise", credits=credits)
            # A job whose runner died five minutes ago, and whose upload is gone: a serve
            # process's reaper resumes it, the run fails, and the job refunds it all.
            stale = job_store.create_job(
                store.engine,
                customer.account_id,
                "bulk_csv",
                10,
                reserve=10,
                upload_path=str(tmp_path / "vanished.csv"),
            )
            assert stale is not None
            job_store.mark_processing(store.engine, stale.id)
            job_store.heartbeat(store.engine, stale.id, now=utcnow().replace(year=2000))
            env = serve_env(tb, url, data, VERIMAIL_JOB_STALE_AFTER=str(STALE_AFTER))
            with serve_processes(2, env, tmp_path) as servers:
                async with httpx.AsyncClient(timeout=120) as client:
                    h = customer.headers
                    csv_body = "email\n" + "".join(f"user{i}@acme.test\n" for i in range(bulk_rows))
                    # The jobs are created first (their reservations fit the balance, so
                    # both are accepted), then the calls race each other and the running
                    # jobs' settlement for what is left, so some of them must get 402.
                    jobs = [
                        client.post(
                            servers[0].base_url + "/api/bulk",
                            headers=h,
                            files={"file": ("l.csv", csv_body.encode(), "text/csv")},
                        ),
                        client.post(
                            servers[1].base_url + "/api/verify/bulk",
                            headers=h,
                            json={"emails": [f"x{i}@acme.test" for i in range(json_rows)]},
                        ),
                    ]
                    calls = [
                        client.post(
                            servers[i % 2].base_url + SINGLE,
                            headers=h,
                            json={"email": ("alice@acme.test", "nobody@acme.test")[i % 2]},
                        )
                        for i in range(singles)
                    ] + [
                        client.post(
                            servers[i % 2].base_url + BATCH,
                            headers=h,
                            json={"emails": [f"b{i}-{j}@acme.test" for j in range(batch_size)]},
                        )
                        for i in range(batches)
                    ]
                    job_responses = await asyncio.gather(*jobs)
                    assert [r.status_code for r in job_responses] == [200, 200], [
                        r.text for r in job_responses
                    ]
                    call_responses = await asyncio.gather(*calls)
                    responses = [*job_responses, *call_responses]
                    assert all(r.status_code in (200, 402) for r in responses), [
                        (r.status_code, r.text) for r in responses if r.status_code >= 500
                    ]
                    finals = []
                    for response, path in zip(
                        job_responses, ("/api/bulk/", "/api/verify/bulk/"), strict=True
                    ):
                        if response.status_code == 200:
                            job_id = response.json()["job_id"]
                            finals.append(
                                await poll_job(client, servers[0].base_url + path + str(job_id), h)
                            )
                    # The stale job is settled by whichever process claimed it.
                    for _ in range(600):
                        gone = job_store.get_job_any(store.engine, stale.id)
                        if gone.finished:
                            break
                        await asyncio.sleep(0.1)
                logs = "".join(server.log() for server in servers)

            # --- every movement is accounted for -----------------------------------------
            rows = assert_ledger_exact(store, customer.account_id)
            kinds = Counter(r.kind for r in rows)
            assert kinds["signup"] == 1
            ok_singles = sum(r.status_code == 200 for r in call_responses[:singles])
            ok_batches = sum(r.status_code == 200 for r in call_responses[singles:])
            charges = [r for r in rows if r.kind == "charge"]
            assert sum(-r.delta for r in charges) == ok_singles + ok_batches * batch_size
            assert Counter(r.reason.split(" of ")[0] for r in charges) == Counter(
                {"verify single": ok_singles} | ({"verify batch": ok_batches} if ok_batches else {})
            )
            assert any(r.status_code == 402 for r in responses)  # the balance did run short

            stale_done = job_store.get_job_any(store.engine, stale.id)
            assert stale_done.status == "failed", stale_done
            assert stale_done.credits_refunded == 10 and stale_done.processed_emails == 0
            refunds = [r for r in rows if r.kind == "refund"]
            assert [(r.delta, r.reference) for r in refunds] == [(10, f"job:{stale.id}")]

            assert len(finals) == 2
            for final in finals:
                assert final["status"] == "completed", final
                assert final["credits_reserved"] == final["total_emails"]
                assert final["credits_refunded"] == 0
                assert final["processed_emails"] == final["total_emails"]
            reserves = [r for r in rows if r.kind == "reserve"]
            assert sum(-r.delta for r in reserves) == 10 + sum(
                f["credits_reserved"] for f in finals
            )
            assert balance(store.engine, customer.account_id).total == (
                credits
                - ok_singles
                - ok_batches * batch_size
                - sum(f["credits_reserved"] for f in finals)
            )
            assert_no_open_jobs(store)
            assert customer.key not in logs
        finally:
            store.close()
