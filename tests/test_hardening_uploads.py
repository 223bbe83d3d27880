"""Hostile uploads through the real app (``create_app`` with its lifespan, ASGI in-process):
bodies far over the limit, sent lazily with no Content-Length; multipart envelopes that
never end; a million columns; a 10 MB cell; NUL bytes; mixed encodings; archives; CSV
injection. Never a 500; a refusal charges nothing and leaves nothing in the uploads dir;
an accepted file is verified and given back byte for byte.
"""

from __future__ import annotations

import csv
import gzip
import io
import zipfile
from collections.abc import Callable
from pathlib import Path

import pytest
from api_helpers import api_world, assert_error_body, poll_job, running_app, total_balance
from hardening_helpers import LazyBody

from verimail.api.uploads import ENVELOPE_ALLOWANCE
from verimail.files.csv_detect import MAX_COLUMNS

LIMIT = 1024 * 1024  # upload_max_bytes of these tests
GIGABYTE = 1 << 30
CHUNK = 64 * 1024
BOUNDARY = "verimail-hardening-boundary"
CREDITS = 50


@pytest.fixture
def settings(testbed_factory, testbed_settings, tmp_path):
    tb = testbed_factory(api_world())
    return testbed_settings(tb, tmp_path, upload_max_bytes=LIMIT, upload_max_rows=1000)


def _multipart_headers(customer) -> dict[str, str]:
    return {**customer.headers, "Content-Type": f"multipart/form-data; boundary={BOUNDARY}"}


def _file_part_head(filename: str = "list.csv") -> bytes:
    return (
        f"--{BOUNDARY}\r\n"
        f'Content-Disposition: form-data; name="file"; filename="{filename}"\r\n'
        "Content-Type: text/csv\r\n\r\n"
    ).encode()


def _closing() -> bytes:
    return f"\r\n--{BOUNDARY}--\r\n".encode()


def _upload(data: bytes, name: str = "list.csv", **fields: str) -> dict:
    return {"files": {"file": (name, data, "text/csv")}, "data": fields}


def _assert_nothing_left(settings, app, customer) -> None:
    """A refused upload charged nothing and left no file or folder behind."""
    assert total_balance(app.store, customer.account_id) == CREDITS
    uploads = Path(settings.data_dir) / "uploads"
    leftovers = list(uploads.rglob("*")) if uploads.exists() else []
    assert leftovers == [], leftovers


# --- bodies over the limit: refused without reading the rest --------------------------------

# name -> (prefix, filler): what a 1 GB body starts with and is then made of
ENDLESS_BODIES: dict[str, tuple[bytes, bytes]] = {
    # An honest CSV that is simply too big.
    "file": (_file_part_head() + b"email\n", b"alice@acme.test\n"),
    # A part header that never ends (no CRLF): must not be gathered in memory.
    "part-header": (
        f'--{BOUNDARY}\r\nContent-Disposition: form-data; name="file"; filename="'.encode(),
        b"x",
    ),
    # A text field that never ends.
    "field": (f'--{BOUNDARY}\r\nContent-Disposition: form-data; name="x"\r\n\r\n'.encode(), b"y"),
    # A valid, small form, then an epilogue of junk after the closing boundary.
    "epilogue": (_file_part_head() + b"email\nalice@acme.test\n" + _closing(), b"junk "),
    # Junk before the first boundary, for ever.
    "preamble": (b"", b"preamble "),
}


@pytest.mark.parametrize("shape", list(ENDLESS_BODIES))
async def test_gigabyte_body_is_refused_at_the_limit(settings, shape: str):
    prefix, filler = ENDLESS_BODIES[shape]
    async with running_app(settings) as app:
        customer = app.customer(credits=CREDITS)
        body = LazyBody(GIGABYTE, prefix=prefix, filler=filler, chunk=CHUNK)
        response = await app.client.post(
            "/api/bulk", content=body, headers=_multipart_headers(customer)
        )
        assert response.request.headers.get("content-length") is None  # streamed, undeclared
        status = response.status_code
        assert status in (413, 422), response.text
        assert_error_body(response, status)
        # Reading stopped right after the limit: the rest of the gigabyte was never pulled.
        assert not body.exhausted
        assert body.sent <= LIMIT + ENVELOPE_ALLOWANCE + 2 * CHUNK, body.sent
        _assert_nothing_left(settings, app, customer)


async def test_declared_oversize_is_refused_before_reading(settings):
    async with running_app(settings) as app:
        customer = app.customer(credits=CREDITS)
        body = LazyBody(GIGABYTE, prefix=_file_part_head(), chunk=CHUNK)
        headers = {**_multipart_headers(customer), "Content-Length": str(GIGABYTE)}
        response = await app.client.post("/api/bulk", content=body, headers=headers)
        assert "larger than the limit" in assert_error_body(response, 413)
        assert body.sent <= CHUNK  # at most what the transport had already buffered
        _assert_nothing_left(settings, app, customer)


# --- hostile content: a clear answer, never a 500 --------------------------------------------


def _gzip_bomb() -> bytes:
    return gzip.compress(b"\0" * (64 * 1024 * 1024), compresslevel=9)  # 64 MB → ~64 KB


def _zip_bomb() -> bytes:
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w", zipfile.ZIP_DEFLATED) as archive:
        archive.writestr("list.csv", b"email\n" + b"a" * (64 * 1024 * 1024))
    return buffer.getvalue()


def _columns(n: int) -> bytes:
    header = "email," + ",".join(f"c{i}" for i in range(1, n))
    row = "alice@acme.test" + "," * (n - 1)
    return f"{header}\n{row}\n".encode()


# name -> (file maker, expected status, for 200 the rows charged / else words of the detail).
# Files are made when the test runs, not at collection. Compressed uploads are not accepted,
# so archives are refused unopened (no bomb can go off).
HOSTILE_FILES: dict[str, tuple[Callable[[], bytes], int, int | str]] = {
    "gzip-bomb": (_gzip_bomb, 422, "gzip"),
    "zip-bomb": (_zip_bomb, 422, "zip"),
    "mostly-nul": (lambda: b"email\n" + b"\0" * 50_000, 422, "binary"),
    "nul-in-every-line": (lambda: b"email\n" + b"a\0@acme.test\n" * 2000, 422, "binary"),
    "nul-in-a-cell": (
        lambda: b"email,note\nalice@acme.test,a\0b\nbob\0@acme.test,\n",
        422,
        "binary",
    ),
    # One quoted cell of 10 MB: refused as a field that runs on (not read into a frame).
    "ten-megabyte-cell": (
        lambda: b'email,note\r\nalice@acme.test,"' + b"x" * (10 * LIMIT) + b'"\r\n',
        422,
        "never to be closed",
    ),
    "utf16-no-bom-cut": (
        lambda: "email\nalice@acme.test\n".encode("utf-16-le") + b"\0",
        422,
        "UTF-16",
    ),
    # An unpaired surrogate (no UTF-8 can hold it): accepted and charged, then the job
    # failed; in the header, a 500. Now refused with where it is.
    "utf16-lone-surrogate-in-a-cell": (
        lambda: ("email\n" + "alice@acme.test\n" * 20 + "b\ud800b@acme.test\n").encode(
            "utf-16-be", "surrogatepass"
        ),
        422,
        "unpaired surrogate",
    ),
    "utf16-lone-surrogate-in-the-header": (
        lambda: "e\udc00mail\nalice@acme.test\n".encode("utf-16", "surrogatepass"),
        422,
        "unpaired surrogate",
    ),
    # The most columns accepted, and one row: verified like any file.
    "widest-accepted": (lambda: _columns(MAX_COLUMNS), 200, 1),
    # ~8 MB: a header of a million names and one row (issue 47: its memory stayed).
    "million-columns": (lambda: _columns(1_000_000), 413, f"at most {MAX_COLUMNS:,} columns"),
    # UTF-8 and Latin-1 in one file (two exports pasted together): read as Windows-1252,
    # and every original byte comes back.
    "mixed-encodings": (
        lambda: (
            "name,email\r\nJosé,alice@acme.test\r\n".encode()
            + "Zoë,bob@acme.test\r\n".encode("latin-1")
            + "Ünïcødé,nobody@acme.test\r\n".encode()
        ),
        200,
        3,
    ),
    # A quote that never closes before the end: the rest of the file would be one cell, the
    # rows after it lost without a word; refused, naming the line (issue 36).
    "quote-never-closed": (
        lambda: b'email\n"alice@acme.test\nbob@acme.test\n' + b"x" * 5000,
        422,
        "Line 2 could not be read",
    ),
}


@pytest.mark.usefixtures("prefect_harness")
@pytest.mark.parametrize("case", list(HOSTILE_FILES))
async def test_hostile_files(testbed_factory, testbed_settings, tmp_path, case: str):
    make, status, expected = HOSTILE_FILES[case]
    data = make()
    tb = testbed_factory(api_world())
    settings = testbed_settings(tb, tmp_path, upload_max_bytes=16 * LIMIT, upload_max_rows=1000)
    async with running_app(settings) as app:
        customer = app.customer(credits=CREDITS)
        response = await app.client.post("/api/bulk", headers=customer.headers, **_upload(data))
        if status != 200:
            detail = assert_error_body(response, status)
            assert str(expected).lower() in detail.lower()
            _assert_nothing_left(settings, app, customer)
            return
        assert response.status_code == 200, response.text
        job = response.json()
        assert job["total_emails"] == expected
        done = await poll_job(app.client, f"/api/bulk/{job['job_id']}", customer.headers)
        assert done["status"] == "completed", done
        assert total_balance(app.store, customer.account_id) == CREDITS - expected
        download = await app.client.get(
            f"/api/bulk/{job['job_id']}/download", headers=customer.headers
        )
        assert download.status_code == 200
        # Byte for byte: each original line comes back with one cell appended.
        got = download.content.split(b"\n")
        want = data.split(b"\n")
        assert len(got) == len(want)
        for line, original in zip(got, want, strict=True):
            assert line.startswith(original.rstrip(b"\r")), (line[:80], original[:80])


INJECTION = (
    "name,email,note\r\n"
    "=cmd|' /C calc'!A0,alice@acme.test,plain\r\n"
    '+SUM(1+1),bob@acme.test,=HYPERLINK("http://evil.test")\r\n'
    "-2+3,nobody@acme.test,@SUM(A1)\r\n"
    "@import,x@acme.test,\t=1+1\r\n"
    "plain,=1+1@acme.test,\r\n"
)
DANGEROUS = ("=", "+", "-", "@")


@pytest.mark.usefixtures("prefect_harness")
async def test_csv_injection_is_neutralised_on_request(settings):
    """``neutralise_formulas=true`` prefixes every cell a spreadsheet would run with ``'``,
    in the plain and the detailed download; without it the file comes back untouched."""
    async with running_app(settings) as app:
        customer = app.customer(credits=CREDITS)
        response = await app.client.post(
            "/api/bulk", headers=customer.headers, **_upload(INJECTION.encode())
        )
        assert response.status_code == 200, response.text
        job_id = response.json()["job_id"]
        done = await poll_job(app.client, f"/api/bulk/{job_id}", customer.headers)
        assert done["status"] == "completed", done
        url = f"/api/bulk/{job_id}/download"
        plain = await app.client.get(url, headers=customer.headers)
        assert plain.status_code == 200
        original_lines = INJECTION.split("\r\n")
        for got, want in zip(plain.text.split("\r\n"), original_lines, strict=True):
            if want:
                assert got.rsplit(",", 1)[0] == want  # untouched unless asked
        for query in ("?neutralise_formulas=true", "?neutralise_formulas=true&include=details"):
            safe = await app.client.get(url + query, headers=customer.headers)
            assert safe.status_code == 200, safe.text
            rows = list(csv.reader(io.StringIO(safe.content.decode("utf-8"))))
            assert len(rows) == 6
            for row in rows:
                for cell in row:
                    assert not cell.lstrip("\t\r ").startswith(DANGEROUS), (query, row)
            assert rows[1][0] == "'=cmd|' /C calc'!A0"
            assert rows[2][2] == '\'=HYPERLINK("http://evil.test")'


async def test_a_refused_wide_upload_leaves_no_parse_behind(settings):
    """Issue 35: the refusal's traceback, chained to the answer, held the reader's frames and
    with them the whole parse until a full garbage collection: with the collector off (as
    it is between its rare full passes), each refused upload of a wide header stayed in
    memory. Now nothing of it is left once the answer is out."""
    import gc
    import tracemalloc

    # ~0.7 MB, no rows: refused (413: over MAX_COLUMNS) once the header is read whole
    header = "email," + ",".join(f"c{i}" for i in range(1, 100_000))
    async with running_app(settings) as app:
        customer = app.customer(credits=5)
        upload = _upload(header.encode() + b"\n", "wide.csv")
        first = await app.client.post("/api/bulk", headers=customer.headers, **upload)
        assert_error_body(first, 413)  # (warm: the route and the reader have run once)
        gc.collect()
        gc.disable()
        tracemalloc.start()
        try:
            before = tracemalloc.get_traced_memory()[0]
            for _ in range(3):
                response = await app.client.post("/api/bulk", headers=customer.headers, **upload)
                assert_error_body(response, 413)
            kept = tracemalloc.get_traced_memory()[0] - before
        finally:
            tracemalloc.stop()
            gc.enable()
        assert kept < 2 * 1024 * 1024, f"{kept / 1e6:.1f} MB kept by three refused uploads"
