"""Deferred retries in jobs (issue 22, point 3) on the local runner, against the testbed's
postgrey rule: the first pass parks greylisted addresses, the job says so while it waits
(no worker held), a later pass settles them, and a restart during the wait loses nothing."""

from __future__ import annotations

from datetime import timedelta

import pytest
from api_helpers import (
    STALE_AFTER,
    host_per_domain,
    poll_job,
    poll_until,
    running_app,
    total_balance,
)

from verimail.testbed.server import Testbed
from verimail.testbed.world import HostBehaviour, World

pytestmark = pytest.mark.usefixtures("prefect_harness")

GREY_DELAY = 1.5  # postgrey's delay here; the job's first retry waits 2 s
EMAILS = [
    "alice@ok.test",
    "nobody@ok.test",
    "alice@grey.test",
    "bob@grey.test",
    "nobody@grey.test",
    "alice@grey.test",  # (a duplicate row: counted twice, asked once per pass)
]


def _world() -> World:
    hosts = {
        "ok.test": HostBehaviour(mailboxes={"alice"}),
        "grey.test": HostBehaviour(mailboxes={"alice", "bob"}, greylist_delay=GREY_DELAY),
    }
    return host_per_domain(hosts)


@pytest.fixture
def tb(testbed_factory) -> Testbed:
    return testbed_factory(_world())


@pytest.fixture
def settings(tb, testbed_settings, tmp_path):
    return testbed_settings(
        tb,
        tmp_path,
        smtp_greylist_retries=0,  # (only the deferred passes retry)
        job_retry_delay=2.0,
        job_retry_passes=2,
        job_retry_max_wait=10.0,
        job_stale_after=STALE_AFTER,  # the reaper sweeps every 2 s
    )


def _waiting(body: dict) -> bool:
    return body.get("phase") == "waiting_to_retry"


async def test_greylisted_addresses_wait_then_get_their_true_verdicts(settings, tb):
    async with running_app(settings) as app:
        customer = app.customer(credits=100)
        created = await app.client.post(
            "/api/verify/bulk", json={"emails": EMAILS}, headers=customer.headers
        )
        assert created.status_code == 200, created.text
        url = f"/api/verify/bulk/{created.json()['job_id']}"
        waiting = await poll_until(app.client, url, customer.headers, _waiting)
        assert waiting["status"] == "processing" and waiting["results"] is None
        assert waiting["retry_waiting"] == 3 and waiting["next_retry_at"]
        assert waiting["unknown_count"] == 4  # rows: alice twice, bob, nobody
        runner = app.app.state.runner
        await poll_until(app.client, url, customer.headers, lambda _: not runner.held_jobs())
        assert _waiting((await app.client.get(url, headers=customer.headers)).json())
        done = await poll_job(app.client, url, customer.headers)
        assert done["status"] == "completed", done
        assert (done["phase"], done["retry_waiting"], done["next_retry_at"]) == (None, 0, None)
        got = {r["email"]: (r["status"], r["sub_status"]) for r in done["results"]}
        assert got["alice@grey.test"] == ("valid", "ok")
        assert got["bob@grey.test"] == ("valid", "ok")
        assert got["nobody@grey.test"] == ("invalid", "mailbox_not_found")
        assert got["alice@ok.test"] == ("valid", "ok")
        assert (done["unknown_count"], done["valid_count"], done["invalid_count"]) == (0, 4, 2)
        assert done["processed_emails"] == 6 and done["credits_refunded"] == 0
        assert total_balance(app.store, customer.account_id) == 94  # reserved once, kept
        # Each greylisted address was asked twice (the pass, the retry), the rest once.
        rcpts = tb.host_stats("mx.grey.test").rcpts
        assert rcpts.count("alice@grey.test") == 2 and rcpts.count("nobody@grey.test") == 2
        assert tb.host_stats("mx.ok.test").rcpts.count("alice@ok.test") == 1


def _asked(tb: Testbed, email: str) -> int:
    """How often the greylisting host was asked about ``email`` (its RCPT TO count)."""
    return tb.host_stats("mx.grey.test").rcpts.count(email)


@pytest.mark.parametrize("in_pass", [None, 1], ids=["default", "raised"])
async def test_a_first_pass_a_deferred_pass_follows_parks_greylisting_at_once(
    tb, testbed_settings, tmp_path, in_pass
):
    """With the in-run back-off on (2 retries, 0.1 s apart), a job's first pass still asks
    a greylisted recipient once and parks it, by default; the deferred pass settles it.
    With ``job_greylist_retries`` raised, the pass retries in place first, as before."""
    raised = {} if in_pass is None else {"job_greylist_retries": in_pass}
    settings = testbed_settings(
        tb,
        tmp_path,
        smtp_greylist_retries=2,
        smtp_greylist_delay=0.1,  # (far below postgrey's 1.5 s: a retry in place fails)
        job_retry_delay=2.0,
        job_retry_passes=2,
        job_retry_max_wait=10.0,
        **raised,
    )
    async with running_app(settings) as app:
        customer = app.customer(credits=100)
        created = await app.client.post(
            "/api/verify/bulk", json={"emails": EMAILS}, headers=customer.headers
        )
        url = f"/api/verify/bulk/{created.json()['job_id']}"
        waiting = await poll_until(app.client, url, customer.headers, _waiting)
        assert waiting["retry_waiting"] == 3
        first = 1 if in_pass is None else 1 + in_pass
        assert _asked(tb, "alice@grey.test") == _asked(tb, "nobody@grey.test") == first
        done = await poll_job(app.client, url, customer.headers)
        assert done["status"] == "completed" and done["unknown_count"] == 0, done
        assert _asked(tb, "alice@grey.test") == first + 1  # (the deferred pass, once)


async def test_opting_out_finishes_after_the_first_pass(tb, testbed_settings, tmp_path):
    """A job that opted out has no later pass: its only pass waits out the in-run
    back-off (``smtp_greylist_retries``), whatever ``job_greylist_retries`` says."""
    settings = testbed_settings(
        tb, tmp_path, smtp_greylist_retries=2, smtp_greylist_delay=0.1, job_greylist_retries=0
    )
    async with running_app(settings) as app:
        customer = app.customer(credits=100)
        created = await app.client.post(
            "/api/verify/bulk",
            json={"emails": EMAILS, "retry_unknowns": False},
            headers=customer.headers,
        )
        url = f"/api/verify/bulk/{created.json()['job_id']}"
        done = await poll_job(app.client, url, customer.headers)
        assert done["status"] == "completed" and done["phase"] is None
        subs = {r["email"]: r["sub_status"] for r in done["results"]}
        assert subs["alice@grey.test"] == subs["nobody@grey.test"] == "greylisted"
        assert done["unknown_count"] == 4
        assert _asked(tb, "alice@grey.test") == 3  # (asked, then retried twice in place)


async def test_a_restart_during_the_wait_loses_nothing(settings, tb):
    """The API process that parked the job stops before the pass is due (its timer dies
    with it); the next one's reaper starts the pass once it is due."""
    async with running_app(settings) as app:
        customer = app.customer(credits=100)
        created = await app.client.post(
            "/api/verify/bulk", json={"emails": EMAILS}, headers=customer.headers
        )
        url = f"/api/verify/bulk/{created.json()['job_id']}"
        await poll_until(app.client, url, customer.headers, _waiting)
    async with running_app(settings) as again:
        done = await poll_job(again.client, url, customer.headers)
        assert done["status"] == "completed", done
        assert done["unknown_count"] == 0 and done["credits_refunded"] == 0
        assert total_balance(again.store, customer.account_id) == 94


async def test_the_dashboard_job_page_says_the_job_waits(settings, tb):
    from test_dashboard import browser, logged_in, make_user

    from verimail.store.accounts import create_api_key

    async with running_app(settings) as app:
        user = make_user(app, "grey@example.com")
        key, _ = create_api_key(app.store.engine, user.id, name="test")
        headers = {"Authorization": f"Bearer {key}"}
        created = await app.client.post(
            "/api/verify/bulk", json={"emails": EMAILS}, headers=headers
        )
        job_id = created.json()["job_id"]
        url = f"/api/verify/bulk/{job_id}"
        await poll_until(app.client, url, headers, _waiting)
        async with browser(app) as client:
            await logged_in(client, "grey@example.com")
            page = (await client.get(f"/dashboard/jobs/{job_id}")).text
        assert "Waiting to retry 3 greylisted or temporarily failed addresses" in page
        await poll_job(app.client, url, headers)


async def test_a_retry_pass_that_died_is_done_again_not_the_whole_job(settings, tb):
    """A run took the retry pass and died (its process was killed mid-pass): the next
    process's reaper resumes the job at that pass — the addresses the first pass settled
    are not asked again — and it ends with the true verdicts, charged once."""
    from verimail.store import jobs as job_store
    from verimail.store.db import utcnow
    from verimail.store.job_retries import claim_retry_pass

    async with running_app(settings) as app:
        customer = app.customer(credits=100)
        created = await app.client.post(
            "/api/verify/bulk", json={"emails": EMAILS}, headers=customer.headers
        )
        job_id = created.json()["job_id"]
        url = f"/api/verify/bulk/{job_id}"
        await poll_until(app.client, url, customer.headers, _waiting)
        job = job_store.get_job_any(app.store.engine, job_id)
        assert job is not None
        # The run that takes the pass, then dies: its last beat is long ago.
        long_ago = utcnow() - timedelta(minutes=10)
        assert claim_retry_pass(
            app.store.engine, job_id, job.attempt, int(job.retry["pass"]), now=long_ago
        )
    async with running_app(settings) as again:
        done = await poll_job(again.client, url, customer.headers)
        assert done["status"] == "completed", done
        assert done["unknown_count"] == 0 and done["credits_refunded"] == 0
        assert total_balance(again.store, customer.account_id) == 94
    # The first pass's settled address was asked once: only the retry pass ran again.
    assert tb.host_stats("mx.ok.test").rcpts.count("alice@ok.test") == 1
