"""A job through a SOCKS5 proxy (pproxy) that goes down mid-way (issue 34): the rows it
could not verify are parked as for an unreachable server, a later pass through the proxy,
up again, settles them, and the credits are charged once. The password shows nowhere."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator

import pytest
from api_helpers import (
    STALE_AFTER,
    host_per_domain,
    poll_job,
    poll_until,
    running_app,
    total_balance,
)

from bench.socks_proxy import SocksProxy
from verimail.testbed.server import Testbed
from verimail.testbed.world import HostBehaviour

pytestmark = pytest.mark.usefixtures("prefect_harness")

PASSWORD = "job-Pa55-secret"
TOKEN = "metrics-token-for-the-test"
DOMAINS = [f"d{i}.test" for i in range(6)]
EMAILS = [f"{who}@{d}" for d in DOMAINS for who in ("alice", "bob", "carol", "dave", "nobody")]


@pytest.fixture
def proxy() -> Iterator[SocksProxy]:
    with SocksProxy(user="jobs", password=PASSWORD) as running:
        yield running


@pytest.fixture
def tb(testbed_factory) -> Testbed:
    # Slow replies and small sessions: the job is still at work when the proxy goes.
    box = HostBehaviour(mailboxes={"alice", "bob", "carol", "dave"}, reply_delay=0.05)
    return testbed_factory(host_per_domain(dict.fromkeys(DOMAINS, box)))


async def test_the_proxy_going_down_mid_job_parks_its_rows_and_charges_once(
    tb, testbed_settings, tmp_path, proxy
):
    settings = testbed_settings(
        tb,
        tmp_path,
        smtp_proxy=proxy.url,
        smtp_max_sessions_per_host=1,
        smtp_rcpts_per_session=2,
        smtp_greylist_retries=0,
        job_retry_delay=2.0,
        job_retry_passes=2,
        job_retry_max_wait=10.0,
        metrics_token=TOKEN,
    )
    async with running_app(settings) as app:
        customer = app.customer(credits=100)
        created = await app.client.post(
            "/api/verify/bulk", json={"emails": EMAILS}, headers=customer.headers
        )
        assert created.status_code == 200, created.text
        url = f"/api/verify/bulk/{created.json()['job_id']}"
        started = await asyncio.to_thread(tb.wait_until, lambda t: t.total_stats().rcpt_to >= 2)
        assert started
        proxy.stop()  # (sessions under way are cut, new ones cannot be had)

        waiting = await poll_until(
            app.client, url, customer.headers, lambda b: b.get("phase") == "waiting_to_retry"
        )
        assert waiting["status"] == "processing" and waiting["retry_waiting"] > 0
        assert waiting["unknown_count"] == waiting["retry_waiting"]
        assert total_balance(app.store, customer.account_id) == 100 - len(EMAILS)

        health = await app.client.get("/api/health")
        metrics = await app.client.get("/metrics", headers={"Authorization": f"Bearer {TOKEN}"})
        assert metrics.status_code == 200
        assert PASSWORD not in health.text + metrics.text + waiting.__repr__()

        proxy.restart()
        done = await poll_job(app.client, url, customer.headers)
    assert done["status"] == "completed", done
    got = {r["email"]: (r["status"], r["sub_status"]) for r in done["results"]}
    for email in EMAILS:
        want = ("invalid", "mailbox_not_found") if email.startswith("nobody") else ("valid", "ok")
        assert got[email] == want, (email, got[email])
    assert done["credits_refunded"] == 0 and done["unknown_count"] == 0
    assert total_balance(app.store, customer.account_id) == 100 - len(EMAILS)
    assert PASSWORD not in repr(done)


async def test_a_deferred_retry_leaves_through_the_egress_of_the_first_try(
    testbed_factory, testbed_settings, tmp_path
):
    """postgrey keys on the client address. The first pass goes out through the proxy on
    127.0.0.2 and is greylisted; the job is parked with each row's egress; the service
    restarts with an egress file that now routes everything through the proxy on
    127.0.0.3. The retry pass still leaves through the first (recorded) egress, so it is
    let through: from the other address it would be greylisted anew, and with one pass
    only the job would end `greylisted`."""
    grey = HostBehaviour(mailboxes={"alice", "bob"}, greylist_delay=1.5)
    tb = testbed_factory(host_per_domain({"grey.test": grey}))
    emails = ["alice@grey.test", "bob@grey.test", "nobody@grey.test"]
    path = tmp_path / "egress-first.yaml"

    def egress_file(default: str, first: SocksProxy, second: SocksProxy) -> None:
        # (a file of another name: other settings, so not the first app's shared engine)
        nonlocal path
        path = tmp_path / f"egress-{default}.yaml"
        path.write_text(
            "egresses:\n"
            f"  - {{name: first, url: '{first.url}', helo_name: first.verimail.test}}\n"
            f"  - {{name: second, url: '{second.url}', helo_name: second.verimail.test}}\n"
            f"default: {default}\n"
        )

    with SocksProxy("127.0.0.2") as first, SocksProxy("127.0.0.3") as second:
        egress_file("first", first, second)

        def settings():  # (read anew: the egress file is read when settings are made)
            return testbed_settings(
                tb,
                tmp_path,
                smtp_egress_file=path,
                smtp_greylist_retries=0,
                job_retry_delay=2.0,
                job_retry_passes=1,
                job_retry_max_wait=10.0,
                job_stale_after=STALE_AFTER,
            )

        async with running_app(settings()) as app:
            customer = app.customer(credits=100)
            created = await app.client.post(
                "/api/verify/bulk", json={"emails": emails}, headers=customer.headers
            )
            url = f"/api/verify/bulk/{created.json()['job_id']}"
            waiting = await poll_until(
                app.client, url, customer.headers, lambda b: b.get("phase") == "waiting_to_retry"
            )
            assert waiting["retry_waiting"] == 3
        assert first.destinations() and not second.destinations()
        first_sessions = len(first.destinations())

        egress_file("second", first, second)
        async with running_app(settings()) as again:
            done = await poll_job(again.client, url, customer.headers)
        via_first, via_second = len(first.destinations()), len(second.destinations())
    assert done["status"] == "completed", done
    got = {r["email"]: (r["status"], r["sub_status"]) for r in done["results"]}
    assert got == {
        "alice@grey.test": ("valid", "ok"),
        "bob@grey.test": ("valid", "ok"),
        "nobody@grey.test": ("invalid", "mailbox_not_found"),
    }
    assert via_first > first_sessions and via_second == 0
