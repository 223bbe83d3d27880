"""Synchronous calls answer by their ``timeout`` and never wait out greylisting (issue 22,
points 1 and 2): single, batch and find-email against the testbed's silent, tarpitting,
slow-greeting and postgrey hosts, with the servers' own timeouts far beyond the deadline."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator

import pytest
from api_helpers import RunningApp, assert_error_body, host_per_domain, running_app, total_balance

from verimail.testbed.server import Testbed
from verimail.testbed.world import HostBehaviour, World

SINGLE = "/api/verify/single"
BATCH = "/api/verify/batch"
FIND = "/api/find-email"
# The answer may come this much after the deadline, never later: room for a busy machine
# (issue 48), and still far short of the servers' 30 s delays and the engine's 60 s timeouts:
# only the deadline can have ended a call that answers within it.
MARGIN = 10.0
HUNG_UP_WITHIN = 20.0  # the engine's sessions close by then: long before its own timeouts

HOSTS = {
    "ok.test": HostBehaviour(mailboxes={"alice", "john.smith"}),
    "silent.test": HostBehaviour(hostile="silent"),  # connects, never greets
    "mute.test": HostBehaviour(hostile="mute_after_ehlo"),  # greets, then never answers
    "slowgreet.test": HostBehaviour(mailboxes={"alice"}, reply_delay=30),
    "tarpit.test": HostBehaviour(mailboxes={"alice"}, tarpit_delay=30),
    "grey.test": HostBehaviour(mailboxes={"alice", "john.smith"}, greylist_delay=0.6),
}


def deadline_world() -> World:
    return host_per_domain(HOSTS)


@pytest.fixture
def tb(testbed_factory) -> Testbed:
    return testbed_factory(deadline_world())


@pytest.fixture
async def api(tb, tmp_path, testbed_settings) -> AsyncIterator[RunningApp]:
    # The servers' own timeouts and the in-run greylist back-off are far beyond the
    # deadlines: only the deadline can end these calls in time.
    settings = testbed_settings(
        tb,
        tmp_path,
        smtp_connect_timeout=60.0,
        smtp_command_timeout=60.0,
        smtp_greylist_delay=20.0,
        smtp_greylist_retries=3,
        verify_timeout=2.0,
    )
    async with running_app(settings) as running:
        yield running


async def timed(api: RunningApp, path: str, body: dict, headers: dict) -> tuple[dict, float]:
    started = time.perf_counter()
    response = await api.client.post(path, json=body, headers=headers)
    elapsed = time.perf_counter() - started
    assert response.status_code == 200, response.text
    return response.json(), elapsed


@pytest.mark.parametrize("domain", ["silent.test", "mute.test", "slowgreet.test"])
async def test_single_answers_unknown_timeout_by_the_deadline(
    api: RunningApp, tb: Testbed, domain: str
) -> None:
    customer = api.customer(credits=5)
    body, elapsed = await timed(
        api, SINGLE, {"email": f"alice@{domain}", "timeout": 1.5}, customer.headers
    )
    assert elapsed <= 1.5 + MARGIN, elapsed
    assert (body["status"], body["sub_status"]) == ("unknown", "timeout")
    assert body["smtp_response"] is None  # (no reply came: nothing to quote)
    assert "did not answer in time" in body["reason"] and "1.5 s deadline" in body["reason"]
    assert total_balance(api.store, customer.account_id) == 4  # charged: it was answered
    # The engine hung up: no session of the call is left open on the server.
    assert tb.wait_until(lambda tb: tb.total_stats().active == 0, timeout=HUNG_UP_WITHIN)


async def test_batch_keeps_what_was_settled_and_answers_the_rest_by_the_deadline(
    api: RunningApp, tb: Testbed
) -> None:
    customer = api.customer(credits=20)
    emails = [
        "alice@ok.test",
        "nobody@ok.test",
        "alice@silent.test",
        "alice@tarpit.test",
        "nobody@tarpit.test",
        "alice@grey.test",
    ]
    # 6 s: the well-behaved hosts' answers must come by then on a busy machine too (the
    # silent and tarpitting hosts' never do).
    body, elapsed = await timed(api, BATCH, {"emails": emails, "timeout": 6}, customer.headers)
    assert elapsed <= 6 + MARGIN, elapsed
    got = {r["email"]: (r["status"], r["sub_status"]) for r in body["results"]}
    assert got["alice@ok.test"] == ("valid", "ok")
    assert got["nobody@ok.test"] == ("invalid", "mailbox_not_found")
    assert got["alice@silent.test"] == ("unknown", "timeout")
    assert got["alice@grey.test"] == ("unknown", "greylisted")
    # The tarpit answers the first rejection, then holds every reply: what it said before
    # the deadline is kept, what it had not said is a timeout.
    assert got["alice@tarpit.test"][1] in ("ok", "timeout")
    assert "timeout" in {got["alice@tarpit.test"][1], got["nobody@tarpit.test"][1]}
    assert body["summary"]["unknown"] >= 3 and body["credits_used"] == 6
    assert tb.wait_until(lambda tb: tb.total_stats().active == 0, timeout=HUNG_UP_WITHIN)


async def test_greylisting_is_answered_at_once_with_retry_after_and_the_retry_passes(
    api: RunningApp, tb: Testbed
) -> None:
    """No in-call back-off (20 s here): one RCPT, ``retry_after``, then a retry with the same
    envelope sender from the same address passes postgrey's triplet once its delay is over."""
    customer = api.customer(credits=5)
    first, elapsed = await timed(api, SINGLE, {"email": "alice@grey.test"}, customer.headers)
    assert elapsed < 10, elapsed  # (not the 20 s back-off)
    assert (first["status"], first["sub_status"]) == ("unknown", "greylisted")
    assert first["retry_after"] == 300  # the reply names no delay: the setting's default
    assert first["smtp_response"].startswith("450")
    assert tb.host_stats("mx.grey.test").rcpt_to == 2  # the address and the catch-all probe
    await asyncio.sleep(0.7)  # postgrey's delay (0.6 s) is time passing, nothing to poll
    second, _ = await timed(api, SINGLE, {"email": "alice@grey.test"}, customer.headers)
    assert (second["status"], second["retry_after"]) == ("valid", None)


@pytest.mark.parametrize("timeout", [0, 0.5, 61, "soon", -3])
async def test_timeout_out_of_bounds_is_422_and_charges_nothing(
    api: RunningApp, timeout: object
) -> None:
    customer = api.customer(credits=5)
    for path, body in (
        (SINGLE, {"email": "alice@ok.test", "timeout": timeout}),
        (BATCH, {"emails": ["alice@ok.test"], "timeout": timeout}),
        (
            FIND,
            {"first_name": "John", "last_name": "Smith", "domain": "ok.test", "timeout": timeout},
        ),
    ):
        response = await api.client.post(path, json=body, headers=customer.headers)
        assert_error_body(response, 422)
        assert "timeout" in response.text
    assert total_balance(api.store, customer.account_id) == 5


async def test_default_timeout_comes_from_the_setting(api: RunningApp, tb: Testbed) -> None:
    customer = api.customer(credits=5)
    body, elapsed = await timed(api, SINGLE, {"email": "alice@silent.test"}, customer.headers)
    assert elapsed <= 2.0 + MARGIN, elapsed  # VERIMAIL_VERIFY_TIMEOUT=2 here
    assert body["sub_status"] == "timeout"


async def test_find_email_answers_by_the_deadline_and_charges_nothing(
    api: RunningApp, tb: Testbed
) -> None:
    customer = api.customer(credits=50)
    body, elapsed = await timed(
        api,
        FIND,
        {"first_name": "John", "last_name": "Smith", "domain": "mute.test", "timeout": 1.5},
        customer.headers,
    )
    assert elapsed <= 1.5 + MARGIN, elapsed
    assert body["status"] == "not_found" and body["credits_used"] == 0
    assert "deadline" in body["reason"]
    assert total_balance(api.store, customer.account_id) == 50
    assert tb.wait_until(lambda tb: tb.total_stats().active == 0, timeout=HUNG_UP_WITHIN)
    found, _ = await timed(
        api,
        FIND,
        {"first_name": "John", "last_name": "Smith", "domain": "ok.test", "timeout": 5},
        customer.headers,
    )
    assert found["status"] == "found"


@pytest.mark.parametrize(
    ("reply", "seconds"),
    [
        ("450 4.2.0 Greylisted, try again later", 300),
        ("450 4.7.1 Greylisted, please try again in 5 minutes", 300),
        ("451 4.7.1 Please retry in 120 seconds", 120),
        ("450 Service unavailable, wait 45 s", 45),
        (None, 300),
    ],
)
def test_retry_after_reads_the_servers_own_figure(reply: str | None, seconds: int) -> None:
    from verimail.engine.smtp.replies import retry_after_hint

    assert retry_after_hint(reply, 300) == seconds
