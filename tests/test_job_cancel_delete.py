"""Issue 45 points 2 and 3: cancelling and deleting jobs through the API, on the local runner,
against the testbed. Each endpoint for its owner and for another account (404); the settled
rows kept and downloadable, the rest refunded once (two cancels at once, a cancel racing
the job's completion: the ledger is checked); nothing of a deleted job left in the data dir
(walked); a running flow stopped; retention proven on a job aged in the store."""

from __future__ import annotations

import asyncio
import csv
import io
from datetime import timedelta
from pathlib import Path

import pytest
from api_helpers import (
    api_world,
    assert_error_body,
    host_per_domain,
    poll_job,
    poll_until,
    running_app,
    total_balance,
    wait_until,
)
from sqlalchemy import update

from verimail.runners.sweep import purge_expired_data
from verimail.store import jobs as job_store
from verimail.store.billing.ledger import ledger
from verimail.store.db import utcnow
from verimail.store.tables import jobs
from verimail.testbed.world import DomainSpec, HostBehaviour, HostSpec, World

pytestmark = pytest.mark.usefixtures("prefect_harness")

LIST = (
    "Name,Email\n"
    "Alice,alice@acme.test\n"
    "Nobody,nobody@acme.test\n"
    "Busy,someone@busy.test\n"  # a server that answers 421 to every connection: parked
)
ADDRESS_BYTES = (b"alice@acme.test", b"nobody@acme.test", b"someone@busy.test")


def _world(busy: HostBehaviour | None = None) -> World:
    return World.of(
        [
            HostSpec("mx.acme.test", HostBehaviour(mailboxes={"alice"})),
            HostSpec("mx.busy.test", busy or HostBehaviour(greeting_421=True)),
        ],
        [
            DomainSpec("acme.test", mx=[(10, "mx.acme.test")]),
            DomainSpec("busy.test", mx=[(10, "mx.busy.test")]),
        ],
    )


@pytest.fixture
def settings(testbed_factory, testbed_settings, tmp_path):
    # The production pace of deferred retries: a parked job waits 15 minutes for its pass.
    return testbed_settings(
        testbed_factory(_world()),
        tmp_path / "data",
        job_retry_delay=900.0,
        job_retry_max_wait=2700.0,
        smtp_greylist_retries=0,
        job_stale_after=4.0,
    )


def _upload(text: str = LIST) -> dict:
    return {"files": {"file": ("list.csv", text.encode(), "text/csv")}}


async def _parked_job(app, customer) -> dict:  # type: ignore[no-untyped-def]
    """A bulk job waiting for its retry pass: Alice and Nobody settled, Busy parked."""
    created = await app.client.post("/api/bulk", headers=customer.headers, **_upload())
    assert created.status_code == 200, created.text
    url = f"/api/bulk/{created.json()['job_id']}"
    return await poll_until(
        app.client, url, customer.headers, lambda body: body["phase"] == "waiting_to_retry"
    )


def _job_ledger(app, account_id: int, job_id: int) -> list:  # type: ignore[no-untyped-def]
    return [
        row
        for row in ledger(app.store.engine, account_id, limit=10_000)
        if row.reference == f"job:{job_id}"
    ]


def _files_holding_the_list(data_dir: Path) -> list[Path]:
    """Every file under the data dir that holds one of the list's addresses."""
    found = []
    for path in data_dir.rglob("*"):
        if path.is_file() and any(a in path.read_bytes() for a in ADDRESS_BYTES):
            found.append(path)
    return found


async def test_cancel_keeps_the_settled_rows_refunds_the_rest_once_and_delete_removes_all(
    settings,
):
    async with running_app(settings) as app:
        owner, stranger = app.customer(credits=100), app.customer(credits=100)
        job = await _parked_job(app, owner)
        job_id = job["job_id"]
        assert total_balance(app.store, owner.account_id) == 97  # 3 reserved

        # Another account: 404 for both, exactly as an unknown job, and nothing changes.
        for method, path in (
            ("POST", f"/api/bulk/{job_id}/cancel"),
            ("DELETE", f"/api/bulk/{job_id}"),
        ):
            refused = await app.client.request(method, path, headers=stranger.headers)
            assert_error_body(refused, 404)
        assert (await app.client.get(f"/api/bulk/{job_id}", headers=owner.headers)).json()[
            "status"
        ] == "processing"

        cancelled = await app.client.post(f"/api/bulk/{job_id}/cancel", headers=owner.headers)
        assert cancelled.status_code == 200, cancelled.text
        body = cancelled.json()
        assert body["status"] == "failed" and body["cancelled_at"]
        assert body["failed_reason"] == "cancelled by its owner after 2 of 3 rows"
        assert body["credits_refunded"] == 1  # the parked address, not verified
        assert total_balance(app.store, owner.account_id) == 98

        # Idempotent: the same job again, and no second refund.
        rows_before = _job_ledger(app, owner.account_id, job_id)
        again = await app.client.post(f"/api/bulk/{job_id}/cancel", headers=owner.headers)
        assert again.status_code == 200 and again.json() == body
        assert _job_ledger(app, owner.account_id, job_id) == rows_before
        assert sorted(r.kind for r in rows_before) == ["refund", "reserve"]

        # The settled rows are downloadable: the upload's rows with a result, with details.
        download = await app.client.get(f"/api/bulk/{job_id}/download", headers=owner.headers)
        assert download.status_code == 200, download.text
        rows = list(csv.reader(io.StringIO(download.text)))
        assert [r[:2] for r in rows[1:]] == [
            ["Alice", "alice@acme.test"],
            ["Nobody", "nobody@acme.test"],
        ]
        assert rows[0][2:4] == ["Safe to Send", "Status"]
        assert [r[2] for r in rows[1:]] == ["Yes", "No"]
        parquet = await app.client.get(
            f"/api/bulk/{job_id}/download?format=parquet", headers=owner.headers
        )
        assert "format=parquet" in assert_error_body(parquet, 409)

        deleted = await app.client.delete(f"/api/bulk/{job_id}", headers=owner.headers)
        assert deleted.status_code == 204 and deleted.content == b""
        for method, path in (
            ("GET", f"/api/bulk/{job_id}"),
            ("GET", f"/api/bulk/{job_id}/download"),
            ("POST", f"/api/bulk/{job_id}/cancel"),
            ("DELETE", f"/api/bulk/{job_id}"),
        ):
            assert_error_body(await app.client.request(method, path, headers=owner.headers), 404)
        assert _files_holding_the_list(settings.data_dir) == []
        assert not (settings.data_dir / "jobs" / str(job_id)).exists()
        # The ledger keeps its rows, naming the job; the balance is what it was.
        assert _job_ledger(app, owner.account_id, job_id) == rows_before
        assert total_balance(app.store, owner.account_id) == 98
        # The tombstone keeps the id (never handed out again) and nothing of the upload.
        tomb = job_store.get_job_any(app.store.engine, job_id)
        assert tomb is not None and tomb.deleted_at is not None
        assert (tomb.upload_path, tomb.result_path, tomb.webhook_url) == (None, None, None)
        assert tomb.options == {"attempts": 2}  # (no file name: only the run count)


async def test_a_completed_job_is_a_409_to_cancel_and_deleted_with_its_history(settings):
    async with running_app(settings) as app:
        owner = app.customer(credits=100)
        text = "Name,Email\nAlice,alice@acme.test\nNobody,nobody@acme.test\n"
        created = await app.client.post("/api/bulk", headers=owner.headers, **_upload(text))
        job_id = created.json()["job_id"]
        done = await poll_job(app.client, f"/api/bulk/{job_id}", owner.headers)
        assert done["status"] == "completed", done
        history = list((settings.data_dir / "history").rglob(f"bulk-{job_id}.parquet"))
        assert history, "the job's results are in the history"
        refused = await app.client.post(f"/api/bulk/{job_id}/cancel", headers=owner.headers)
        assert "already completed" in assert_error_body(refused, 409)
        # (variants made on demand are the job's too)
        variant = f"/api/bulk/{job_id}/download?segment=valid&include=details"
        assert (await app.client.get(variant, headers=owner.headers)).status_code == 200
        listed = await app.client.get("/api/bulk", headers=owner.headers)
        assert [job["job_id"] for job in listed.json()["jobs"]] == [job_id]
        deleted = await app.client.delete(f"/api/bulk/{job_id}", headers=owner.headers)
        assert deleted.status_code == 204
        assert not any(path.exists() for path in history)
        assert _files_holding_the_list(settings.data_dir) == []
        assert total_balance(app.store, owner.account_id) == 98
        listed = await app.client.get("/api/bulk", headers=owner.headers)
        assert listed.json()["jobs"] == [], "a deleted job is in no list"


async def test_two_cancels_at_once_refund_once(settings):
    async with running_app(settings) as app:
        owner = app.customer(credits=100)
        job_id = (await _parked_job(app, owner))["job_id"]
        url = f"/api/bulk/{job_id}/cancel"
        answers = await asyncio.gather(
            *(app.client.post(url, headers=owner.headers) for _ in range(3))
        )
        assert [a.status_code for a in answers] == [200, 200, 200], [a.text for a in answers]
        assert len({a.text for a in answers}) == 1  # the same cancelled job
        kinds = [row.kind for row in _job_ledger(app, owner.account_id, job_id)]
        assert sorted(kinds) == ["refund", "reserve"]
        assert total_balance(app.store, owner.account_id) == 98
        # Only the winner's partial file is left (the losers' staged copies are gone).
        folder = settings.data_dir / "jobs" / str(job_id)
        assert sorted(p.name for p in folder.glob("*partial*")) == ["partial-results.csv"]


async def test_a_cancel_racing_the_completion_settles_the_job_once(settings):
    """A quick job cancelled as it runs: whichever wins, the job is settled once — a cancel
    that lost is a 409 and changes nothing; a completion that lost writes nothing."""
    async with running_app(settings) as app:
        owner = app.customer(credits=100)
        text = "Name,Email\nAlice,alice@acme.test\nNobody,nobody@acme.test\n"
        outcomes = set()
        for _ in range(4):
            created = await app.client.post("/api/bulk", headers=owner.headers, **_upload(text))
            job_id = created.json()["job_id"]
            cancel = await app.client.post(f"/api/bulk/{job_id}/cancel", headers=owner.headers)
            assert cancel.status_code in (200, 409), cancel.text
            outcomes.add(cancel.status_code)
            await wait_until(
                lambda job_id=job_id: job_id not in app.app.state.runner.held_jobs(),
                timeout=60,
                what="the run to end",
            )
            job = job_store.get_job_any(app.store.engine, job_id)
            assert job is not None and job.finished
            assert job.status == ("failed" if cancel.status_code == 200 else "completed")
            rows = _job_ledger(app, owner.account_id, job_id)
            assert [r.kind for r in rows].count("refund") <= 1, rows
            # What the ledger took for the job is what the job says it used.
            assert -sum(r.delta for r in rows) == job.credits_used
            assert job.credits_used + job.credits_refunded == job.credits_reserved
        assert total_balance(app.store, owner.account_id) == 100 - sum(
            j.credits_used for j in job_store.list_jobs(app.store.engine, owner.account_id)
        )


async def test_cancel_stops_a_running_flow_and_delete_of_a_running_job_cancels_it_first(
    testbed_factory, testbed_settings, tmp_path
):
    """A job held by a server that answers each command after 5 minutes: without the
    cancellation the run would be at it for minutes. With it, the run gives the job up at
    its next heartbeat (stale time 4 s: a beat a second)."""
    slow = HostBehaviour(mailboxes={"someone"}, reply_delay=300.0)
    tb = testbed_factory(_world(slow))
    settings = testbed_settings(
        tb, tmp_path / "data", job_stale_after=4.0,
        smtp_connect_timeout=600.0, smtp_command_timeout=600.0,
    )  # fmt: skip
    async with running_app(settings) as app:
        owner = app.customer(credits=100)
        runner = app.app.state.runner
        created = await app.client.post("/api/bulk", headers=owner.headers, **_upload())
        job_id = created.json()["job_id"]
        await wait_until(
            lambda: (
                tb.host_stats("mx.busy.test").active >= 1
                and tb.host_stats("mx.acme.test").rcpt_to >= 2
            ),
            timeout=60,
            what="the run to wait on the slow server, the other addresses asked",
        )
        deleted = await app.client.delete(f"/api/bulk/{job_id}", headers=owner.headers)
        assert deleted.status_code == 204
        # The run stops and hangs up on the slow server (minutes before its banner).
        await wait_until(lambda: job_id not in runner.held_jobs(), timeout=60, what="run stopped")
        await wait_until(
            lambda: tb.host_stats("mx.busy.test").active == 0, timeout=60, what="hang-up"
        )
        job = job_store.get_job_any(app.store.engine, job_id)
        assert job is not None and job.status == "failed" and job.deleted_at is not None
        # What was settled when it was cancelled is charged, the rest refunded.
        assert job.credits_used + job.credits_refunded == 3 and job.credits_refunded >= 1
        assert total_balance(app.store, owner.account_id) == 100 - job.credits_used
        purge_expired_data(settings)  # (what the stopping run wrote after the deletion)
        assert _files_holding_the_list(settings.data_dir) == []


async def test_retention_deletes_the_data_of_jobs_that_ended_long_enough_ago(
    testbed_factory, testbed_settings, tmp_path
):
    settings = testbed_settings(testbed_factory(api_world()), tmp_path / "data", retention_days=30)
    text = "Name,Email\nAlice,alice@acme.test\n"
    async with running_app(settings) as app:
        owner = app.customer(credits=100)
        ids = []
        for _ in range(2):
            created = await app.client.post("/api/bulk", headers=owner.headers, **_upload(text))
            ids.append(created.json()["job_id"])
            await poll_job(app.client, f"/api/bulk/{ids[-1]}", owner.headers)
        old, recent = ids
        with app.store.engine.begin() as conn:  # the first job ended 31 days ago
            conn.execute(
                update(jobs)
                .where(jobs.c.id == old)
                .values(completed_at=utcnow() - timedelta(days=31))
            )
        assert purge_expired_data(settings) == [old]
        assert_error_body(await app.client.get(f"/api/bulk/{old}", headers=owner.headers), 404)
        assert not (settings.data_dir / "jobs" / str(old)).exists()
        assert not list((settings.data_dir / "history").rglob(f"bulk-{old}.parquet"))
        kept = await app.client.get(f"/api/bulk/{recent}/download", headers=owner.headers)
        assert kept.status_code == 200
        assert list((settings.data_dir / "history").rglob(f"bulk-{recent}.parquet"))
        assert purge_expired_data(settings) == []  # (nothing more is due)
        # 0 (the default) keeps everything, however old.
        keep = settings.model_copy(update={"retention_days": 0})
        with app.store.engine.begin() as conn:
            conn.execute(update(jobs).values(completed_at=utcnow() - timedelta(days=3650)))
        assert purge_expired_data(keep) == []
        assert (
            await app.client.get(f"/api/bulk/{recent}", headers=owner.headers)
        ).status_code == 200


async def test_the_dashboard_cancels_and_deletes_a_job_behind_its_csrf_check(settings):
    from test_dashboard import CSRF_PAGE, browser, csrf_of, logged_in, make_user, upload

    async with running_app(settings) as app:
        make_user(app, "owner@example.com")
        make_user(app, "other@example.com")
        async with browser(app) as owner, browser(app) as other:
            await logged_in(owner, "owner@example.com")
            await logged_in(other, "other@example.com")
            uploaded = await upload(owner, LIST)
            assert uploaded.status_code == 303, uploaded.text
            page_url = uploaded.headers["location"]
            job_id = int(page_url.rsplit("/", 1)[1])
            await poll_until(
                owner, f"{page_url}/progress", {}, lambda b: b["phase"] == "waiting_to_retry"
            )
            page = await owner.get(page_url)
            assert 'data-testid="cancel-job"' in page.text and "data-confirm" in page.text
            csrf = csrf_of(page.text)
            # Another account cannot, even with a valid form of its own: 404.
            theirs = csrf_of((await other.get("/dashboard/jobs")).text)
            for action in ("cancel", "delete"):
                refused = await other.post(f"{page_url}/{action}", data={"csrf_token": theirs})
                assert refused.status_code == 404, refused.text
            forged = await owner.post(f"{page_url}/cancel", data={"csrf_token": "forged"})
            assert CSRF_PAGE in forged.text
            assert job_store.get_job_any(app.store.engine, job_id).status == "processing"

            cancelled = await owner.post(f"{page_url}/cancel", data={"csrf_token": csrf})
            assert cancelled.status_code == 303 and cancelled.headers["location"] == page_url
            page = await owner.get(page_url)
            assert 'data-testid="cancel-job"' not in page.text
            assert "Download the 2 rows settled before it was cancelled" in page.text
            partial = await owner.get(f"{page_url}/download")
            assert partial.status_code == 200 and "alice@acme.test" in partial.text

            deleted = await owner.post(f"{page_url}/delete", data={"csrf_token": csrf})
            assert deleted.status_code == 303
            assert deleted.headers["location"] == "/dashboard/jobs"
            assert (await owner.get(page_url)).status_code == 404
            assert f"/dashboard/jobs/{job_id}" not in (await owner.get("/dashboard/jobs")).text
            assert _files_holding_the_list(settings.data_dir) == []


async def test_finder_jobs_cancel_charging_only_the_delivered_finds_and_delete(
    testbed_factory, testbed_settings, tmp_path
):
    """Ann Lee is found at once (charged); Dora Diaz's server greylists: her row is parked
    for a pass 15 minutes later. Cancelled meanwhile, the job hands over Ann's row and keeps
    her find charged, nothing else."""
    hosts = {
        "ok.test": HostBehaviour(mailboxes={"ann.lee"}),
        "grey.test": HostBehaviour(mailboxes={"ddiaz"}, greylist_delay=3600.0),
    }
    settings = testbed_settings(
        testbed_factory(host_per_domain(hosts)), tmp_path / "data", finder_charge=10,
        smtp_greylist_retries=0, job_retry_delay=900.0, job_retry_max_wait=2700.0,
    )  # fmt: skip
    people = "first_name,last_name,domain\r\nAnn,Lee,ok.test\r\nDora,Diaz,grey.test\r\n"
    async with running_app(settings) as app:
        owner, stranger = app.customer(credits=100), app.customer(credits=100)
        created = await app.client.post(
            "/api/find-email/csv",
            headers=owner.headers,
            files={"file": ("people.csv", people.encode(), "text/csv")},
        )
        public_id = created.json()["job_id"]
        url = f"/api/find-email/csv/{public_id}"
        await poll_until(app.client, url, owner.headers, lambda b: b["phase"] == "waiting_to_retry")
        for method, path in (("POST", f"{url}/cancel"), ("DELETE", url)):
            assert_error_body(await app.client.request(method, path, headers=stranger.headers), 404)
        cancelled = await app.client.post(f"{url}/cancel", headers=owner.headers)
        assert cancelled.status_code == 200, cancelled.text
        body = cancelled.json()
        assert body["status"] == "failed" and body["cancelled_at"]
        assert body["credits_used"] == 10 and total_balance(app.store, owner.account_id) == 90
        again = await app.client.post(f"{url}/cancel", headers=owner.headers)
        assert again.json() == body and total_balance(app.store, owner.account_id) == 90
        rows = list(
            csv.reader(
                io.StringIO((await app.client.get(f"{url}/download", headers=owner.headers)).text)
            )
        )
        assert [r[:4] for r in rows[1:]] == [["Ann", "Lee", "ok.test", "ann.lee@ok.test"]]
        job = job_store.get_job_by_public_id(app.store.engine, owner.account_id, public_id)
        assert job is not None
        assert (await app.client.delete(url, headers=owner.headers)).status_code == 204
        assert_error_body(await app.client.get(url, headers=owner.headers), 404)
        assert_error_body(await app.client.delete(url, headers=owner.headers), 404)
        tomb = job_store.get_job_any(app.store.engine, job.id)
        assert tomb is not None and tomb.deleted_at is not None
        leftovers = [  # (the database is asked below: its files keep freed pages a while)
            p
            for p in settings.data_dir.rglob("*")
            if p.is_file()
            and not p.name.startswith("verimail.db")
            and any(w in p.read_bytes() for w in (b"ann.lee@ok.test", b"Diaz"))
        ]
        assert leftovers == []
        reasons = [row.reason for row in ledger(app.store.engine, owner.account_id)]
        assert not [r for r in reasons if "ann.lee" in r], reasons
        assert total_balance(app.store, owner.account_id) == 90  # the ledger keeps its rows


async def test_a_sharded_job_cancelled_mid_way_keeps_what_its_shards_settled(
    testbed_factory, testbed_settings, tmp_path
):
    """Two shards (a shard size of 2): acme.test's settles at once, slow.test's server
    greets after ten minutes. Cancelled then, the job keeps acme.test's two rows, in the
    download and the refund, as an unsharded job would."""
    tb = testbed_factory(
        World.of(
            [
                HostSpec("mx.acme.test", HostBehaviour(mailboxes={"alice"})),
                HostSpec("mx.slow.test", HostBehaviour(greeting_delay=600.0)),
            ],
            [
                DomainSpec("acme.test", mx=[(10, "mx.acme.test")]),
                DomainSpec("slow.test", mx=[(10, "mx.slow.test")]),
            ],
        )
    )
    settings = testbed_settings(tb, tmp_path / "data", job_shard_size=2)
    text = "Name,Email\nAlice,alice@acme.test\nNobody,nobody@acme.test\nSlow,s@slow.test\n"
    async with running_app(settings) as app:
        owner = app.customer(credits=100)
        created = await app.client.post("/api/bulk", headers=owner.headers, **_upload(text))
        assert created.status_code == 200, created.text
        url = f"/api/bulk/{created.json()['job_id']}"
        job = await poll_until(
            app.client, url, owner.headers, lambda body: body["processed_emails"] >= 2
        )
        assert job["shards_total"] == 2, job
        cancelled = await app.client.post(f"{url}/cancel", headers=owner.headers)
        assert cancelled.status_code == 200, cancelled.text
        body = cancelled.json()
        assert body["failed_reason"] == "cancelled by its owner after 2 of 3 rows", body
        assert body["credits_refunded"] == 1
        download = await app.client.get(f"{url}/download", headers=owner.headers)
        assert download.status_code == 200, download.text
        rows = list(csv.reader(io.StringIO(download.text)))
        assert [r[:3] for r in rows[1:]] == [
            ["Alice", "alice@acme.test", "Yes"],
            ["Nobody", "nobody@acme.test", "No"],
        ]
        assert total_balance(app.store, owner.account_id) == 98
