"""Email Finder CSV jobs over real HTTP against the testbed: found / not found / catch-all,
charging per find, running out of credits, 402/403/404/409/422."""

from __future__ import annotations

import asyncio
import csv
import io
from typing import Any

import pytest
from api_helpers import STALE_AFTER, assert_error_body, poll_job, running_app, total_balance
from hardening_helpers import take_for_dead
from sqlalchemy import update

from verimail.config import using_settings
from verimail.files.csv_io import finder_result_names
from verimail.flows import finder as finder_module
from verimail.flows.finder import find_emails
from verimail.store.accounts import set_finder
from verimail.store.billing.ledger import ledger
from verimail.store.billing.movements import charge_once
from verimail.store.db import utcnow
from verimail.store.jobs import get_job_by_public_id, mark_completed
from verimail.store.tables import jobs
from verimail.testbed.world import DomainSpec, HostBehaviour, HostSpec, World

pytestmark = pytest.mark.usefixtures("prefect_harness")


STAFF = ("ann.lee", "bob.stone", "carla.diaz", "dan.wu", "eve.ng", "finn.roe")


def _world() -> World:
    return World.of(
        [
            HostSpec("mx.acme.test", HostBehaviour(mailboxes={"john.smith", "jdoe", "info"})),
            HostSpec("mx.beta.test", HostBehaviour(mailboxes={"ann"})),
            HostSpec("mx.catchall.test", HostBehaviour(accept_all=True)),
            HostSpec("mx.staff.test", HostBehaviour(mailboxes=set(STAFF))),
        ],
        [
            DomainSpec("acme.test", mx=[(10, "mx.acme.test")]),
            DomainSpec("beta.test", mx=[(10, "mx.beta.test")]),
            DomainSpec("catchall.test", mx=[(10, "mx.catchall.test")]),
            DomainSpec("staff.test", mx=[(10, "mx.staff.test")]),
        ],
    )


PEOPLE = (
    "First Name,Last Name,Company Website,email\r\n"
    "John,Smith,https://www.acme.test/about,old@x.test\r\n"
    "Jane,Doe,acme.test,\r\n"
    "Nobody,Here,acme.test,\r\n"
    "Cat,Chall,catchall.test,\r\n"
    ",NoFirst,acme.test,\r\n"
)


@pytest.fixture
def tb(testbed_factory):
    return testbed_factory(_world())


@pytest.fixture
def settings(tb, testbed_settings, tmp_path):
    return testbed_settings(tb, tmp_path, finder_charge=10)


def _form(text: str, **fields: str) -> dict:
    return {"files": {"file": ("people.csv", text.encode(), "text/csv")}, "data": fields}


async def test_finder_csv_end_to_end(settings):
    async with running_app(settings) as app:
        customer = app.customer(credits=100)
        created = await app.client.post(
            "/api/find-email/csv",
            headers=customer.headers,
            **_form(PEOPLE, domain_column="Company Website"),
        )
        assert created.status_code == 200, created.text
        job = created.json()
        assert isinstance(job["job_id"], str) and job["job_id"].startswith("fj_")
        assert job["status"] == "pending" and job["total_rows"] == 5
        url = f"/api/find-email/csv/{job['job_id']}"
        done = await poll_job(app.client, url, customer.headers)
        assert done["status"] == "completed", done
        assert (done["found_count"], done["not_found_count"], done["catch_all_count"]) == (2, 1, 1)
        assert done["invalid_input_count"] == 1 and done["credits_used"] == 20
        assert total_balance(app.store, customer.account_id) == 80
        charges = [e for e in ledger(app.store.engine, customer.account_id) if e.kind == "charge"]
        assert sorted(e.delta for e in charges) == [-10, -10]
        download = await app.client.get(f"{url}/download", headers=customer.headers)
        rows = list(csv.reader(io.StringIO(download.content.decode())))
        assert rows[0] == [
            "First Name", "Last Name", "Company Website", "email",
            "finder_email", "finder_status", "finder_confidence",
        ]  # fmt: skip
        assert rows[1][4:6] == ["john.smith@acme.test", "found"]
        assert rows[2][4:6] == ["jdoe@acme.test", "found"]
        assert rows[3][4:6] == ["", "not_found"]
        assert rows[4][5] == "catch_all" and rows[4][4].endswith("@catchall.test")
        assert rows[5][5] == "invalid_input"
        assert rows[1][:4] == ["John", "Smith", "https://www.acme.test/about", "old@x.test"]
        assert download.headers["content-type"] == "text/csv; charset=utf-8"
        latin = await app.client.post(
            "/api/find-email/csv",
            headers=customer.headers,
            files={"file": ("p.csv", "first,last,domain\nJosé,Núñez,acme.test\n".encode("cp1252"))},
        )
        assert latin.status_code == 200, latin.text
        latin_url = f"/api/find-email/csv/{latin.json()['job_id']}"
        await poll_job(app.client, latin_url, customer.headers)
        latin_file = await app.client.get(f"{latin_url}/download", headers=customer.headers)
        assert latin_file.headers["content-type"] == "text/csv; charset=windows-1252"
        assert latin_file.text.splitlines()[1].startswith("José,Núñez,acme.test,")
    # (the rows a run saved for a Ctrl-C are in the results now: not kept beside them)
    assert not list(settings.data_dir.glob("jobs/*/finder-rows*"))


async def test_a_row_and_the_single_lookup_read_a_domain_alike(settings):
    """The CSV job reduced domains by its own rules: a full-width or ideographic dot was
    invalid_input in a row but found by POST /api/find-email, and an address in the domain
    cell was found in a row but a 422 there. Both now follow the single lookup's rules."""
    cells = ["acme\u3002test", "ACME\uff0eTEST", "https://WWW.acme.test:443/x", "john@acme.test"]
    people = "first,last,domain\n" + "".join(f"John,Smith,{c}\n" for c in cells)
    async with running_app(settings) as app:
        customer = app.customer(credits=200)
        singles = []
        for cell in cells:
            one = await app.client.post(
                "/api/find-email",
                headers=customer.headers,
                json={"first_name": "John", "last_name": "Smith", "domain": cell},
            )
            singles.append(one.json()["status"] if one.status_code == 200 else "invalid_input")
        assert singles == ["found", "found", "found", "invalid_input"]
        created = await app.client.post(
            "/api/find-email/csv", headers=customer.headers, **_form(people)
        )
        assert created.status_code == 200, created.text
        url = f"/api/find-email/csv/{created.json()['job_id']}"
        assert (await poll_job(app.client, url, customer.headers))["status"] == "completed"
        download = await app.client.get(f"{url}/download", headers=customer.headers)
        rows = list(csv.reader(io.StringIO(download.content.decode())))
        assert [row[4] for row in rows[1:]] == singles


async def test_one_session_per_domain_across_rows(settings, tb):
    """Six people at one company, the domain spelled three ways, plus three at a catch-all:
    one SMTP session and one catch-all probe per domain, however many rows."""
    spellings = ("staff.test", "https://www.staff.test/team", "STAFF.TEST")
    people = "first_name,last_name,domain\n" + "".join(
        f"{first},{last},{spellings[i % 3]}\n"
        for i, (first, last) in enumerate(name.split(".") for name in STAFF)
    )
    people += "".join(f"{first},Smith,catchall.test\n" for first in ("Al", "Bo", "Cy"))
    async with running_app(settings) as app:
        customer = app.customer(credits=100)
        created = await app.client.post(
            "/api/find-email/csv", headers=customer.headers, **_form(people)
        )
        assert created.status_code == 200, created.text
        done = await poll_job(
            app.client, f"/api/find-email/csv/{created.json()['job_id']}", customer.headers
        )
    assert (done["found_count"], done["catch_all_count"]) == (6, 3), done
    staff = tb.host_stats("mx.staff.test")
    assert (staff.sessions, staff.mail_from) == (1, 1)
    assert len(staff.rcpts) == 1 + len(STAFF)  # one probe, then each person's first pattern
    catch_all = tb.host_stats("mx.catchall.test")
    assert catch_all.sessions == 1 and len(catch_all.rcpts) == 1


async def test_running_out_of_credits_skips_the_rest(settings):
    async with running_app(settings) as app:
        customer = app.customer(credits=10)  # pays for exactly one find
        people = "first_name,last_name,domain\nJohn,Smith,acme.test\nAnn,X,beta.test\n"
        created = await app.client.post(
            "/api/find-email/csv", headers=customer.headers, **_form(people)
        )
        done = await poll_job(
            app.client, f"/api/find-email/csv/{created.json()['job_id']}", customer.headers
        )
        assert done["found_count"] == 1 and done["skipped_no_credits_count"] == 1
        assert done["credits_used"] == 10
        assert total_balance(app.store, customer.account_id) == 0


async def _completed_job(app, customer) -> tuple[str, Any]:
    """A finder job of PEOPLE run to the end: its poll URL and its row."""
    created = await app.client.post(
        "/api/find-email/csv",
        headers=customer.headers,
        **_form(PEOPLE, domain_column="Company Website"),
    )
    url = f"/api/find-email/csv/{created.json()['job_id']}"
    first = await poll_job(app.client, url, customer.headers)
    assert first["status"] == "completed" and first["credits_used"] == 20
    job = get_job_by_public_id(app.store.engine, customer.account_id, first["job_id"])
    assert job is not None
    await asyncio.to_thread(app.app.state.runner.wait, 60)  # its thread is done too
    return url, job


async def _resume_after_death(app, settings, job) -> dict[str, Any]:
    """Put the job back as a run that died after its charges, before it could mark the job
    completed, and run it again as recovery does."""
    with app.store.engine.begin() as conn:
        conn.execute(
            update(jobs)
            .where(jobs.c.id == job.id)
            .values(
                status="processing",
                completed_at=None,
                credits_used=0,
                heartbeat_at=utcnow(),
                flow_run_id=None,  # (else the reaper sees that run finished and fails it)
            )
        )
    with using_settings(settings):
        return await find_emails(job.id)


async def test_a_resumed_run_does_not_charge_a_find_twice(settings):
    """A finder job charges each find as it goes. When its runner dies after paying for
    finds, recovery starts the job again from the first row: the finds already paid for must
    not be charged a second time, and the job must report what the account really paid."""
    async with running_app(settings) as app:
        customer = app.customer(credits=100)
        url, job = await _completed_job(app, customer)
        again = await _resume_after_death(app, settings, job)
        assert again["status"] == "completed" and again["found_count"] == 2
        done = await poll_job(app.client, url, customer.headers)
        assert done["credits_used"] == 20
        assert total_balance(app.store, customer.account_id) == 80
        charges = [e for e in ledger(app.store.engine, customer.account_id) if e.kind == "charge"]
        assert sorted(e.delta for e in charges) == [-10, -10]


async def test_a_resumed_run_refunds_a_find_it_no_longer_makes(settings):
    """An earlier run paid for finds on rows 3 and 4 (Nobody Here, Cat Chall) and died; the
    resumed run finds neither (no such mailbox; a catch-all domain). A find is charged only
    when one is reported, so both charges come back — once, however often the job resumes —
    and a later find of the same row would be charged again."""
    async with running_app(settings) as app:
        customer = app.customer(credits=100)
        url, job = await _completed_job(app, customer)
        references = [f"job:{job.id}:row:{row}" for row in (2, 3)]
        for reference in references:  # what the earlier run paid, as it would have
            paid = charge_once(app.store.engine, job.account_id, 10, reference=reference)
            assert paid == "charged"
        assert total_balance(app.store, customer.account_id) == 60
        for _ in range(2):
            again = await _resume_after_death(app, settings, job)
            assert (again["found_count"], again["credits"]) == (2, 20)
            assert total_balance(app.store, customer.account_id) == 80
        done = await poll_job(app.client, url, customer.headers)
        assert done["credits_used"] == 20
        refunds = [e for e in ledger(app.store.engine, customer.account_id) if e.kind == "refund"]
        assert sorted(e.reference for e in refunds) == references
        assert all(e.delta == 10 for e in refunds)
        paid = charge_once(app.store.engine, job.account_id, 10, reference=references[0])
        assert paid == "charged"


async def test_finder_csv_errors(settings):
    async with running_app(settings) as app:
        customer, other = app.customer(credits=100), app.customer(credits=100)
        poor = app.customer(credits=5)
        people = "first_name,last_name,domain\nJohn,Smith,acme.test\n"
        short = await app.client.post("/api/find-email/csv", headers=poor.headers, **_form(people))
        assert_error_body(short, 402)
        missing = await app.client.post(
            "/api/find-email/csv", headers=customer.headers, **_form("name,company\nJ,acme\n")
        )
        detail = assert_error_body(missing, 422)
        assert "first" in detail.lower() and "last" in detail.lower()
        created = await app.client.post(
            "/api/find-email/csv", headers=customer.headers, **_form(people)
        )
        job_id = created.json()["job_id"]
        for url in (f"/api/find-email/csv/{job_id}", f"/api/find-email/csv/{job_id}/download"):
            assert_error_body(await app.client.get(url, headers=other.headers), 404)
        assert_error_body(
            await app.client.get("/api/find-email/csv/fj_unknown", headers=customer.headers), 404
        )
        await poll_job(app.client, f"/api/find-email/csv/{job_id}", customer.headers)
        set_finder(app.store.engine, customer.account_id, False)
        off = await app.client.post(
            "/api/find-email/csv", headers=customer.headers, **_form(people)
        )
        assert_error_body(off, 403)
        assert_error_body(await app.client.post("/api/find-email/csv", **_form(people)), 401)


async def test_download_before_done_is_409(settings, testbed_factory, testbed_settings, tmp_path):
    slow = World.of(
        [HostSpec("mx.slow.test", HostBehaviour(mailboxes={"zed"}, reply_delay=0.3))],
        [DomainSpec("slow.test", mx=[(10, "mx.slow.test")])],
    )
    tb = testbed_factory(slow)
    async with running_app(testbed_settings(tb, tmp_path / "slow")) as app:
        customer = app.customer(credits=100)
        people = "first_name,last_name,domain\nZed,Zulu,slow.test\n"
        created = await app.client.post(
            "/api/find-email/csv", headers=customer.headers, **_form(people)
        )
        job_id = created.json()["job_id"]
        early = await app.client.get(
            f"/api/find-email/csv/{job_id}/download", headers=customer.headers
        )
        assert "once its status is completed" in assert_error_body(early, 409)
        await poll_job(app.client, f"/api/find-email/csv/{job_id}", customer.headers)


def _slow_world(testbed_factory, host: str, delay: float):
    """A testbed where STAFF's mailboxes live on ``host`` (domain: the host without "mx."),
    which answers every command after ``delay`` seconds."""
    return testbed_factory(
        World.of(
            [HostSpec(host, HostBehaviour(mailboxes=set(STAFF), reply_delay=delay))],
            [DomainSpec(host.removeprefix("mx."), mx=[(10, host)])],
        )
    )


async def _taken_for_dead_while_probing(app, customer, tb, host: str) -> tuple[str, Any]:
    """Start a finder job for STAFF on ``host``'s domain and, once its first session is
    open, do what recovery does to a run it takes for dead (the job becomes run 2's)."""
    domain = host.removeprefix("mx.")
    people = "first_name,last_name,domain\n" + "".join(
        f"{first},{last},{domain}\n" for first, last in (name.split(".") for name in STAFF)
    )
    created = await app.client.post(
        "/api/find-email/csv", headers=customer.headers, **_form(people)
    )
    assert created.status_code == 200, created.text
    public = created.json()["job_id"]
    assert await asyncio.to_thread(tb.wait_until, lambda t: t.host_stats(host).active >= 1)
    job = get_job_by_public_id(app.store.engine, customer.account_id, public)
    assert job is not None and take_for_dead(app.store, job.id) == 2
    return public, job


async def test_a_finder_run_taken_for_dead_stops_and_a_later_run_finishes(
    testbed_factory, testbed_settings, tmp_path
):
    """Recovery takes a live finder run for dead (here: claims the job as run 2 while run 1
    works). Run 1's heartbeat sees that and it stops; the job goes stale and the reaper
    resumes it as run 3, which finishes it — and each find is paid for once."""
    slow = "mx.slow.test"
    tb = _slow_world(testbed_factory, slow, 0.1)
    settings = testbed_settings(
        tb, tmp_path, finder_charge=10, job_stale_after=STALE_AFTER, job_max_attempts=5
    )
    async with running_app(settings) as app:
        customer = app.customer(credits=100)
        public, _ = await _taken_for_dead_while_probing(app, customer, tb, slow)
        done = await poll_job(app.client, f"/api/find-email/csv/{public}", customer.headers)
        final = get_job_by_public_id(app.store.engine, customer.account_id, public)
    assert done["status"] == "completed" and done["found_count"] == len(STAFF), (
        done,
        final.failed_reason,
    )
    assert final.attempt == 3  # run 1 stopped; the reaper's run finished the job
    assert done["credits_used"] == 10 * len(STAFF)
    assert total_balance(app.store, customer.account_id) == 100 - 10 * len(STAFF)
    charges = [e for e in ledger(app.store.engine, customer.account_id) if e.kind == "charge"]
    assert len(charges) == len(STAFF)


async def test_a_finder_run_that_wakes_after_a_later_run_finished_pays_and_writes_nothing(
    testbed_factory, testbed_settings, tmp_path
):
    """Run 1 is frozen (no beat of its own comes: job_stale_after is long) while recovery
    resumes the job as run 2, which completes it. Run 1 then wakes and goes on finding: it
    must charge no find (the check that it still has the job is in the charge's own
    transaction) and write no results over run 2's."""
    slow = "mx.sleepy.test"
    tb = _slow_world(testbed_factory, slow, 0.05)
    settings = testbed_settings(tb, tmp_path, finder_charge=10, job_stale_after=120)
    async with running_app(settings) as app:
        customer = app.customer(credits=100)
        public, job = await _taken_for_dead_while_probing(app, customer, tb, slow)
        paid_by_run_1 = len(ledger(app.store.engine, customer.account_id))
        results = tmp_path / "run-2-results.csv"
        results.write_text("run 2's results\n")
        assert mark_completed(app.store.engine, job.id, {}, str(results), 6, attempt=2)
        await asyncio.to_thread(app.app.state.runner.wait, 60)  # run 1 has ended
        final = get_job_by_public_id(app.store.engine, customer.account_id, public)
        entries = ledger(app.store.engine, customer.account_id)
    assert final is not None and (final.status, final.attempt) == ("completed", 2)
    assert final.result_path == str(results) and results.read_text() == "run 2's results\n"
    assert len(entries) == paid_by_run_1  # no charge (nor refund) after the take-over
    assert len(tb.host_stats(slow).rcpts) >= 1  # it did go on probing once awake


async def test_a_finder_run_frozen_while_writing_cannot_replace_the_later_runs_file(
    testbed_factory, testbed_settings, tmp_path, monkeypatch
):
    """Run 1 has checked the job is its own and starts writing its results; frozen there,
    it is taken for dead and run 2 completes the job. Run 1's file, written once it wakes,
    is staged under a name of its own and never put in place: the job keeps run 2's."""
    tb = _slow_world(testbed_factory, "mx.icy.test", 0.0)
    settings = testbed_settings(tb, tmp_path, finder_charge=10, job_stale_after=120)
    run_2_results = tmp_path / "run-2-results.csv"
    real_write = finder_module.write_finder_results

    def frozen_while_writing(upload, info, out, outcomes):
        store = running["app"].store
        job_id = int(out.parent.name)  # (<data_dir>/jobs/<id>/.run-1.results.csv)
        assert take_for_dead(store, job_id) == 2
        run_2_results.write_text("run 2's results\n")
        assert mark_completed(store.engine, job_id, {}, str(run_2_results), 0, attempt=2)
        return real_write(upload, info, out, outcomes)

    monkeypatch.setattr(finder_module, "write_finder_results", frozen_while_writing)
    running: dict[str, Any] = {}
    people = "first_name,last_name,domain\n" + "".join(
        f"{first},{last},icy.test\n" for first, last in (name.split(".") for name in STAFF)
    )
    async with running_app(settings) as app:
        running["app"] = app
        customer = app.customer(credits=100)
        created = await app.client.post(
            "/api/find-email/csv", headers=customer.headers, **_form(people)
        )
        assert created.status_code == 200, created.text
        await asyncio.to_thread(app.app.state.runner.wait, 60)  # run 1 has ended
        public = created.json()["job_id"]
        final = get_job_by_public_id(app.store.engine, customer.account_id, public)
    assert final is not None and (final.status, final.attempt) == ("completed", 2)
    assert final.result_path == str(run_2_results)
    directory = settings.data_dir / "jobs" / str(final.id)
    assert not (directory / "results.csv").exists()  # run 1 never put its file in place
    assert not list(directory.glob(".run-*"))  # and removed it


async def test_a_finder_job_shows_rows_and_credits_as_they_go(
    testbed_factory, testbed_settings, tmp_path
):
    """Progress is written as rows finish (at most once a second), not only when a task's
    domains are all done: a poll of a slow job sees some rows done and paid for before the
    job completes."""
    slow = "mx.steady.test"
    tb = _slow_world(testbed_factory, slow, 0.1)
    settings = testbed_settings(tb, tmp_path, finder_charge=10)
    people = "first_name,last_name,domain\n" + "".join(
        f"{first},{last},steady.test\n" for first, last in (name.split(".") for name in STAFF)
    )
    async with running_app(settings) as app:
        customer = app.customer(credits=100)
        created = await app.client.post(
            "/api/find-email/csv", headers=customer.headers, **_form(people)
        )
        url = f"/api/find-email/csv/{created.json()['job_id']}"
        midway, deadline = [], asyncio.get_running_loop().time() + 120
        while True:
            assert asyncio.get_running_loop().time() < deadline, "the job did not finish"
            job = (await app.client.get(url, headers=customer.headers)).json()
            if job["status"] in ("completed", "failed"):
                break
            if job["processed_rows"]:
                midway.append((job["processed_rows"], job["credits_used"]))
            await asyncio.sleep(0.05)
    assert job["status"] == "completed" and job["processed_rows"] == len(STAFF)
    assert midway, "no progress was shown before the job completed"
    rows, credits = midway[0]
    assert 0 < rows < len(STAFF) and credits == 10 * rows


def test_result_columns_never_repeat_a_column_of_the_file():
    """The appended columns get a prefix until none of them is taken, so a results file
    never has two columns of one name."""
    assert finder_result_names(("name", "domain")) == ("email", "status", "confidence")
    assert finder_result_names(("Email ", "domain")) == (
        "finder_email",
        "finder_status",
        "finder_confidence",
    )
    assert finder_result_names(("email", "finder_email", "finder1_status")) == (
        "finder2_email",
        "finder2_status",
        "finder2_confidence",
    )
