"""Deferred retries in finder CSV jobs (issue 22), on the local runner against the testbed's
postgrey rule: a row whose domain greylists the lookup is parked, the job says so while it
waits (no worker held), a later pass finds the person, and each find is charged once."""

from __future__ import annotations

import asyncio
import csv
import io
import json

import pytest
from api_helpers import (
    STALE_AFTER,
    host_per_domain,
    poll_job,
    poll_until,
    running_app,
    total_balance,
)
from test_webhooks import Receiver

from verimail.store.billing.ledger import ledger
from verimail.store.jobs import get_job_by_public_id
from verimail.testbed.server import Testbed
from verimail.testbed.world import HostBehaviour

pytestmark = pytest.mark.usefixtures("prefect_harness")

GREY_DELAY = 1.5  # postgrey's delay here; the job's first retry waits 2 s
PRICE = 10  # a find
# Ann Lee is found at once; Dora Diaz's mailbox is her third candidate (ddiaz, after
# dora.diaz and dora) on a greylisting server; Nobody Here has no mailbox there.
PEOPLE = (
    "first_name,last_name,domain\r\n"
    "Ann,Lee,ok.test\r\n"
    "Dora,Diaz,grey.test\r\n"
    "Nobody,Here,grey.test\r\n"
)


@pytest.fixture
def tb(testbed_factory) -> Testbed:
    hosts = {
        "ok.test": HostBehaviour(mailboxes={"ann.lee"}),
        "grey.test": HostBehaviour(mailboxes={"ddiaz", "eve"}, greylist_delay=GREY_DELAY),
    }
    return testbed_factory(host_per_domain(hosts))


@pytest.fixture
def settings(tb, testbed_settings, tmp_path):
    return testbed_settings(
        tb,
        tmp_path,
        finder_charge=PRICE,
        smtp_greylist_retries=0,
        job_retry_delay=2.0,
        job_retry_passes=2,
        job_retry_max_wait=10.0,
        job_stale_after=STALE_AFTER,  # the reaper sweeps every 2 s
        webhook_allow_networks=["127.0.0.0/8"],
    )


def _waiting(body: dict) -> bool:
    return body.get("phase") == "waiting_to_retry"


async def _create(app, headers: dict[str, str], people: str = PEOPLE, **fields: str) -> str:
    created = await app.client.post(
        "/api/find-email/csv",
        headers=headers,
        files={"file": ("people.csv", people.encode(), "text/csv")},
        data=fields,
    )
    assert created.status_code == 200, created.text
    return f"/api/find-email/csv/{created.json()['job_id']}"


async def _results(app, customer, url: str) -> list[list[str]]:
    download = await app.client.get(f"{url}/download", headers=customer.headers)
    assert download.status_code == 200, download.text
    return list(csv.reader(io.StringIO(download.text)))[1:]


def _charges(app, customer) -> list[tuple[str | None, int]]:
    entries = ledger(app.store.engine, customer.account_id)
    return sorted((e.reference, e.delta) for e in entries if e.kind == "charge")


async def test_a_greylisted_row_waits_then_its_person_is_found_and_charged_once(settings, tb):
    with Receiver() as hook:
        async with running_app(settings) as app:
            customer = app.customer(credits=100)
            url = await _create(app, customer.headers, webhook_url=hook.url)
            waiting = await poll_until(app.client, url, customer.headers, _waiting)
            assert waiting["status"] == "processing" and waiting["next_retry_at"]
            assert waiting["retry_waiting"] == 2  # Dora and Nobody, put off
            assert (waiting["found_count"], waiting["credits_used"]) == (1, PRICE)
            assert waiting["processed_rows"] == 3 and waiting["not_found_count"] == 2
            early = await app.client.get(f"{url}/download", headers=customer.headers)
            assert early.status_code == 409  # no results until the last pass
            runner = app.app.state.runner
            await poll_until(app.client, url, customer.headers, lambda _: not runner.held_jobs())
            assert _waiting((await app.client.get(url, headers=customer.headers)).json())
            ok_rcpts = list(tb.host_stats("mx.ok.test").rcpts)
            assert not hook.requests  # the webhook waits for the end too

            done = await poll_job(app.client, url, customer.headers)
            assert done["status"] == "completed", done
            assert (done["phase"], done["retry_waiting"], done["next_retry_at"]) == (None, 0, None)
            assert (done["found_count"], done["not_found_count"]) == (2, 1)
            assert done["credits_used"] == 2 * PRICE
            assert total_balance(app.store, customer.account_id) == 100 - 2 * PRICE
            charges = _charges(app, customer)
            assert [delta for _, delta in charges] == [-PRICE, -PRICE]
            assert len({reference for reference, _ in charges}) == 2  # one per row
            rows = await _results(app, customer, url)
            assert [row[3:5] for row in rows] == [
                ["ann.lee@ok.test", "found"],
                ["ddiaz@grey.test", "found"],
                ["", "not_found"],
            ]
            # The first pass asked the greylisting server every candidate once, so the
            # first retry pass found Dora (ddiaz asked twice); Ann was not looked up again.
            assert tb.host_stats("mx.grey.test").rcpts.count("ddiaz@grey.test") == 2
            assert tb.host_stats("mx.ok.test").rcpts == ok_rcpts
            await asyncio.to_thread(runner.wait, 60)  # (its run delivered the webhook)
        assert len(hook.requests) == 1
        payload = json.loads(hook.requests[0][1])
        assert payload["status"] == "completed" and payload["found_count"] == 2
        assert payload["phase"] is None and payload["credits_used"] == 2 * PRICE


async def test_opting_out_keeps_the_one_pass_answer(settings, tb):
    """``retry_unknowns=false``: the job finishes after its first pass; the greylisted rows
    are not_found (their lookups said to try later), free, and the greylisting server was
    asked only the catch-all probe (nothing is asked for a retry that will not come)."""
    async with running_app(settings) as app:
        customer = app.customer(credits=100)
        url = await _create(app, customer.headers, retry_unknowns="false")
        done = await poll_job(app.client, url, customer.headers)
        assert done["status"] == "completed" and done["phase"] is None
        assert (done["found_count"], done["not_found_count"]) == (1, 2)
        assert done["credits_used"] == PRICE
        assert total_balance(app.store, customer.account_id) == 100 - PRICE
        rows = await _results(app, customer, url)
        assert [row[4] for row in rows] == ["found", "not_found", "not_found"]
        assert tb.host_stats("mx.grey.test").rcpt_to == 1
        job = get_job_by_public_id(app.store.engine, customer.account_id, done["job_id"])
        assert job is not None and job.retry == {}  # never parked
        bad = await app.client.post(
            "/api/find-email/csv",
            headers=customer.headers,
            files={"file": ("people.csv", PEOPLE.encode(), "text/csv")},
            data={"retry_unknowns": "perhaps"},
        )
        assert bad.status_code == 422 and "retry_unknowns" in bad.json()["detail"]


async def test_credits_that_run_out_between_passes_skip_the_find_not_overdraw(settings, tb):
    """The account can pay for two finds: Ann's in the first pass, then one of the two
    people the retry pass finds at grey.test (Dora, the earlier row); Eve's find is not
    revealed (skipped_no_credits) and nothing more is charged."""
    people = PEOPLE.replace("Nobody,Here", "Eve,X")  # eve@grey.test: her second candidate
    async with running_app(settings) as app:
        customer = app.customer(credits=2 * PRICE)
        url = await _create(app, customer.headers, people)
        await poll_until(app.client, url, customer.headers, _waiting)
        done = await poll_job(app.client, url, customer.headers)
        assert done["status"] == "completed", done
        assert (done["found_count"], done["skipped_no_credits_count"]) == (2, 1)
        assert done["credits_used"] == 2 * PRICE
        assert total_balance(app.store, customer.account_id) == 0
        assert [delta for _, delta in _charges(app, customer)] == [-PRICE, -PRICE]
        rows = await _results(app, customer, url)
        assert [row[3:5] for row in rows] == [
            ["ann.lee@ok.test", "found"],
            ["ddiaz@grey.test", "found"],
            ["", "skipped_no_credits"],
        ]


async def test_a_restart_during_the_wait_loses_nothing(settings, tb):
    """The API process that parked the job stops before the pass is due (its timer dies
    with it); the next one's reaper starts the pass once it is due, and each find is still
    charged once."""
    async with running_app(settings) as app:
        customer = app.customer(credits=100)
        url = await _create(app, customer.headers)
        await poll_until(app.client, url, customer.headers, _waiting)
    async with running_app(settings) as again:
        done = await poll_job(again.client, url, customer.headers)
        assert done["status"] == "completed", done
        assert (done["found_count"], done["credits_used"]) == (2, 2 * PRICE)
        assert total_balance(again.store, customer.account_id) == 100 - 2 * PRICE
        assert [delta for _, delta in _charges(again, customer)] == [-PRICE, -PRICE]


async def test_the_dashboard_job_page_says_which_rows_wait(settings, tb):
    from test_dashboard import browser, logged_in, make_user

    from verimail.store.accounts import create_api_key, set_finder

    async with running_app(settings) as app:
        user = make_user(app, "grey@example.com", credits=100)
        set_finder(app.store.engine, user.id, True)
        key, _ = create_api_key(app.store.engine, user.id, name="test")
        headers = {"Authorization": f"Bearer {key}"}
        url = await _create(app, headers)
        waiting = await poll_until(app.client, url, headers, _waiting)
        job = get_job_by_public_id(app.store.engine, user.id, waiting["job_id"])
        assert job is not None
        async with browser(app) as client:
            await logged_in(client, "grey@example.com")
            page = (await client.get(f"/dashboard/jobs/{job.id}")).text
        assert "Waiting to retry 2 rows whose mail server greylisted" in page
        await poll_job(app.client, url, headers)
