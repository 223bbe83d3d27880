"""``GET /api/bulk/{id}/download?partial=true`` (issue 45, point 5), over HTTP on the local
runner against the testbed's greylisting: while a job waits for its deferred retry pass its
settled rows can be downloaded, the parked ones marked; the plain download keeps its 409;
another account gets 404; once completed, the whole results."""

from __future__ import annotations

import csv
import io

import pytest
from api_helpers import assert_error_body, host_per_domain, poll_job, poll_until, running_app

from verimail.files.bulk_io import DETAIL_NAMES, SAFE_COLUMN
from verimail.files.partial_results import PENDING_COLUMN
from verimail.store import jobs as job_store
from verimail.testbed.server import Testbed
from verimail.testbed.world import HostBehaviour

pytestmark = pytest.mark.usefixtures("prefect_harness")

UPLOAD = (
    "name,email\r\n"
    "Alice,alice@ok.test\r\n"
    "Grace,alice@grey.test\r\n"
    "Nobody,nobody@ok.test\r\n"
    "Empty,\r\n"
    "Bob,bob@grey.test\r\n"
)


@pytest.fixture
def tb(testbed_factory) -> Testbed:
    hosts = {
        "ok.test": HostBehaviour(mailboxes={"alice"}),
        "grey.test": HostBehaviour(mailboxes={"alice", "bob"}, greylist_delay=1.0),
    }
    return testbed_factory(host_per_domain(hosts))


@pytest.fixture
def settings(tb, testbed_settings, tmp_path):
    # The retry pass after 4 s: time for the downloads below while the job waits.
    return testbed_settings(
        tb, tmp_path, smtp_greylist_retries=0, job_retry_delay=4.0, job_retry_passes=1
    )


def _rows(text: str) -> list[list[str]]:
    return list(csv.reader(io.StringIO(text)))


async def test_settled_rows_while_waiting_then_the_whole_results(settings):
    async with running_app(settings) as app:
        owner, stranger = app.customer(), app.customer()
        created = await app.client.post(
            "/api/bulk", files={"file": ("list.csv", UPLOAD, "text/csv")}, headers=owner.headers
        )
        assert created.status_code == 200, created.text
        job_id = created.json()["job_id"]
        url = f"/api/bulk/{job_id}"
        await poll_until(
            app.client, url, owner.headers, lambda b: b.get("phase") == "waiting_to_retry"
        )
        download = f"{url}/download"

        plain = await app.client.get(download, headers=owner.headers)
        assert "partial=true" in assert_error_body(plain, 409)

        partial = await app.client.get(download, params={"partial": "true"}, headers=owner.headers)
        assert partial.status_code == 200, partial.text
        assert partial.headers["content-type"].startswith("text/csv")
        assert f"bulk-{job_id}-partial-results.csv" in partial.headers["content-disposition"]
        assert _rows(partial.text) == [
            ["name", "email", "Safe to Send", "Retry Pending"],
            ["Alice", "alice@ok.test", "Yes", "No"],
            ["Grace", "alice@grey.test", "No", "Yes"],
            ["Nobody", "nobody@ok.test", "No", "No"],
            ["Empty", "", "No", "No"],
            ["Bob", "bob@grey.test", "No", "Yes"],
        ]
        detailed = await app.client.get(
            download, params={"partial": "true", "include": "details"}, headers=owner.headers
        )
        rows = _rows(detailed.text)
        assert rows[0] == ["name", "email", SAFE_COLUMN, *DETAIL_NAMES, PENDING_COLUMN]
        by_name = {row[0]: row for row in rows[1:]}
        assert by_name["Grace"][3:5] == ["unknown", "greylisted"]
        assert by_name["Nobody"][3:5] == ["invalid", "mailbox_not_found"]

        # Not with the options a partial CSV does not have; never another account's job.
        parquet = await app.client.get(
            download, params={"partial": "true", "format": "parquet"}, headers=owner.headers
        )
        assert "partial=true" in assert_error_body(parquet, 422)
        foreign = await app.client.get(
            download, params={"partial": "true"}, headers=stranger.headers
        )
        assert_error_body(foreign, 404)

        # A job in its first pass (here: not started) has nothing settled kept yet.
        pending = job_store.create_job(app.store.engine, owner.account_id, "bulk_csv", 1, reserve=0)
        assert pending is not None
        early = await app.client.get(
            f"/api/bulk/{pending.id}/download", params={"partial": "true"}, headers=owner.headers
        )
        assert "first pass" in assert_error_body(early, 409)
        # (ended at once: no run of the app's may take up a job that has no upload)
        assert job_store.mark_failed(app.store.engine, pending.id, "a test's job, never run")

        done = await poll_job(app.client, url, owner.headers)
        assert done["status"] == "completed", done
        whole = await app.client.get(download, params={"partial": "true"}, headers=owner.headers)
        plain = await app.client.get(download, headers=owner.headers)
        assert whole.status_code == plain.status_code == 200
        assert whole.content == plain.content
        assert _rows(plain.text)[2] == ["Grace", "alice@grey.test", "Yes"]
