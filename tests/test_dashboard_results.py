"""Issue 25's dashboard pages over HTTP (in-process ASGI, jobs on the local runner against
the testbed): the charts, the results preview and its filters, segment downloads, the
progress bar's ETA and retry phase, human labels, and the Email Finder page."""

from __future__ import annotations

import csv
import io
import re
from datetime import timedelta

import pytest
from api_helpers import api_world, poll_job, running_app
from test_dashboard import (
    browser,
    csrf_of,
    job_id_of,
    logged_in,
    make_user,
    token,
    upload,
    wait_finished,
)

from verimail.api.dashboard import results as results_module
from verimail.api.dashboard.progress import eta_seconds, phase_text
from verimail.store import accounts as acc
from verimail.store.billing.pools import balance
from verimail.store.db import utcnow
from verimail.store.jobs import get_job

LIST = (
    "id,Name,Email Address\n"
    "1,Alice,alice@acme.test\n"
    "2,Nobody,nobody@acme.test\n"
    "3,Bob,bob@acme.test\n"
    "4,Typo,someone@gmial.com\n"
    "5,Catch,john.smith@catchall.test\n"
    "6,Info,info@acme.test\n"
)


@pytest.fixture
def settings(testbed_factory, testbed_settings, tmp_path):
    tb = testbed_factory(api_world())
    return testbed_settings(tb, tmp_path, upload_max_bytes=20_000, upload_max_rows=1000)


def _ids(html: str) -> list[str]:
    """The addresses listed in the preview table, in order."""
    table = html.split('data-testid="results"', 1)[1].split("</table>", 1)[0]
    return re.findall(r"<tr>\s*<td>([^<]+)</td>", table)


@pytest.mark.usefixtures("prefect_harness")
async def test_job_chart_preview_filters_segments_and_labels(settings, monkeypatch):
    monkeypatch.setattr(results_module, "PREVIEW_PAGE", 2)
    async with running_app(settings) as app:
        make_user(app, "lists@example.com", credits=50)
        make_user(app, "snoop@example.com")
        await logged_in(app.client, "lists@example.com")
        job_id = job_id_of(await upload(app.client, LIST, "people.csv"))
        early = await app.client.get(f"/dashboard/jobs/{job_id}/results")
        assert early.status_code in (200, 409)  # (409 unless it already completed)
        done = await wait_finished(app.client, job_id)
        assert done["status"] == "completed" and done["status_label"] == "Completed"
        assert done["eta_text"] == "" and done["phase_text"] == ""

        # The job page: a human kind, a full-width bar, the chart and the segments.
        page = (await app.client.get(f"/dashboard/jobs/{job_id}")).text
        assert "CSV upload" in page and "bulk_csv" not in page
        assert 'class="job-progress wide"' in page
        chart = page.split('data-testid="job-chart"', 1)[1].split("</figure>", 1)[0]
        assert '<rect x="' in chart and 'data-status="valid"' in chart
        assert 'data-status="invalid"' in chart and "Valid <strong>3</strong>" in chart
        for segment, count in (("valid", 3), ("valid_and_catchall", 4), ("invalid", 2)):
            link = f"/dashboard/jobs/{job_id}/download?segment={segment}&amp;include=details"
            assert link in page
            assert re.search(re.escape(link) + rf'".*?\({count} addresses\)', page), segment

        # The preview: every address in row order, two a page.
        preview = await app.client.get(f"/dashboard/jobs/{job_id}/results")
        assert preview.status_code == 200
        assert _ids(preview.text) == ["alice@acme.test", "nobody@acme.test"]
        assert "Showing 1–2 of 6 addresses" in preview.text
        second = await app.client.get(f"/dashboard/jobs/{job_id}/results?page=2")
        assert _ids(second.text) == ["bob@acme.test", "someone@gmial.com"]
        assert "Probable typo" in second.text and "someone@gmail.com" in second.text
        # Filters: status, sub-status, domain, and together.
        invalid = await app.client.get(f"/dashboard/jobs/{job_id}/results?status=invalid")
        assert _ids(invalid.text) == ["nobody@acme.test", "someone@gmial.com"]
        assert "of 2 matching addresses" in invalid.text
        typo = await app.client.get(
            f"/dashboard/jobs/{job_id}/results?status=invalid&sub_status=possible_typo"
        )
        assert _ids(typo.text) == ["someone@gmial.com"]
        domain = await app.client.get(
            f"/dashboard/jobs/{job_id}/results?domain=ACME.test&status=valid"
        )
        assert _ids(domain.text) == ["alice@acme.test", "bob@acme.test"]
        assert "page=2" in domain.text and "domain=acme.test" in domain.text  # keeps filters
        role = await app.client.get(f"/dashboard/jobs/{job_id}/results?sub_status=role_based")
        assert _ids(role.text) == ["info@acme.test"] and "Role address" in role.text
        none = await app.client.get(f"/dashboard/jobs/{job_id}/results?domain=nowhere.test")
        assert "No address matches" in none.text
        # The filter's choices are the job's own values, with counts.
        assert 'value="possible_typo"' in preview.text and "Invalid (2)" in preview.text

        # A segment download from the dashboard is the API's.
        seg = await app.client.get(f"/dashboard/jobs/{job_id}/download?segment=valid")
        rows = list(csv.reader(io.StringIO(seg.text)))
        assert [r[0] for r in rows[1:]] == ["1", "3", "6"]

        async with browser(app) as snoop:
            await logged_in(snoop, "snoop@example.com")
            other = await snoop.get(f"/dashboard/jobs/{job_id}/results")
            assert other.status_code == 404 and "people.csv" not in other.text

        # The overview: results across jobs and credits spent today.
        overview = (await app.client.get("/dashboard")).text
        assert "Results of all your bulk jobs" in overview
        assert "Valid <strong>3</strong>" in overview
        today = utcnow().date().isoformat()
        assert f'data-day="{today}" data-value="6"' in overview
        assert "CSV upload" in overview and "bulk_csv" not in overview
        credits = (await app.client.get("/dashboard/credits")).text
        assert "CSV upload job" in credits and "bulk_csv" not in credits
        assert f'<a href="/dashboard/jobs/{job_id}">Job #{job_id}</a>' in credits


async def test_single_verification_reads_as_one_request_in_the_ledger(settings):
    async with running_app(settings) as app:
        make_user(app, "one@example.com", credits=5)
        await logged_in(app.client, "one@example.com")
        csrf = await token(app.client, "/dashboard/verify")
        tried = await app.client.post(
            "/dashboard/verify", data={"csrf_token": csrf, "email": "someone@gmial.com"}
        )
        assert "Probable typo" in tried.text and "someone@gmail.com" in tried.text
        credits = (await app.client.get("/dashboard/credits")).text
        assert "one request" in credits and "request:" not in credits


async def test_results_preview_of_an_unfinished_or_finder_job_is_refused(settings):
    async with running_app(settings) as app:
        user = make_user(app, "early@example.com")
        await logged_in(app.client, "early@example.com")
        from verimail.store.jobs import create_job

        job = create_job(app.store.engine, user.id, "bulk_csv", 3, reserve=3)
        assert job is not None
        pending = await app.client.get(f"/dashboard/jobs/{job.id}/results")
        assert pending.status_code == 409 and "waiting to start" in pending.text
        finder = create_job(app.store.engine, user.id, "finder_csv", 3, reserve=0)
        assert finder is not None
        refused = await app.client.get(f"/dashboard/jobs/{finder.id}/results")
        assert refused.status_code == 404
        bad = await app.client.get(f"/dashboard/jobs/{job.id}/results?page=0")
        assert bad.status_code == 422


def test_eta_and_retry_phase_in_words():
    class FakeJob:  # (only the fields eta_seconds reads)
        finished = False
        total_emails = 100
        processed_emails = 25
        started_at = utcnow() - timedelta(seconds=30)
        created_at = started_at

    assert eta_seconds(FakeJob()) == 90  # 30 s for 25, 75 to go
    FakeJob.processed_emails = 0
    assert eta_seconds(FakeJob()) is None
    waiting = {
        "phase": "waiting_to_retry",
        "retry_waiting": 12,
        "next_retry_at": "2026-11-27T04:05:00Z",
    }
    assert phase_text(waiting) == (
        "Waiting to retry greylisted addresses: 12 addresses, next try at 04:05 UTC"
    )
    assert phase_text({"phase": "retrying", "retry_waiting": 1}).endswith(": 1 address")
    assert phase_text({"phase": "verifying"}) == phase_text({}) == ""


# --- the Email Finder page -----------------------------------------------------------------


async def test_finder_page_looks_up_one_person_and_charges_a_find(settings):
    async with running_app(settings) as app:
        user = make_user(app, "finder@example.com", credits=100)
        await logged_in(app.client, "finder@example.com")
        page = await app.client.get("/dashboard/finder")
        assert page.status_code == 200 and 'data-testid="finder-form"' in page.text
        found = await app.client.post(
            "/dashboard/finder",
            data={
                "csrf_token": csrf_of(page.text),
                "first_name": "Alice",
                "last_name": "Smith",
                "domain": "https://www.acme.test/about",
            },
        )
        assert found.status_code == 200, found.text
        result = found.text.split('data-testid="finder-result"', 1)[1]
        assert "alice@acme.test" in result and "Found" in result
        # The domain's pattern learned from this find, as GET /api/domain-pattern has it.
        learned = result.split('data-testid="learned-pattern">', 1)[1].split("<", 1)[0]
        assert learned.startswith("first (1 of 1 find, confidence 0.50)"), learned
        charge = settings.finder_charge
        assert balance(app.store.engine, user.id).total == 100 - charge

        bad = await app.client.post(
            "/dashboard/finder",
            data={"csrf_token": csrf_of(page.text), "first_name": "Al", "last_name": "S",
                  "domain": "127.0.0.1"},
        )  # fmt: skip
        assert bad.status_code == 422 and "Domain:" in bad.text
        assert 'value="Al"' in bad.text  # what was typed is kept
        assert balance(app.store.engine, user.id).total == 100 - charge


async def test_a_disabled_finder_says_why_and_refuses_the_forms(settings):
    async with running_app(settings) as app:
        user = make_user(app, "nofinder@example.com")
        acc.set_finder(app.store.engine, user.id, False)
        await logged_in(app.client, "nofinder@example.com")
        page = await app.client.get("/dashboard/finder")
        assert page.status_code == 200
        assert "not enabled for this account" in page.text and "--finder" in page.text
        assert 'data-testid="finder-form"' not in page.text
        posted = await app.client.post(
            "/dashboard/finder",
            data={"csrf_token": csrf_of(page.text), "first_name": "Alice",
                  "last_name": "Smith", "domain": "acme.test"},
        )  # fmt: skip
        assert posted.status_code == 403 and "not enabled" in posted.text
        files = {"file": ("people.csv", b"first_name,last_name,domain\nA,B,acme.test\n")}
        uploaded = await app.client.post(
            "/dashboard/finder/upload", data={"csrf_token": csrf_of(page.text)}, files=files
        )
        assert uploaded.status_code == 403
        assert balance(app.store.engine, user.id).total == 100


@pytest.mark.usefixtures("prefect_harness")
async def test_finder_csv_upload_makes_a_job_with_a_page_like_a_bulk_one(settings):
    async with running_app(settings) as app:
        user = make_user(app, "people@example.com", credits=100)
        await logged_in(app.client, "people@example.com")
        page = await app.client.get("/dashboard/finder")
        people = "first_name,last_name,domain\nAlice,Smith,acme.test\nZed,Nobody,acme.test\n"
        created = await app.client.post(
            "/dashboard/finder/upload",
            data={"csrf_token": csrf_of(page.text)},
            files={"file": ("people.csv", people.encode(), "text/csv")},
        )
        job_id = job_id_of(created)
        job = get_job(app.store.engine, user.id, job_id)
        assert job is not None and job.kind == "finder_csv"
        done = await wait_finished(app.client, job_id)
        assert done["status"] == "completed" and done["found_count"] == 1
        job_page = (await app.client.get(f"/dashboard/jobs/{job_id}")).text
        assert "Email Finder CSV" in job_page and "finder_csv" not in job_page
        assert 'data-testid="job-chart"' in job_page and 'data-status="found"' in job_page
        download = await app.client.get(f"/dashboard/jobs/{job_id}/download")
        rows = list(csv.reader(io.StringIO(download.text)))
        assert rows[1][3] == "alice@acme.test"

        empty = await app.client.post(
            "/dashboard/finder/upload",
            data={"csrf_token": csrf_of(page.text)},
            files={"file": ("x.csv", b"name\nAlice\n", "text/csv")},
        )
        assert empty.status_code == 422 and 'class="error"' in empty.text
        # The page has no API fields: its refusal names none (it said "Pass domain_column").
        assert (
            "domain_column" not in empty.text and "first_name, last_name and domain" in empty.text
        )


@pytest.mark.usefixtures("prefect_harness")
async def test_two_address_columns_the_first_is_verified_and_each_surface_says_so(settings):
    """A file with ``email`` and ``work_email`` was verified on the first without a word
    (issue 36): the API's creation answer and the dashboard's job page name the verified one."""
    two = "name,email,work_email\nAlice,alice@acme.test,a@w.test\nNo,nobody@acme.test,n@w.test\n"
    async with running_app(settings) as app:
        customer = app.customer(credits=10)
        created = await app.client.post(
            "/api/bulk",
            headers=customer.headers,
            files={"file": ("two.csv", two.encode(), "text/csv")},
        )
        assert created.status_code == 200, created.text
        notice = created.json()["notice"]
        assert "('email', 'work_email'): 'email' is verified" in notice, notice
        assert "email_column" in notice  # the API's own field
        one = await app.client.post(
            "/api/bulk",
            headers=customer.headers,
            files={"file": ("two.csv", two.encode(), "text/csv")},
            data={"email_column": "work_email"},
        )
        assert one.json()["notice"] is None  # named: nothing to tell
        for job in (created.json(), one.json()):  # (ended before the app stops)
            await poll_job(app.client, f"/api/bulk/{job['job_id']}", customer.headers)

        make_user(app, "two@example.com", credits=10)
        await logged_in(app.client, "two@example.com")
        job_id = job_id_of(await upload(app.client, two))
        page = (await app.client.get(f"/dashboard/jobs/{job_id}")).text
        assert 'data-testid="column-notice"' in page
        assert "&#39;email&#39; is verified" in page and "email_column" not in page
        await wait_finished(app.client, job_id)
