"""Re-verification list owners use: re-verify a past job now, on a schedule (real Prefect
scheduled runs, run by the local runner), and the list's history — against a testbed world
whose mailboxes change between runs."""

from __future__ import annotations

import asyncio
import contextlib
import csv
import io
import json
import time
from datetime import UTC, datetime, timedelta

import pytest
from api_helpers import (
    PATIENCE,
    STALE_AFTER,
    Customer,
    assert_error_body,
    poll_job,
    running_app,
    total_balance,
)
from test_webhooks import Receiver

from verimail.jobs.webhook import sign
from verimail.store import jobs as job_store
from verimail.testbed.world import DomainSpec, HostBehaviour, HostSpec, World

pytestmark = pytest.mark.usefixtures("prefect_harness")


def _world(mailboxes: set[str]) -> World:
    return World.of(
        [HostSpec("mx.acme.test", HostBehaviour(mailboxes=mailboxes))],
        [DomainSpec("acme.test", mx=[(10, "mx.acme.test")])],
    )


LIST = (
    "id,Name,Email\r\n"
    "1,Alice,alice@acme.test\r\n"
    "2,Bob,bob@acme.test\r\n"
    "3,Carl,carl@acme.test\r\n"
    "4,Nobody,\r\n"
    "5,Bob again,bob@acme.test\r\n"
)


def _upload(**fields: str) -> dict:
    return {"files": {"file": ("list.csv", LIST.encode(), "text/csv")}, "data": fields}


@pytest.fixture
def world(testbed_factory):
    return testbed_factory(_world({"alice", "bob"}))


@pytest.fixture
def settings(world, testbed_settings, tmp_path):
    # A short stale time makes the reaper sweep (which starts due scheduled runs) often.
    return testbed_settings(
        world, tmp_path, job_stale_after=STALE_AFTER, webhook_allow_networks=["127.0.0.0/8"]
    )


async def _completed_list(app, customer, **fields: str) -> dict:
    created = await app.client.post("/api/bulk", headers=customer.headers, **_upload(**fields))
    assert created.status_code == 200, created.text
    done = await poll_job(app.client, f"/api/bulk/{created.json()['job_id']}", customer.headers)
    assert done["status"] == "completed", done
    assert (done["valid_count"], done["invalid_count"]) == (3, 1)
    return created.json() | done


async def test_reverify_a_completed_job_after_mailboxes_changed(world, settings):
    async with running_app(settings) as app:
        customer = app.customer(credits=100)
        first = await _completed_list(app, customer)
        assert total_balance(app.store, customer.account_id) == 96
        # Bob leaves the company, Carl joins.
        world.replace_world(_world({"alice", "carl"}))
        created = await app.client.post(
            f"/api/bulk/{first['job_id']}/reverify", headers=customer.headers
        )
        assert created.status_code == 200, created.text
        job = created.json()
        assert job["status"] in ("pending", "processing") and job["total_emails"] == 4
        assert job["reverify_of"] == first["job_id"] and job["job_id"] != first["job_id"]
        assert total_balance(app.store, customer.account_id) == 92  # reserved like an upload
        done = await poll_job(app.client, f"/api/bulk/{job['job_id']}", customer.headers)
        assert done["status"] == "completed", done
        # Rows, like the job's counts: Bob is on two rows.
        assert done["transitions"] == {"valid->invalid": 2, "invalid->valid": 1}
        assert (done["valid_count"], done["invalid_count"]) == (2, 2)
        assert total_balance(app.store, customer.account_id) == 92
        download = await app.client.get(
            f"/api/bulk/{job['job_id']}/download", headers=customer.headers
        )
        assert download.status_code == 200
        rows = list(csv.reader(io.StringIO(download.text)))
        assert rows[0] == [
            "id",
            "Name",
            "Email",
            "Safe to Send",
            "previous_status",
            "status_changed",
        ]
        assert [r[3:] for r in rows[1:]] == [
            ["Yes", "valid", "No"],
            ["No", "valid", "Yes"],
            ["Yes", "invalid", "Yes"],
            ["No", "", ""],
            ["No", "valid", "Yes"],
        ]
        # The original columns come back as uploaded.
        assert [r[:3] for r in rows] == list(csv.reader(io.StringIO(LIST)))
        details = await app.client.get(
            f"/api/bulk/{job['job_id']}/download?include=details", headers=customer.headers
        )
        detail_rows = list(csv.reader(io.StringIO(details.text)))
        assert detail_rows[0][3:] == [
            "Safe to Send", "Status", "Sub Status", "Reason", "Score", "Did You Mean",
            "previous_status", "status_changed",
        ]  # fmt: skip
        changes = await app.client.get(
            f"/api/bulk/{job['job_id']}/changes", headers=customer.headers
        )
        assert changes.status_code == 200 and changes.headers["content-type"].startswith("text/csv")
        report = list(csv.DictReader(io.StringIO(changes.text)))
        assert [(r["row"], r["email"], r["previous_status"], r["status"]) for r in report] == [
            ("2", "bob@acme.test", "valid", "invalid"),
            ("3", "carl@acme.test", "invalid", "valid"),
            ("5", "bob@acme.test", "valid", "invalid"),
        ]
        # The upload is not a re-verification: no changes to report.
        plain = await app.client.get(
            f"/api/bulk/{first['job_id']}/changes", headers=customer.headers
        )
        assert "not a re-verification" in assert_error_body(plain, 409)
        # Re-verifying the re-verification compares with it; the list's history has both.
        again = await app.client.post(
            f"/api/bulk/{job['job_id']}/reverify", headers=customer.headers
        )
        assert again.status_code == 200, again.text
        last = await poll_job(app.client, f"/api/bulk/{again.json()['job_id']}", customer.headers)
        assert last["reverify_of"] == job["job_id"] and last["transitions"] == {}
        history = await app.client.get(
            f"/api/bulk/{first['job_id']}/reverifications", headers=customer.headers
        )
        assert history.status_code == 200
        assert [(h["job_id"], h["previous_job_id"], h["status"]) for h in history.json()] == [
            (last["job_id"], job["job_id"], "completed"),
            (job["job_id"], first["job_id"], "completed"),
        ]
        assert history.json()[1]["transitions"] == {"valid->invalid": 2, "invalid->valid": 1}


async def test_reverify_refuses_other_accounts_unfinished_jobs_and_short_balances(settings):
    async with running_app(settings) as app:
        owner = app.customer(credits=8)
        other = app.customer(credits=100)
        first = await _completed_list(app, owner)
        url = f"/api/bulk/{first['job_id']}/reverify"
        for path in (url, f"/api/bulk/{first['job_id']}/reverifications"):
            response = await app.client.request(
                "POST" if path == url else "GET", path, headers=other.headers
            )
            assert_error_body(response, 404)
        schedule = await app.client.put(
            f"/api/bulk/{first['job_id']}/reverify-schedule",
            headers=other.headers,
            json={"every_days": 7},
        )
        assert_error_body(schedule, 404)
        assert total_balance(app.store, other.account_id) == 100
        # An unfinished job (its run not started) is a 409 that says why.
        pending = job_store.create_job(app.store.engine, owner.account_id, "bulk_csv", 1, reserve=1)
        assert pending is not None
        busy = await app.client.post(f"/api/bulk/{pending.id}/reverify", headers=owner.headers)
        assert "pending" in assert_error_body(busy, 409)
        # 8 - 4 - 1: three credits left, the list needs four.
        short = await app.client.post(url, headers=owner.headers)
        detail = assert_error_body(short, 402)
        assert "needs 4" in detail and "balance is 3" in detail
        assert total_balance(app.store, owner.account_id) == 3
        assert len(job_store.list_jobs(app.store.engine, owner.account_id)) == 2


async def test_reverify_posts_the_transitions_to_the_webhook(world, settings):
    with Receiver() as receiver:
        async with running_app(settings) as app:
            customer = app.customer()
            first = await _completed_list(app, customer)
            world.replace_world(_world({"alice"}))
            created = await app.client.post(
                f"/api/bulk/{first['job_id']}/reverify",
                headers=customer.headers,
                json={"webhook_url": receiver.url},
            )
            assert created.status_code == 200, created.text
            secret = created.json()["webhook_secret"]
            await _wait_for(lambda: receiver.requests, "the webhook")
        headers, body = receiver.requests[0]
        payload = json.loads(body)
        assert payload["job_id"] == created.json()["job_id"]
        assert payload["reverify_of"] == first["job_id"]
        assert payload["status"] == "completed"
        assert payload["transitions"] == {"valid->invalid": 2}
        assert headers["X-Verimail-Signature"] == sign(
            secret, int(headers["X-Verimail-Timestamp"]), body
        )


async def _wait_for(predicate, what: str, timeout: float = 60.0) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        await asyncio.sleep(0.05)


async def _flow_runs(list_job: int, since: datetime) -> list:
    """The list's re-verification runs in Prefect made since ``since`` (the session's
    Prefect server also holds earlier tests' lists of the same id)."""
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.filters import FlowRunFilter, FlowRunFilterTags

    async with get_client() as client:
        runs = await client.read_flow_runs(
            flow_run_filter=FlowRunFilter(tags=FlowRunFilterTags(all_=[f"list:{list_job}"]))
        )
    return [run for run in runs if run.created is not None and run.created >= since]


async def _settled_runs(list_job: int, since: datetime) -> list:
    """The list's runs once none is on its way (each planned, or ended): the history shows
    a run's job before the run itself has ended in Prefect."""
    deadline = time.monotonic() + PATIENCE
    while True:
        runs = await _flow_runs(list_job, since)
        if all(run.state.is_scheduled() or run.state.is_final() for run in runs):
            return runs
        assert time.monotonic() < deadline, [run.state for run in runs]
        await asyncio.sleep(0.1)


async def test_a_schedule_fires_as_a_prefect_run_charged_to_the_owner(world, settings):
    started = datetime.now(UTC)
    with Receiver() as receiver:
        async with running_app(settings) as app:
            customer = app.customer(credits=100)
            first = await _completed_list(app, customer, webhook_url=receiver.url)
            list_id = first["job_id"]
            world.replace_world(_world({"alice", "carl"}))
            soon = datetime.now(UTC) + timedelta(seconds=1)
            put = await app.client.put(
                f"/api/bulk/{list_id}/reverify-schedule",
                headers=customer.headers,
                json={"every_days": 7, "first_run_at": soon.isoformat()},
            )
            assert put.status_code == 200, put.text
            assert put.json()["every_days"] == 7
            # Planned in Prefect: one Scheduled run at that time, named for owner and list.
            (planned,) = await _flow_runs(list_id, started)
            assert planned.state.is_scheduled()
            assert planned.name == f"reverify list {list_id} of account {customer.account_id}"
            history_url = f"/api/bulk/{list_id}/reverifications"

            async def history() -> list:
                response = await app.client.get(history_url, headers=customer.headers)
                return response.json()

            deadline = time.monotonic() + PATIENCE
            while not ((h := await history()) and h[0]["status"] == "completed"):
                assert time.monotonic() < deadline, f"the scheduled run did not complete: {h}"
                await asyncio.sleep(0.1)
            (entry,) = h
            assert entry["scheduled"] and entry["previous_job_id"] == list_id
            assert entry["transitions"] == {"valid->invalid": 2, "invalid->valid": 1}
            assert total_balance(app.store, customer.account_id) == 92  # the owner paid
            # The run that fired is the planned one, completed; the next is planned a week on.
            await _wait_for(lambda: len(receiver.requests) == 2, "the run's webhook")
            runs = {run.id: run for run in await _settled_runs(list_id, started)}
            assert runs[planned.id].state.is_completed(), runs[planned.id].state
            (upcoming,) = [run for run in runs.values() if run.state.is_scheduled()]
            assert upcoming.name == planned.name
            first_run = datetime.fromisoformat(put.json()["next_run_at"])
            assert upcoming.expected_start_time == first_run + timedelta(days=7)
            schedule = await app.client.get(
                f"/api/bulk/{entry['job_id']}/reverify-schedule", headers=customer.headers
            )
            assert schedule.json()["list_job_id"] == list_id
            listed = await app.client.get("/api/reverify-schedules", headers=customer.headers)
            assert [s["list_job_id"] for s in listed.json()] == [list_id]
            # Cancelled: the planned run with it, the history stays.
            gone = await app.client.delete(
                f"/api/bulk/{list_id}/reverify-schedule", headers=customer.headers
            )
            assert gone.status_code == 204
            runs = {run.id: run for run in await _flow_runs(list_id, started)}
            assert runs[upcoming.id].state.is_cancelled()
            assert len(await history()) == 1
        # The list's webhook heard of the scheduled run, with its transitions.
        payload = json.loads(receiver.requests[1][1])
        assert payload["job_id"] == entry["job_id"] and payload["reverify_of"] == list_id
        assert payload["transitions"] == {"valid->invalid": 2, "invalid->valid": 1}


async def test_a_scheduled_run_the_balance_cannot_cover_is_skipped_with_its_reason(settings):
    started = datetime.now(UTC)
    async with running_app(settings) as app:
        customer = app.customer(credits=6)
        first = await _completed_list(app, customer)
        list_id = first["job_id"]
        put = await app.client.put(
            f"/api/bulk/{list_id}/reverify-schedule",
            headers=customer.headers,
            json={"every_days": 30, "first_run_at": datetime.now(UTC).isoformat()},
        )
        assert put.status_code == 200, put.text
        deadline = time.monotonic() + PATIENCE
        while not (
            h := (
                await app.client.get(
                    f"/api/bulk/{list_id}/reverifications", headers=customer.headers
                )
            ).json()
        ):
            assert time.monotonic() < deadline, "the scheduled run did not happen"
            await asyncio.sleep(0.1)
        (entry,) = h
        assert entry["status"] == "skipped" and entry["job_id"] is None
        assert "needs 4" in entry["skipped_reason"] and "balance is 2" in entry["skipped_reason"]
        assert total_balance(app.store, customer.account_id) == 2
        assert len(job_store.list_jobs(app.store.engine, customer.account_id)) == 1
        # The schedule goes on: its next run is planned 30 days on.
        runs = await _settled_runs(list_id, started)
        assert sorted(r.state.type.value for r in runs) == ["COMPLETED", "SCHEDULED"]
        schedule = await app.client.get(
            f"/api/bulk/{list_id}/reverify-schedule", headers=customer.headers
        )
        next_run = datetime.fromisoformat(schedule.json()["next_run_at"])
        assert next_run - datetime.now(UTC) > timedelta(days=29)


async def test_the_dashboard_job_page_reverifies_schedules_and_shows_the_history(world, settings):
    from test_dashboard import browser, csrf_of, logged_in, make_user

    from verimail.store.accounts import create_api_key

    async with running_app(settings) as app:
        owner = make_user(app, "owner@example.test")
        key, _info = create_api_key(app.store.engine, owner.id, name="test")
        make_user(app, "other@example.test")
        first = await _completed_list(app, Customer(owner.id, key))
        page_url = f"/dashboard/jobs/{first['job_id']}"
        async with browser(app) as web, browser(app) as stranger:
            await logged_in(web, "owner@example.test")
            await logged_in(stranger, "other@example.test")
            page = await web.get(page_url)
            assert "Not scheduled." in page.text and "not re-verified yet" in page.text
            world.replace_world(_world({"alice", "carl"}))
            token = csrf_of(page.text)
            # Another account can neither re-verify nor schedule the list (404 pages).
            for path in ("reverify", "reverify-schedule"):
                refused = await stranger.post(
                    f"{page_url}/{path}",
                    data={"csrf_token": csrf_of((await stranger.get("/dashboard/jobs")).text),
                          "every_days": "7"},
                )  # fmt: skip
                assert refused.status_code == 404
            now = await web.post(f"{page_url}/reverify", data={"csrf_token": token})
            assert now.status_code == 303
            new_url = now.headers["location"]
            new_id = int(new_url.rsplit("/", 1)[1])
            await poll_job(app.client, f"/api/bulk/{new_id}", {"Authorization": f"Bearer {key}"})
            new_page = (await web.get(new_url)).text
            assert f're-verifies <a href="/dashboard/jobs/{first["job_id"]}">' in new_page
            assert "valid → invalid: 2" in new_page and "invalid → valid: 1" in new_page
            report = await web.get(f"{new_url}/changes")
            assert report.status_code == 200
            emails = [r["email"] for r in csv.DictReader(io.StringIO(report.text))]
            assert emails == ["bob@acme.test", "carl@acme.test", "bob@acme.test"]
            assert (await stranger.get(f"{new_url}/changes")).status_code == 404
            # The list's history, on the page of any of its runs.
            history = (await web.get(page_url)).text
            assert f'href="/dashboard/jobs/{new_id}/changes"' in history
            assert "on request" in history and "valid → invalid: 2" in history
            # Schedule, change, cancel.
            saved = await web.post(
                f"{page_url}/reverify-schedule", data={"csrf_token": token, "every_days": "14"}
            )
            assert saved.status_code == 303
            assert "Every 14 days" in (await web.get(new_url)).text
            bad = await web.post(
                f"{page_url}/reverify-schedule", data={"csrf_token": token, "every_days": "0"}
            )
            assert bad.status_code == 422 and "1 to 365" in bad.text
            cancelled = await web.post(
                f"{page_url}/reverify-schedule/cancel", data={"csrf_token": token}
            )
            assert cancelled.status_code == 303
            assert "Not scheduled." in (await web.get(page_url)).text


async def test_a_planned_run_cancelled_in_prefect_does_not_end_the_schedule(settings):
    """Cancelling (or deleting) the planned run in the Prefect UI skips that date: the
    schedule plans its next one and the history says why, instead of going silent. (The
    run is cancelled while it waits: its date is a few seconds off.)"""
    from prefect.client.orchestration import get_client
    from prefect.states import Cancelled

    from verimail.runners.sweep import LOST_RUN

    started = datetime.now(UTC)
    async with running_app(settings) as app:
        customer = app.customer()
        first = await _completed_list(app, customer)
        list_id = first["job_id"]
        put = await app.client.put(
            f"/api/bulk/{list_id}/reverify-schedule",
            headers=customer.headers,
            json={
                "every_days": 3,
                "first_run_at": (datetime.now(UTC) + timedelta(seconds=8)).isoformat(),
            },
        )
        assert put.status_code == 200, put.text
        (planned,) = await _flow_runs(list_id, started)
        async with get_client() as client:
            await client.set_flow_run_state(planned.id, Cancelled(), force=True)
        url = f"/api/bulk/{list_id}/reverifications"
        deadline = time.monotonic() + PATIENCE
        while not (h := (await app.client.get(url, headers=customer.headers)).json()):
            assert time.monotonic() < deadline, "the lost run was not noticed"
            await asyncio.sleep(0.1)
        assert [(e["status"], e["skipped_reason"]) for e in h] == [("skipped", LOST_RUN)]
        runs = await _settled_runs(list_id, started)
        assert sorted(r.state.type.value for r in runs) == ["CANCELLED", "SCHEDULED"]
        first_run = datetime.fromisoformat(put.json()["next_run_at"])
        (upcoming,) = [r for r in runs if r.state.is_scheduled()]
        assert upcoming.expected_start_time == first_run + timedelta(days=3)
        assert total_balance(app.store, customer.account_id) == 96


@pytest.mark.parametrize(
    ("first_run_at", "says"),
    [
        (0, "not a number"),  # (Pydantic read these three as Unix times: epoch 0 ran at once)
        (1e12, "not a number"),
        ("0", "not a number"),
        ("1700000000", "not a number"),
        ("2030-01-01T09:00:00", "timezone"),  # a zone is part of an RFC 3339 date-time
        ("past", "is in the past"),
    ],
)
async def test_first_run_at_is_a_date_time_with_its_zone_and_to_come(settings, first_run_at, says):
    """Issue 35: ``first_run_at`` was read leniently; a past time made a run (and charged)
    at once. Now only a date-time text with a zone, not more than a minute in the past."""
    if first_run_at == "past":
        first_run_at = (datetime.now(UTC) - timedelta(minutes=5)).isoformat()
    async with running_app(settings) as app:
        customer = app.customer(credits=6)
        response = await app.client.put(
            "/api/bulk/1/reverify-schedule",
            headers=customer.headers,
            json={"every_days": 7, "first_run_at": first_run_at},
        )
        detail = assert_error_body(response, 422)
        assert "first_run_at" in detail and says in detail, detail
        assert total_balance(app.store, customer.account_id) == 6


@pytest.mark.parametrize("every_days", [True, "7", 7.5, "seven"])
async def test_every_days_is_a_json_integer(settings, every_days):
    """Issue 47: `true` and `"7"` were read as 1 and 7 days."""
    async with running_app(settings) as app:
        customer = app.customer(credits=6)
        response = await app.client.put(
            "/api/bulk/1/reverify-schedule",
            headers=customer.headers,
            json={"every_days": every_days},
        )
        assert "every_days" in assert_error_body(response, 422)


def _documented_body() -> str:
    """The body of the documented `curl -X PUT …/reverify-schedule`, as the shell makes it."""
    import re
    import subprocess
    from pathlib import Path

    doc = (Path(__file__).parent.parent / "docs" / "reverification.md").read_text()
    (argument,) = re.findall(r'reverify-schedule .*?\n.*?\n\s+-d ("[^\n]+")\n```', doc, re.S)
    made = subprocess.run(
        ["bash", "-c", f"printf %s {argument}"], capture_output=True, text=True, check=True
    )
    return made.stdout


async def test_the_schemas_and_the_docs_examples_are_accepted(settings):
    """Issue 47: the schema's example `first_run_at` (2030-01-01) was refused as more than a
    year ahead, and the docs' (2026-12-01) had passed. Each is sent for a list that does not
    exist: the body's checks come first, so 404 (not 422) says the example passed them."""
    async with running_app(settings) as app:
        customer = app.customer(credits=6)
        spec = (await app.client.get("/openapi.json")).json()
        schema = spec["components"]["schemas"]["ScheduleRequest"]
        example = schema["properties"]["first_run_at"]["examples"][0]
        bodies = [
            json.dumps({"every_days": 30, "first_run_at": example}),
            *(json.dumps(body) for body in schema.get("examples", [])),
            _documented_body(),
        ]
        for body in bodies:
            response = await app.client.put(
                "/api/bulk/999999/reverify-schedule",
                headers={**customer.headers, "Content-Type": "application/json"},
                content=body,
            )
            assert response.status_code == 404, (body, response.text)


class _SilentServer:
    """A TCP server on loopback that takes connections and never answers: a Prefect API
    that hangs."""

    def __init__(self) -> None:
        import socket
        import threading

        self.sock = socket.create_server(("127.0.0.1", 0))
        self.url = f"http://127.0.0.1:{self.sock.getsockname()[1]}/api"
        self.conns: list = []
        self.thread = threading.Thread(target=self._accept, daemon=True)
        self.thread.start()

    def _accept(self) -> None:
        with contextlib.suppress(OSError):
            while True:
                self.conns.append(self.sock.accept()[0])

    def close(self) -> None:
        self.sock.close()
        for conn in self.conns:
            conn.close()
        self.thread.join(timeout=10)


async def test_a_schedule_write_does_not_wait_on_a_scheduler_that_hangs(settings):
    """Issue 47: `PUT …/reverify-schedule` waited as long as Prefect took (13.7 s behind the
    start of the embedded server; a Prefect API that hangs held it for the client's whole
    time-out). Now it answers 503 with Retry-After, nothing changed, and the next try,
    Prefect answering again, makes the schedule."""
    from prefect.settings import (
        PREFECT_API_REQUEST_TIMEOUT,
        PREFECT_API_URL,
        PREFECT_CLIENT_MAX_RETRIES,
        temporary_settings,
    )

    async with running_app(settings) as app:
        customer = app.customer(credits=100)
        list_id = (await _completed_list(app, customer))["job_id"]
        url = f"/api/bulk/{list_id}/reverify-schedule"
        silent = _SilentServer()
        try:
            hanging = {
                PREFECT_API_URL: silent.url,
                PREFECT_API_REQUEST_TIMEOUT: 600,
                PREFECT_CLIENT_MAX_RETRIES: 0,
            }
            with temporary_settings(updates=hanging):
                # (a generous deadline; before, the answer waited for the 600 s time-out)
                refused = await asyncio.wait_for(
                    app.client.put(url, headers=customer.headers, json={"every_days": 7}), 120
                )
        finally:
            silent.close()
        assert "scheduler" in assert_error_body(refused, 503)
        assert int(refused.headers["retry-after"]) >= 1
        assert (await app.client.get(url, headers=customer.headers)).status_code == 404
        made = await app.client.put(url, headers=customer.headers, json={"every_days": 7})
        assert made.status_code == 200, made.text
