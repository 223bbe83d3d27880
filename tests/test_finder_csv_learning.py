"""A finder CSV job learns its domains' patterns as it goes (issue 26): over real HTTP and a
real Prefect run, against a Postfix-like testbed host."""

from __future__ import annotations

import csv
import io

import pytest
from api_helpers import poll_job, running_app

from verimail.store.patterns import pattern_counts
from verimail.testbed.people import company, finder_world
from verimail.testbed.world import POSTFIX_SOFT_ERROR_LIMIT

pytestmark = pytest.mark.usefixtures("prefect_harness")

PEOPLE = company("lastf.test", "last.f", 50)
FIRST_COST = 1 + 11  # the catch-all probe, then Sean O'Connor's 11th candidate: last.f


async def test_fifty_people_at_a_last_f_company_cost_one_rcpt_each_after_the_first(
    testbed_factory, testbed_settings, tmp_path
) -> None:
    tb = testbed_factory(finder_world(PEOPLE))
    settings = testbed_settings(tb, tmp_path, finder_charge=1)
    upload = "first,last,domain\n" + "".join(f"{p.first},{p.last},lastf.test\n" for p in PEOPLE)
    async with running_app(settings) as app:
        customer = app.customer(credits=100)
        created = await app.client.post(
            "/api/find-email/csv",
            headers=customer.headers,
            files={"file": ("people.csv", upload.encode(), "text/csv")},
        )
        assert created.status_code == 200, created.text
        url = f"/api/find-email/csv/{created.json()['job_id']}"
        done = await poll_job(app.client, url, customer.headers)
        assert done["status"] == "completed", done
        assert done["found_count"] == 50 and done["credits_used"] == 50
        download = await app.client.get(f"{url}/download", headers=customer.headers)
        rows = list(csv.DictReader(io.StringIO(download.text)))
        assert [r["email"] for r in rows] == [p.email for p in PEOPLE]
        confidences = [float(r["confidence"]) for r in rows]
        assert confidences[1] < confidences[10] < confidences[49]
        pattern = await app.client.get(
            "/api/domain-pattern", params={"domain": "lastf.test"}, headers=customer.headers
        )
        assert (pattern.json()["pattern"], pattern.json()["finds"]) == ("last.f", 50)
        assert pattern_counts(app.store.engine, "lastf.test", customer.account_id) == {"last.f": 50}
    stats = tb.host_stats("mx.lastf.test")
    assert stats.rcpt_to == FIRST_COST + 49
    assert stats.hangups == 0 and stats.peak_session_rejections < POSTFIX_SOFT_ERROR_LIMIT
