"""Bulk jobs over real HTTP: upload → poll → download on the local runner, against the
testbed; JSON bulk; every error status of endpoints 3, 4, 5, 11, 12."""

from __future__ import annotations

import csv
import io
import json

import pytest
from api_helpers import api_world, assert_error_body, poll_job, running_app, total_balance

from verimail.store import jobs as job_store

pytestmark = pytest.mark.usefixtures("prefect_harness")


@pytest.fixture
def settings(testbed_factory, testbed_settings, tmp_path):
    tb = testbed_factory(api_world())
    return testbed_settings(tb, tmp_path, upload_max_bytes=200_000, upload_max_rows=1000)


def _upload(content: bytes | str, name: str = "list.csv", **fields: str) -> dict:
    data = content.encode("utf-8") if isinstance(content, str) else content
    return {"files": {"file": (name, data, "text/csv")}, "data": fields}


ORIGINAL = (
    "id,Name,Email Address,Comment\r\n"
    '1,"Smith, Alice",alice@acme.test,"quoted ""comma"", fine"\r\n'
    "2,Bøb Ünïcode,bob@acme.test,\r\n"
    "3,Nobody,nobody@acme.test,gone\r\n"
    "4,Catch,someone@catchall.test,\r\n"
    "5,Empty,,no address\r\n"
    "6,Dup,alice@acme.test,again\r\n"
)


async def test_the_request_that_creates_a_job_hands_it_to_the_local_runner(
    testbed_factory, testbed_settings, tmp_path
):
    """A job starts when its request submits it to the local runner's pool (issue 33.2),
    not at a later sweep: the reaper here sweeps at start-up and then every 15 minutes, yet
    each job is the runner's (queued or running) or past ``pending`` as its POST returns,
    and completes."""
    tb = testbed_factory(api_world())
    settings = testbed_settings(tb, tmp_path, job_stale_after=3600.0)
    async with running_app(settings) as app:
        runner = app.app.state.runner
        customer = app.customer(credits=100)
        for path, request in (
            ("/api/bulk", _upload(ORIGINAL)),
            ("/api/verify/bulk", {"json": {"emails": ["alice@acme.test", "bob@acme.test"]}}),
        ):
            created = await app.client.post(path, headers=customer.headers, **request)
            assert created.status_code == 200, created.text
            job_id = created.json()["job_id"]
            job = job_store.get_job_any(app.store.engine, job_id)
            assert job is not None
            assert job_id in runner.held_jobs() or job.status != "pending", job
            done = await poll_job(app.client, f"{path}/{job_id}", customer.headers)
            assert done["status"] == "completed", done


async def test_upload_poll_download(settings):
    async with running_app(settings) as app:
        customer = app.customer(credits=100)
        response = await app.client.post("/api/bulk", headers=customer.headers, **_upload(ORIGINAL))
        assert response.status_code == 200, response.text
        job = response.json()
        assert job["status"] in ("pending", "processing")
        assert job["total_emails"] == 5  # rows with an address
        assert total_balance(app.store, customer.account_id) == 95  # reserved at creation
        done = await poll_job(app.client, f"/api/bulk/{job['job_id']}", customer.headers)
        assert done["status"] == "completed", done
        assert done["processed_emails"] == 5 and done["percent_complete"] == 100.0
        assert (done["valid_count"], done["invalid_count"], done["catch_all_count"]) == (3, 1, 1)
        assert done["credits_refunded"] == 0 and done["completed_at"]
        download = await app.client.get(
            f"/api/bulk/{job['job_id']}/download", headers=customer.headers
        )
        assert download.status_code == 200
        assert download.headers["content-type"].startswith("text/csv")
        text = download.content.decode("utf-8")
        rows = list(csv.reader(io.StringIO(text)))
        assert rows[0] == ["id", "Name", "Email Address", "Comment", "Safe to Send"]
        assert [r[-1] for r in rows[1:]] == ["Yes", "Yes", "No", "No", "No", "Yes"]
        # Byte for byte: removing the appended cell gives back each original line.
        original_lines = ORIGINAL.split("\r\n")
        for got, want in zip(text.split("\r\n"), original_lines, strict=True):
            if want:
                assert got.rsplit(",", 1)[0] == want
        # Range is ignored: the whole file with 200, never a 206/416 outside the contract.
        for wanted in ("bytes=0-3", "bytes=999999-", "items=0-1", "bytes=zzz"):
            ranged = await app.client.get(
                f"/api/bulk/{job['job_id']}/download",
                headers={**customer.headers, "Range": wanted},
            )
            assert ranged.status_code == 200, (wanted, ranged.status_code)
            assert ranged.content == download.content
            assert ranged.headers["accept-ranges"] == "none"
        details = await app.client.get(
            f"/api/bulk/{job['job_id']}/download?include=details", headers=customer.headers
        )
        detail_rows = list(csv.reader(io.StringIO(details.content.decode("utf-8"))))
        assert detail_rows[0][-6:] == [
            "Safe to Send",
            "Status",
            "Sub Status",
            "Reason",
            "Score",
            "Did You Mean",
        ]
        assert detail_rows[3][-5:-3] == ["invalid", "mailbox_not_found"]
        # The row without an address has no status: the file's tallies are the job's.
        assert detail_rows[5][-5:-2] == ["", "", "The cell holds no address."]
        statuses = [row[-5] for row in detail_rows[1:]]
        assert statuses.count("invalid") == done["invalid_count"]
        assert statuses.count("valid") == done["valid_count"]
        parquet = await app.client.get(
            f"/api/bulk/{job['job_id']}/download?format=parquet", headers=customer.headers
        )
        assert parquet.status_code == 200 and parquet.content[:4] == b"PAR1"
        assert total_balance(app.store, customer.account_id) == 95


@pytest.mark.parametrize(
    ("encoding", "charset"),
    [
        ("utf-8", "utf-8"),
        ("cp1252", "windows-1252"),
        ("utf-16", "utf-16"),
        ("utf-16-be", "utf-16be"),
    ],
)
async def test_a_download_is_labelled_with_the_uploads_charset(settings, encoding, charset):
    """The results file keeps the upload's encoding, so its label must say it: a client that
    decodes by the header read a Windows-1252 or UTF-16 file labelled utf-8 as garbage."""
    text = "name,email\r\nJosé Ünal,alice@acme.test\r\nBjörn,nobody@acme.test\r\n"
    async with running_app(settings) as app:
        customer = app.customer()
        files = {"file": ("list.csv", text.encode(encoding), "text/csv")}  # (utf-16: a BOM)
        created = await app.client.post("/api/bulk", headers=customer.headers, files=files)
        assert created.status_code == 200, created.text
        url = f"/api/bulk/{created.json()['job_id']}"
        assert (await poll_job(app.client, url, customer.headers))["status"] == "completed"
        for query in ("", "?include=details", "?neutralise_formulas=true"):
            download = await app.client.get(f"{url}/download{query}", headers=customer.headers)
            assert download.headers["content-type"] == f"text/csv; charset={charset}"
            lines = download.text.lstrip("\ufeff").split("\r\n")
            assert lines[0].startswith("name,email,Safe to Send") and lines[1].startswith(
                "José Ünal,"
            )


@pytest.mark.parametrize(
    "header",
    [
        "email",
        "Email",
        "Email Address",
        "emails",
        "work_email",
        "business_email",
        " CONTACT_EMAIL ",
    ],
)
async def test_each_recognised_header(settings, header):
    async with running_app(settings) as app:
        customer = app.customer()
        content = f"name,{header}\nA,alice@acme.test\nB,nobody@acme.test\n"
        response = await app.client.post("/api/bulk", headers=customer.headers, **_upload(content))
        assert response.status_code == 200, response.text
        done = await poll_job(
            app.client, f"/api/bulk/{response.json()['job_id']}", customer.headers
        )
        assert (done["valid_count"], done["invalid_count"]) == (1, 1)


async def test_headerless_file_and_column_override(settings):
    async with running_app(settings) as app:
        customer = app.customer()
        headerless = await app.client.post(
            "/api/bulk", headers=customer.headers, **_upload("alice@acme.test\nbob@acme.test\n")
        )
        assert headerless.status_code == 200, headerless.text
        done = await poll_job(
            app.client, f"/api/bulk/{headerless.json()['job_id']}", customer.headers
        )
        assert done["valid_count"] == 2
        download = await app.client.get(
            f"/api/bulk/{done['job_id']}/download", headers=customer.headers
        )
        assert download.text == "alice@acme.test,Yes\nbob@acme.test,Yes\n"
        override = await app.client.post(
            "/api/bulk",
            headers=customer.headers,
            **_upload("who,where\nalice@acme.test,x\n", email_column="who"),
        )
        assert override.status_code == 200, override.text
        wrong = await app.client.post(
            "/api/bulk",
            headers=customer.headers,
            **_upload("who,where\nalice@acme.test,x\n", email_column="nope"),
        )
        assert "nope" in assert_error_body(wrong, 422)


async def test_download_before_completion_is_409_and_foreign_job_404(settings):
    async with running_app(settings) as app:
        owner, other = app.customer(), app.customer()
        slow = "email\n" + "".join(f"sam{i}@slow.test\n" for i in range(3))
        created = await app.client.post("/api/bulk", headers=owner.headers, **_upload(slow))
        job_id = created.json()["job_id"]
        early = await app.client.get(f"/api/bulk/{job_id}/download", headers=owner.headers)
        assert "download it once" in assert_error_body(early, 409)
        for url in (f"/api/bulk/{job_id}", f"/api/bulk/{job_id}/download"):
            assert_error_body(await app.client.get(url, headers=other.headers), 404)
        assert_error_body(await app.client.get("/api/bulk/999999", headers=owner.headers), 404)
        assert_error_body(await app.client.get(f"/api/bulk/{job_id}"), 401)
        done = await poll_job(app.client, f"/api/bulk/{job_id}", owner.headers)
        assert done["status"] == "completed"


async def test_refusals_store_and_charge_nothing(settings):
    async with running_app(settings) as app:
        poor = app.customer(credits=2)
        three = "email\na@acme.test\nb@acme.test\nc@acme.test\n"
        short = await app.client.post("/api/bulk", headers=poor.headers, **_upload(three))
        assert "needs 3" in assert_error_body(short, 402)
        assert total_balance(app.store, poor.account_id) == 2
        too_big = await app.client.post(
            "/api/bulk", headers=poor.headers, **_upload("email\n" + "x@acme.test\n" * 30_000)
        )
        assert_error_body(too_big, 413)
        too_many_rows = await app.client.post(
            "/api/bulk", headers=poor.headers, **_upload("email\n" + "a@acme.test\n" * 1001)
        )
        assert_error_body(too_many_rows, 413)
        for bad, why in [
            (b"", "empty"),
            (b"name,phone\nann,123\n", "email column"),
            (b"\x89PNG\r\n\x1a\n\x00\x00\x00\rIHDR" + bytes(range(256)), "PNG image"),
            (b"email\n\x00\x01\x02\x03junk\x00" * 50, "binary"),
            (b"email\n\n", ""),
        ]:
            response = await app.client.post("/api/bulk", headers=poor.headers, **_upload(bad))
            assert why.lower() in assert_error_body(response, 422).lower()
        no_file = await app.client.post("/api/bulk", headers=poor.headers, data={"x": "1"})
        assert_error_body(no_file, 422)
        assert total_balance(app.store, poor.account_id) == 2
        uploads = settings.data_dir / "uploads"
        assert not uploads.exists() or not any(uploads.rglob("*.csv"))


async def test_json_bulk_create_poll_results(settings):
    async with running_app(settings) as app:
        customer = app.customer()
        emails = ["alice@acme.test", "nobody@acme.test", "bob@acme.test", "alice@acme.test"]
        created = await app.client.post(
            "/api/verify/bulk", headers=customer.headers, json={"emails": emails}
        )
        assert created.status_code == 200, created.text
        body = created.json()
        assert body["status"] == "pending" and body["total_emails"] == 4
        done = await poll_job(app.client, f"/api/verify/bulk/{body['job_id']}", customer.headers)
        assert done["status"] == "completed"
        assert (done["processed_emails"], done["unique_emails"]) == (4, 3)
        page = await app.client.get(
            f"/api/verify/bulk/{body['job_id']}?offset=1&limit=2", headers=customer.headers
        )
        results = page.json()["results"]
        assert [r["email"] for r in results] == ["nobody@acme.test", "bob@acme.test"]
        assert [r["status"] for r in results] == ["invalid", "valid"]
        assert page.json()["next_offset"] == 3
        far = f"/api/verify/bulk/{body['job_id']}?offset="
        beyond = await app.client.get(far + str(2**31 - 1), headers=customer.headers)
        assert (beyond.json()["results"], beyond.json()["next_offset"]) == ([], None)
        huge = await app.client.get(far + str(2**63), headers=customer.headers)  # was a 500
        assert "offset" in assert_error_body(huge, 422)
        too_many = await app.client.post(
            "/api/verify/bulk", headers=customer.headers, json={"emails": ["a@b.test"] * 10_001}
        )
        assert_error_body(too_many, 422)
        empty = await app.client.post(
            "/api/verify/bulk", headers=customer.headers, json={"emails": []}
        )
        assert_error_body(empty, 422)
        assert total_balance(app.store, customer.account_id) == 96


async def test_a_json_list_comes_back_whole_and_in_order(settings):
    """The list is verified as sent, each entry one address: an entry without "@" first in
    the list is a result (not taken for a header), and entries holding ";" or "," are not
    split into fields. Every entry is charged and comes back, in order."""
    emails = [
        "not-an-address",
        "alice@acme.test;bob@acme.test",
        "nobody@acme.test",
        "bob@acme.test, carl@acme.test",
        "bob@acme.test",
    ]
    async with running_app(settings) as app:
        customer = app.customer(credits=10)
        created = await app.client.post(
            "/api/verify/bulk", headers=customer.headers, json={"emails": emails}
        )
        assert created.status_code == 200, created.text
        url = f"/api/verify/bulk/{created.json()['job_id']}"
        done = await poll_job(app.client, url, customer.headers)
        assert (done["status"], done["processed_emails"], done["credits_refunded"]) == (
            "completed",
            5,
            0,
        )
        assert [r["email"] for r in done["results"]] == emails
        assert [r["status"] for r in done["results"]] == [
            "invalid",
            "invalid",
            "invalid",
            "invalid",
            "valid",
        ]
        assert done["results"][1]["sub_status"] == "invalid_syntax"
        assert done["next_offset"] is None
        assert total_balance(app.store, customer.account_id) == 5
        one = await app.client.post(
            "/api/verify/bulk", headers=customer.headers, json={"emails": ["bob.acme.test"]}
        )
        alone = await poll_job(
            app.client, f"/api/verify/bulk/{one.json()['job_id']}", customer.headers
        )
        assert alone["status"] == "completed", alone["failed_reason"]
        assert [(r["email"], r["status"]) for r in alone["results"]] == [
            ("bob.acme.test", "invalid")
        ]


async def test_a_json_entry_with_a_control_character_is_a_422_and_costs_nothing(settings):
    """The stored list is read back as a CSV: a CR in an entry made two rows of one reserved
    credit (five verifications for one credit), and a NUL failed the job after its
    reservation, whose refund then turned a day's allowance into prepaid credits."""
    async with running_app(settings) as app:
        customer = app.customer(credits=10)
        for entries, where, what in [
            (["ok@acme.test", "a@acme.test\rb@acme.test\rc@acme.test"], "emails[1]", "U+000D"),
            (["a@acme.test\nb@acme.test"], "emails[0]", "line feed"),
            (["ok@acme.test", "ok@acme.test", "user0@acme.test\x00"], "emails[2]", "U+0000"),
            (["a@acme.test\tb"], "emails[0]", "U+0009"),
            (["a\x85b@acme.test"], "emails[0]", "U+0085"),
            (["a\ud800@acme.test"], "emails[0]", "unicode string"),  # (pydantic's own check)
        ]:
            response = await app.client.post(
                "/api/verify/bulk",
                headers={**customer.headers, "Content-Type": "application/json"},
                content=json.dumps({"emails": entries}),  # (escapes the lone surrogate)
            )
            detail = assert_error_body(response, 422)
            assert where in detail and what in detail, detail
        assert total_balance(app.store, customer.account_id) == 10
        assert job_store.list_jobs(app.store.engine, customer.account_id) == []
        # Unicode that is not a control character is verified as sent.
        created = await app.client.post(
            "/api/verify/bulk",
            headers=customer.headers,
            json={"emails": ["bob@acme.test\r", "b\u2028ob@acme.test", "\talice@acme.test\r\n"]},
        )
        assert created.status_code == 200, created.text
        done = await poll_job(
            app.client, f"/api/verify/bulk/{created.json()['job_id']}", customer.headers
        )
        assert [(r["email"], r["status"]) for r in done["results"]] == [
            ("bob@acme.test", "valid"),
            ("b\u2028ob@acme.test", "invalid"),
            ("alice@acme.test", "valid"),  # (line breaks and tabs around it are trimmed)
        ]
        charged = (done["credits_reserved"], done["credits_refunded"])
        assert (*charged, total_balance(app.store, customer.account_id)) == (3, 0, 7)


async def test_a_csv_job_pages_its_address_rows_on_the_json_endpoint(settings):
    """A CSV job polled on GET /api/verify/bulk/{id}: its records are its rows that hold an
    address (a blank cell has no result), and next_offset leads to every one of them."""
    upload = b"name,email\nA,alice@acme.test\nB,\nC,bob@acme.test\nD,nobody@acme.test\n"
    async with running_app(settings) as app:
        customer = app.customer()
        created = await app.client.post(
            "/api/bulk", headers=customer.headers, files={"file": ("l.csv", upload, "text/csv")}
        )
        job_id = created.json()["job_id"]
        await poll_job(app.client, f"/api/bulk/{job_id}", customer.headers)
        offset, seen = 0, []
        while offset is not None:
            page = await app.client.get(
                f"/api/verify/bulk/{job_id}?offset={offset}&limit=2", headers=customer.headers
            )
            seen += [(r["email"], r["status"]) for r in page.json()["results"]]
            offset = page.json()["next_offset"]
        assert seen == [
            ("alice@acme.test", "valid"),
            ("bob@acme.test", "valid"),
            ("nobody@acme.test", "invalid"),
        ]


@pytest.mark.parametrize(
    ("upload", "safe"),
    [
        (  # a header used twice: the run must not take the first "email" for it
            b"id,email,name,email\n"
            b"1,nobody@acme.test,Alice,alice@acme.test\n"
            b"2,nobody@acme.test,Bob,bob@acme.test\n",
            ["Yes", "Yes"],
        ),
        (  # a blank header: the run took it for no column given and detected the first
            b"primary,\nalice@acme.test,nobody@acme.test\nbob@acme.test,nobody@acme.test\n",
            ["No", "No"],
        ),
    ],
    ids=["repeated-header", "blank-header"],
)
async def test_a_column_chosen_by_number_is_the_one_verified(settings, upload, safe):
    """email_column names the last column by number: the job verifies that column, though
    the run reads the file again and resolves the column anew."""
    column = "4" if upload.startswith(b"id") else "2"
    async with running_app(settings) as app:
        customer = app.customer()
        created = await app.client.post(
            "/api/bulk",
            headers=customer.headers,
            files={"file": ("list.csv", upload, "text/csv")},
            data={"email_column": column},
        )
        assert created.status_code == 200, created.text
        url = f"/api/bulk/{created.json()['job_id']}"
        done = await poll_job(app.client, url, customer.headers)
        valid = safe.count("Yes")
        assert (done["status"], done["valid_count"], done["invalid_count"]) == (
            "completed",
            valid,
            2 - valid,
        )
        assert done["processed_emails"] == done["credits_reserved"] == 2
        download = await app.client.get(f"{url}/download", headers=customer.headers)
        rows = list(csv.reader(io.StringIO(download.text)))
        assert [row[-1] for row in rows] == ["Safe to Send", *safe]


async def test_an_upload_is_not_left_behind_when_the_job_row_cannot_be_written(
    settings, monkeypatch
):
    """A database error while creating the job (a header too long for its column once did
    this on PostgreSQL) answered 5xx and left the upload on disk."""
    from sqlalchemy.exc import OperationalError

    def broken(*args, **kwargs):
        raise OperationalError("INSERT INTO jobs", {}, Exception("the database went away"))

    async with running_app(settings) as app:
        customer = app.customer(credits=50)
        monkeypatch.setattr(job_store, "create_job", broken)
        for path, body in [
            ("/api/bulk", _upload("email\nalice@acme.test\n")),
            ("/api/verify/bulk", {"json": {"emails": ["alice@acme.test"]}}),
            ("/api/find-email/csv", _upload("first_name,last_name,domain\nAl,Smith,acme.test\n")),
        ]:
            response = await app.client.post(path, headers=customer.headers, **body)
            assert response.status_code >= 500, (path, response.text)
            uploads = settings.data_dir / "uploads"
            assert not uploads.exists() or not any(uploads.iterdir()), (
                path,
                list(uploads.iterdir()),
            )
        assert total_balance(app.store, customer.account_id) == 50


async def test_a_file_part_without_a_filename_is_the_file(settings):
    """`curl -F "file=<list.csv"` sends the part without a filename: it was refused with
    "No file: send the CSV in a form part named `file`" (or, past 4 KB, "the form field
    `file` is too long"), though a part named `file` was sent."""
    rows = "".join(f"{i},alice@acme.test\n" for i in range(400))  # (over 4 KB)
    async with running_app(settings) as app:
        customer = app.customer(credits=500)
        for content in ("email\nalice@acme.test\n", "id,email\n" + rows):
            body = (
                f'--b\r\nContent-Disposition: form-data; name="file"\r\n\r\n{content}\r\n--b--\r\n'
            )
            created = await app.client.post(
                "/api/bulk",
                headers={**customer.headers, "Content-Type": "multipart/form-data; boundary=b"},
                content=body.encode(),
            )
            assert created.status_code == 200, created.text
            assert created.json()["total_emails"] == content.count("@")


class _BrokenRunner:
    """A runner that cannot start anything (a Prefect server or work pool that is down)."""

    def submit(self, kind: str, job_id: int, attempt: int | None = None, **_: object) -> None:
        raise RuntimeError("no work pool")

    def shutdown(self) -> None:
        return None


async def test_a_job_that_cannot_be_started_is_503_and_costs_nothing(settings, monkeypatch):
    from verimail.api import app as app_module
    from verimail.store import jobs as job_store

    monkeypatch.setattr(app_module, "make_runner", lambda _settings: _BrokenRunner())
    async with running_app(settings) as app:
        customer = app.customer(credits=50)
        attempts = [
            ("/api/bulk", _upload("email\nalice@acme.test\nbob@acme.test\n")),
            ("/api/verify/bulk", {"json": {"emails": ["alice@acme.test"]}}),
            (
                "/api/find-email/csv",
                _upload("first_name,last_name,domain\nAlice,Smith,acme.test\n"),
            ),
        ]
        for path, body in attempts:
            response = await app.client.post(path, headers=customer.headers, **body)
            assert "could not be started" in assert_error_body(response, 503), path
            assert response.headers["retry-after"].isdigit()
        assert total_balance(app.store, customer.account_id) == 50  # reservations refunded
        jobs = job_store.list_jobs(app.store.engine, customer.account_id)
        assert len(jobs) == 3 and {j.status for j in jobs} == {"failed"}  # none left pending


def test_percent_complete_reaches_100_only_when_every_address_is_done():
    """Rounded down: 19,999 of 20,000 (or 999,999 of a million) was shown as 100.0 while
    the job was still processing."""
    from verimail.schemas.jobs import percent_complete

    assert percent_complete(19_999, 20_000, completed=False) == 99.99
    assert percent_complete(999_999, 1_000_000, completed=False) == 99.99
    assert percent_complete(1, 3, completed=False) == 33.33
    assert percent_complete(20_000, 20_000, completed=False) == 100.0
    assert percent_complete(3, 20_000, completed=True) == 100.0  # (completed with refunds)
