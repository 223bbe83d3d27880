"""Issue 36 point 4: one definition of the status groups, and every surface of one job
agreeing on it — the dashboard's chart and the list under it, the API's fields, the CLI's
summary, the Prefect summary and the demo's line (a job with both kinds of catch-all)."""

from __future__ import annotations

import re

import pytest
from api_helpers import api_world, running_app
from test_dashboard import job_id_of, logged_in, make_user, upload, wait_finished

from verimail.cli.progress import status_counts
from verimail.flows.summary import summary_rows
from verimail.schemas.status_groups import STATUSES, groups
from verimail.store import accounts as acc
from verimail.store.jobs import get_job_any

LIST = (
    "name,email\n"
    "Alice,alice@acme.test\n"
    "Nobody,nobody@acme.test\n"
    "John,john.smith@catchall.test\n"  # catch-all, a real-looking name: likely_valid
    "Jane,jane.doe@catchall.test\n"  # likely_valid
    "Anyone,anyone@catchall.test\n"  # catch-all, a single word: catchall
)


@pytest.fixture
def settings(testbed_factory, testbed_settings, tmp_path):
    tb = testbed_factory(api_world())
    return testbed_settings(tb, tmp_path, upload_max_bytes=20_000, upload_max_rows=1000)


def test_groups_split_the_catch_all_field_and_keep_the_order():
    fields = {"valid_count": 1, "catch_all_count": 3, "likely_valid_count": 2}
    assert groups(fields) == {
        "valid": 1,
        "likely_valid": 2,
        "catchall": 1,
        "risky": 0,
        "unknown": 0,
        "disposable": 0,
        "invalid": 0,
    }
    assert tuple(groups({})) == STATUSES


@pytest.mark.usefixtures("prefect_harness")
async def test_every_surface_counts_one_job_the_same(settings):
    async with running_app(settings) as app:
        account = make_user(app, "lists@example.com", credits=50)
        key, _ = acc.create_api_key(app.store.engine, account.id, name="groups")
        await logged_in(app.client, "lists@example.com")
        job_id = job_id_of(await upload(app.client, LIST, "people.csv"))
        await wait_finished(app.client, job_id)
        expected = {
            "valid": 1,
            "likely_valid": 2,
            "catchall": 1,
            "risky": 0,
            "unknown": 0,
            "disposable": 0,
            "invalid": 1,
        }

        api = (
            await app.client.get(f"/api/bulk/{job_id}", headers={"Authorization": f"Bearer {key}"})
        ).json()
        # The API's fields: catch_all_count is both catch-all groups, as the spec says.
        assert api["catch_all_count"] == 3 and api["likely_valid_count"] == 2
        assert groups(api) == expected  # (what the demo prints from the same JSON)

        page = (await app.client.get(f"/dashboard/jobs/{job_id}")).text
        chart = page.split('data-testid="job-chart"', 1)[1].split("</figure>", 1)[0]
        legend = dict(
            re.findall(r'<li data-status="(\w+)">.*?<strong>([\d,]+)</strong>', chart, re.S)
        )
        assert {k: int(v) for k, v in legend.items()} == expected
        facts = page.split('class="facts"', 1)[1].split("</dl>", 1)[0]
        listed = dict(re.findall(r'<dd data-status="(\w+)"[^>]*>([\d,]+)</dd>', facts))
        assert {k: int(v) for k, v in listed.items()} == expected
        assert list(listed) == list(STATUSES)  # (the chart's order)
        # The Jobs list too (it said "Catch-all 3" where the page said 1 and 2: issue 44).
        jobs = (await app.client.get("/dashboard/jobs")).text
        row = jobs.split(f'data-job="{job_id}"', 1)[1].split("</tr>", 1)[0]
        columns = dict(re.findall(r'data-group="(\w+)">([\d,]+)</td>', row))
        assert {k: int(v) for k, v in columns.items()} == {
            k: expected[k] for k in ("valid", "likely_valid", "catchall", "invalid")
        }

        job = get_job_any(app.store.engine, job_id)
        assert job is not None
        assert status_counts(job) == expected  # `verimail bulk`'s table and progress line
        summary = {row["item"]: row["value"] for row in summary_rows(settings, job)}
        assert {status: int(summary[status]) for status in STATUSES} == expected
