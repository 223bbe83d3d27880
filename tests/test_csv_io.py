"""CSV uploads: saving, sniffing, loading and the byte-for-byte results file."""

from __future__ import annotations

import codecs
import csv
import io
import random
import re
from collections.abc import AsyncIterator
from pathlib import Path

import polars as pl
import pytest

from verimail.files import csv_io
from verimail.files.csv_encoding import open_info
from verimail.files.csv_io import (
    CsvInfo,
    UploadError,
    UploadTooLarge,
    distinct_in_order,
    find_person_columns,
    inspect_csv,
    load_emails,
    load_person_rows,
    normalise_emails,
    save_upload,
    save_upload_sync,
    unique_emails,
    values_for_rows,
    write_finder_results,
    write_results_csv,
)
from verimail.files.csv_records import iter_raw_records, split_terminator

BOM8, BOM16LE, BOM16BE = codecs.BOM_UTF8, codecs.BOM_UTF16_LE, codecs.BOM_UTF16_BE
PNG = b"\x89PNG\r\n\x1a\n\x00\x00\x00\rIHDR\x00\x00\x00\x01\x00\x00\x00\x01\x08\x06\x00\x00\x00"


def _bytes(text: str, encoding: str = "utf-8", bom: bytes = b"") -> bytes:
    return bom + text.encode(encoding)


# name -> (file bytes, expected data rows, expected email cells in load order)
FIXTURES: dict[str, tuple[bytes, list[str | None]]] = {
    "lf": (b"name,email\nAnn,ann@x.org\nBob,bob@y.org\n", ["ann@x.org", "bob@y.org"]),
    "crlf": (b"name,email\r\nAnn,ann@x.org\r\nBob,bob@y.org\r\n", ["ann@x.org", "bob@y.org"]),
    "cr_only": (b"name,email\rAnn,ann@x.org\rBob,bob@y.org\r", ["ann@x.org", "bob@y.org"]),
    "mixed_endings": (b"email\r\na@x.org\nb@y.org\r\nc@z.org", ["a@x.org", "b@y.org", "c@z.org"]),
    "no_final_newline": (b"name,email\nAnn,ann@x.org\nBob,bob@y.org", ["ann@x.org", "bob@y.org"]),
    "utf8_bom": (_bytes("email,name\nann@x.org,Zoë\n", bom=BOM8), ["ann@x.org"]),
    "utf16le_bom": (
        _bytes("name,email\r\nJosé,jose@x.org\r\n李,li@例子.中国\r\n", "utf-16-le", BOM16LE),
        ["jose@x.org", "li@例子.中国"],
    ),
    "utf16be_bom": (
        _bytes("name;email\nJosé;jose@x.org\n", "utf-16-be", BOM16BE),
        ["jose@x.org"],
    ),
    "utf16le_no_bom": (_bytes("name,email\nAnn,ann@x.org\n", "utf-16-le"), ["ann@x.org"]),
    "latin1": (
        "name,email\nJosé,jose@x.org\nAnn,ann@x.org\n".encode("latin-1"),
        ["jose@x.org", "ann@x.org"],
    ),
    "latin1_not_cp1252": (b"name,email\nJ\x81rg\xe9,j@x.org\n", ["j@x.org"]),
    "cp1252": ("name,email\n“Bob” – €,bob@x.org\n".encode("cp1252"), ["bob@x.org"]),
    "semicolon": (
        b"name;email;amount\nAnn;ann@x.org;1,5\nBob;bob@y.org;2,25\n",
        ["ann@x.org", "bob@y.org"],
    ),
    "tab": (b"name\temail\nDoe, John\tjd@x.org\nRoe, Ann\tra@y.org\n", ["jd@x.org", "ra@y.org"]),
    "pipe": (b"name|email\nAnn|ann@x.org\n", ["ann@x.org"]),
    "quoted": (
        b'name,email,note\n"Doe, John","jd@x.org","said ""hi"", left"\n'
        b'Ann,ann@x.org,"two\nlines"\r\nBob,bob@y.org,"crlf\r\ninside, too"\r\n'
        b'"Eve","eve@z.org",""\n',
        ["jd@x.org", "ann@x.org", "bob@y.org", "eve@z.org"],
    ),
    "all_quoted_crlf": (
        b'"Name","Email"\r\n"Ann","ann@x.org"\r\n"Bob","bob@y.org"\r\n',
        ["ann@x.org", "bob@y.org"],
    ),
    "unicode": (
        "name,email\nZoë,zoë@exämple.org\n李,li@例子.中国\n😀 Smile,smile@x.org\n".encode(),
        ["zoë@exämple.org", "li@例子.中国", "smile@x.org"],
    ),
    "empty_cells": (
        b"name,email,phone\nAnn,,1\n,bob@y.org,\n,,\nCy, ,3\n",
        [None, "bob@y.org", None, None],
    ),
    "blank_lines": (
        b"\nemail\n\na@x.org\n   \n\r\nb@y.org\n\n\n",
        ["a@x.org", "b@y.org"],
    ),
    "headerless_single": (b"a@x.org\nb@y.org\nc@z.org\n", ["a@x.org", "b@y.org", "c@z.org"]),
    "headerless_single_crlf_no_final": (b"a@x.org\r\nb@y.org", ["a@x.org", "b@y.org"]),
    "headerless_multi": (b"Ann,ann@x.org\nBob,bob@y.org\n", ["ann@x.org", "bob@y.org"]),
    "malformed_quotes": (
        b'item,email\n5" screen,a@x.org\n"abc"def,b@y.org\n',
        ["a@x.org", "b@y.org"],
    ),
    "formula_cells": (
        b"name,email,note\n=1+2,a@x.org,-5\n@SUM(A1),b@y.org,+x\n",
        ["a@x.org", "b@y.org"],
    ),
}


def _write(tmp_path: Path, data: bytes, name: str = "in.csv") -> Path:
    path = tmp_path / name
    path.write_bytes(data)
    return path


def _inspect(tmp_path: Path, data: bytes, **kwargs: object) -> tuple[Path, CsvInfo]:
    path = _write(tmp_path, data)
    kwargs.setdefault("max_rows", 1000)
    return path, inspect_csv(path, **kwargs)  # type: ignore[arg-type]


def _decode(data: bytes, info: CsvInfo) -> str:
    bom = {"utf-8": BOM8, "utf-16-le": BOM16LE, "utf-16-be": BOM16BE}.get(info.encoding, b"")
    if info.has_bom:
        assert data.startswith(bom)
        data = data[len(bom) :]
    errors = "surrogatepass" if info.encoding.startswith("utf-16") else "strict"
    return data.decode(info.encoding, errors=errors)


def _encode(text: str, info: CsvInfo) -> bytes:
    bom = {"utf-8": BOM8, "utf-16-le": BOM16LE, "utf-16-be": BOM16BE}.get(info.encoding, b"")
    errors = "surrogatepass" if info.encoding.startswith("utf-16") else "strict"
    return (bom if info.has_bom else b"") + text.encode(info.encoding, errors=errors)


def _assert_round_trip(src: Path, info: CsvInfo, tmp_path: Path, *, pad: bool = True) -> bytes:
    """Append unique markers; stripping them must give the input bytes back, and each marker
    must sit on the row ``load_emails`` gave that index (checked with Python's csv reader)."""
    markers = [f"ZZR{i}ZZ" for i in range(info.row_count)]
    out = tmp_path / "out.csv"
    written = write_results_csv(src, info, out, {"ZZHZZ": markers}, pad_short_rows=pad)
    assert written == info.row_count
    produced = out.read_bytes()
    text = _decode(produced, info)
    pattern = re.escape(info.delimiter) + r"ZZ(R\d+|H)ZZ(?=\r\n|\n|\r|\Z)"
    found = re.findall(pattern, text)
    expected = (["H"] if info.has_header else []) + [f"R{i}" for i in range(info.row_count)]
    assert found == expected
    original = src.read_bytes()
    stripped = _encode(re.sub(pattern, "", text), info)
    if stripped != original:  # the one repair: a quote left open at the end gets closed
        body, terminator = split_terminator(_decode(original, info))
        assert stripped == _encode(body + '"' + terminator, info)

    emails = load_emails(src, info).get_column("email").to_list()
    assert len(emails) == info.row_count
    records = list(csv.reader(io.StringIO(text, newline=""), delimiter=info.delimiter))
    records = [r for r in records if r and not (len(r) == 1 and not r[0].strip())]
    if info.has_header:
        assert records.pop(0)[-1] == "ZZHZZ"
    assert len(records) == info.row_count
    assert info.email_index is not None
    for i, record in enumerate(records):
        assert record[-1] == markers[i]
        cell = record[info.email_index] if info.email_index < len(record) - 1 else ""
        assert (cell if cell.strip() else None) == emails[i]
    return produced


# --- sniffing and loading ---------------------------------------------------------------


@pytest.mark.parametrize("name", sorted(FIXTURES))
def test_fixture_loads_expected_emails(tmp_path: Path, name: str) -> None:
    data, expected = FIXTURES[name]
    path, info = _inspect(tmp_path, data)
    assert info.row_count == len(expected)
    assert info.email_count == sum(1 for e in expected if e)
    df = load_emails(path, info)
    assert df.columns == ["row", "email"]
    assert df.get_column("row").to_list() == list(range(len(expected)))
    assert [e.strip() if e else e for e in df.get_column("email").to_list()] == expected


@pytest.mark.parametrize("name", sorted(FIXTURES))
def test_fixture_round_trips_byte_for_byte(tmp_path: Path, name: str) -> None:
    path, info = _inspect(tmp_path, FIXTURES[name][0])
    _assert_round_trip(path, info, tmp_path)


@pytest.mark.parametrize(
    ("name", "encoding", "has_bom", "delimiter", "has_header", "terminator"),
    [
        ("lf", "utf-8", False, ",", True, "\n"),
        ("crlf", "utf-8", False, ",", True, "\r\n"),
        ("cr_only", "utf-8", False, ",", True, "\r"),
        ("utf8_bom", "utf-8", True, ",", True, "\n"),
        ("utf16le_bom", "utf-16-le", True, ",", True, "\r\n"),
        ("utf16be_bom", "utf-16-be", True, ";", True, "\n"),
        ("utf16le_no_bom", "utf-16-le", False, ",", True, "\n"),
        ("latin1", "cp1252", False, ",", True, "\n"),
        ("latin1_not_cp1252", "latin-1", False, ",", True, "\n"),
        ("semicolon", "utf-8", False, ";", True, "\n"),
        ("tab", "utf-8", False, "\t", True, "\n"),
        ("pipe", "utf-8", False, "|", True, "\n"),
        ("headerless_single", "utf-8", False, ",", False, "\n"),
        ("headerless_single_crlf_no_final", "utf-8", False, ",", False, "\r\n"),
    ],
)
def test_dialect_detection(
    tmp_path: Path,
    name: str,
    encoding: str,
    has_bom: bool,
    delimiter: str,
    has_header: bool,
    terminator: str,
) -> None:
    _, info = _inspect(tmp_path, FIXTURES[name][0])
    assert (info.encoding, info.has_bom, info.delimiter) == (encoding, has_bom, delimiter)
    assert (info.has_header, info.line_terminator) == (has_header, terminator)


def test_bom_is_not_part_of_the_first_header(tmp_path: Path) -> None:
    _, info = _inspect(tmp_path, FIXTURES["utf8_bom"][0])
    assert info.columns == ("email", "name")
    assert info.email_column == "email"


def test_latin1_names_are_decoded(tmp_path: Path) -> None:
    data = "first_name,last_name,domain\nJosé,Núñez,acme.com\n".encode("latin-1")
    path, info = _inspect(tmp_path, data, need_email=False)
    cols = find_person_columns(info)
    df = load_person_rows(path, info, cols.first_name, cols.last_name, cols.domain)
    assert df.row(0) == (0, "José", "Núñez", "acme.com")


@pytest.mark.parametrize(
    "header",
    [
        "email",
        "Email",
        "Email Address",
        "emails",
        "work_email",
        "business_email",
        "contact_email",
        "EMAIL",
        " Email ",
        "E-mail",
        "e-mail address",
        "email_address",
        "Work Email",
        "Business-Email",
        "CONTACT EMAIL",
        "E-Mail-Address",
    ],
)
def test_recognised_email_headers(tmp_path: Path, header: str) -> None:
    # The other columns hold addresses too, so only the header can have picked the column.
    data = f"name,{header},manager\nAnn,ann@x.org,boss@x.org\n".encode()
    _, info = _inspect(tmp_path, data)
    assert info.has_header
    assert (info.email_column, info.email_index) == (header, 1)


def test_preferred_header_wins_over_column_order(tmp_path: Path) -> None:
    data = b"work_email,email\nw@x.org,e@x.org\n"
    _, info = _inspect(tmp_path, data)
    assert info.email_column == "email"


def test_fallback_picks_the_column_that_holds_addresses(tmp_path: Path) -> None:
    data = b"name,Correo,phone\nAnn,ann@x.org,1\nBob,bob@y.org,2\nCy,not given,3\n"
    _, info = _inspect(tmp_path, data)
    assert (info.email_column, info.email_index, info.email_count) == ("Correo", 1, 3)


def test_no_email_column_names_the_columns(tmp_path: Path) -> None:
    with pytest.raises(UploadError) as err:
        _inspect(tmp_path, b"name,phone\nAnn,1\nBob,2\n")
    assert err.value.detail == (
        "No email column found; columns are: name, phone. Pass email_column to choose one."
    )


def test_headerless_single_column(tmp_path: Path) -> None:
    path, info = _inspect(tmp_path, b"john.doe@gmail\nb@y.org\n")
    assert not info.has_header
    assert info.columns == ("column_1",)
    assert info.email_column == "column_1"
    assert load_emails(path, info).get_column("email").to_list() == ["john.doe@gmail", "b@y.org"]
    out = tmp_path / "out.csv"
    write_results_csv(path, info, out, {"Safe to Send": ["No", "Yes"]})
    assert out.read_bytes() == b"john.doe@gmail,No\nb@y.org,Yes\n"


def test_a_header_that_mentions_an_at_sign_is_still_a_header(tmp_path: Path) -> None:
    """Only a cell that could be an address (an "@", no space) makes the first row data:
    "Email @ work" is a header, so it is neither charged nor verified."""
    path, info = _inspect(tmp_path, b"name,Email @ work\nAnn,ann@x.org\nBob,bob@y.org\n")
    assert info.has_header and info.email_column == "Email @ work"
    assert (info.row_count, info.email_count) == (2, 2)
    assert load_emails(path, info).get_column("email").to_list() == ["ann@x.org", "bob@y.org"]
    # A quoted local part may hold a space: that first row is an address, so no header.
    _, quoted = _inspect(tmp_path, b'"""ann lee""@x.org"\nbob@y.org\n')  # "ann lee"@x.org
    assert not quoted.has_header and quoted.row_count == 2


def test_header_row_gets_the_header_and_values_line_up(tmp_path: Path) -> None:
    path, info = _inspect(tmp_path, b"name,email\r\nAnn,ann@x.org\r\nBob,bob@y.org")
    out = tmp_path / "out.csv"
    write_results_csv(path, info, out, {"Safe to Send": ["Yes", "No"]})
    assert out.read_bytes() == (b"name,email,Safe to Send\r\nAnn,ann@x.org,Yes\r\nBob,bob@y.org,No")


@pytest.mark.parametrize(
    ("override", "index"),
    [("Contact", 1), ("contact", 1), (" CONTACT ", 1), ("2", 1), ("column_2", 1), ("1", 0)],
)
def test_email_column_override(tmp_path: Path, override: str, index: int) -> None:
    data = b"name,Contact,email\nAnn,a@y.org,z@z.org\n"
    _, info = _inspect(tmp_path, data, email_column=override)
    assert info.email_index == index


@pytest.mark.parametrize(
    ("header", "reference"),
    [
        (b"name,email\n", "email"),
        (b"name, \n", "#2"),  # blank: a later read would take it for no column given
        (b"name,\n", "#2"),
        (b"email,email\n", "#2"),  # the name finds the first one
        (b"name," + b"e" * 200 + b"\n", "e" * 200),
        (b"name," + b"e" * 201 + b"\n", "#2"),  # longer than a job row keeps
    ],
)
def test_email_reference_finds_the_same_column_again(
    tmp_path: Path, header: bytes, reference: str
) -> None:
    path, info = _inspect(tmp_path, header + b"Ann,a@y.org\n", email_column="2")
    assert info.email_reference == reference
    again = inspect_csv(path, max_rows=10, email_column=info.email_reference)
    assert again.email_index == info.email_index == 1


def test_the_longest_reference_fits_a_job_row() -> None:
    from verimail.files.csv_detect import MAX_COLUMN_REFERENCE
    from verimail.store.tables import jobs

    assert jobs.c.email_column.type.length == MAX_COLUMN_REFERENCE


def test_override_wins_over_recognised_header(tmp_path: Path) -> None:
    _, info = _inspect(tmp_path, b"email,backup\nx@x.org,y@y.org\n", email_column="backup")
    assert info.email_column == "backup"


@pytest.mark.parametrize("override", ["foo", "0", "4"])
def test_wrong_email_column_names_the_columns(tmp_path: Path, override: str) -> None:
    with pytest.raises(UploadError) as err:
        _inspect(tmp_path, b"name,Contact,phone\nAnn,a@y.org,1\n", email_column=override)
    assert err.value.detail.startswith(
        f"email_column '{override}' is not a column of the file; columns are: name, Contact, phone."
    )
    if override.isdigit():
        assert "counts columns from 1" in err.value.detail


def test_headerless_override_by_name_explains_why(tmp_path: Path) -> None:
    with pytest.raises(UploadError) as err:
        _inspect(tmp_path, b"Ann,a@x.org\n", email_column="email")
    assert err.value.detail == (
        "email_column 'email' is not a column of the file; columns are: column_1, column_2. "
        "The first row holds an address, so the file has no header row."
    )


def test_headerless_override_by_position(tmp_path: Path) -> None:
    path, info = _inspect(tmp_path, b"a@x.org,b@x.org\nc@x.org,d@x.org\n", email_column="2")
    assert (info.has_header, info.email_column) == (False, "column_2")
    assert load_emails(path, info).get_column("email").to_list() == ["b@x.org", "d@x.org"]


@pytest.mark.parametrize(
    ("data", "detail"),
    [
        (b"", "The file is empty."),
        (BOM8, "The file is empty."),
        (b"\n\r\n  \n", "The file is empty."),
        (BOM16LE, "The file is empty."),
        (
            b"name,email\n",
            "The file has a header row but no data rows, so there are no addresses to verify.",
        ),
        (
            b"email",
            "The file has a header row but no data rows, so there are no addresses to verify.",
        ),
        (
            b"email\r\n\r\n\r\n",
            "The file has a header row but no data rows, so there are no addresses to verify.",
        ),
        (b"name,email\nAnn,\nBob, \n", "Column 'email' has no addresses in any row."),
        (PNG, "The file does not look like a CSV text file (it looks like a PNG image)."),
        (
            b"\x28\xb5\x2f\xfd" + bytes(64),
            "The file does not look like a CSV text file (it looks like a Zstandard archive).",
        ),
        (
            b"email\na@x.org\x00\x00\nb@y.org\n",
            "The file does not look like a CSV text file (binary data found).",
        ),
        (
            bytes(range(1, 32)) * 50,
            "The file does not look like a CSV text file (binary data found).",
        ),
    ],
)
def test_unusable_files(tmp_path: Path, data: bytes, detail: str) -> None:
    with pytest.raises(UploadError) as err:
        _inspect(tmp_path, data)
    assert err.value.detail == detail
    assert not isinstance(err.value, UploadTooLarge)


def test_xlsx_upload_gets_a_helpful_message(tmp_path: Path) -> None:
    with pytest.raises(UploadError, match="Excel workbook"):
        _inspect(tmp_path, b"PK\x03\x04" + bytes(200))


def test_random_bytes_never_crash(tmp_path: Path) -> None:
    """Any bytes end in a CsvInfo or an UploadError, and what is accepted round-trips."""
    rnd = random.Random(7)
    alphabets = [bytes(range(256)), bytes(range(32, 256)) + b'\n\r,;\t"@@@..', b'ab@.,;"\r\n ']
    accepted = 0
    for i in range(60):
        alphabet = alphabets[i % 3]
        data = bytes(rnd.choice(alphabet) for _ in range(rnd.randrange(1, 3000)))
        try:
            path, info = _inspect(tmp_path, data, email_column="1")
        except UploadError:
            continue
        accepted += 1
        work = tmp_path / str(i)
        work.mkdir()
        _assert_round_trip(path, info, work, pad=False)
    assert accepted > 10


def test_too_many_rows(tmp_path: Path) -> None:
    data = b"email\n" + b"".join(b"u%d@x.org\n" % i for i in range(1001))
    with pytest.raises(UploadTooLarge) as err:
        _inspect(tmp_path, data, max_rows=1000)
    assert err.value.detail == "The file has more than 1,000 rows."
    assert isinstance(err.value, UploadError)
    _, info = _inspect(tmp_path, data, max_rows=1001)
    assert info.row_count == 1001


def test_unclosed_quote_is_reported_with_its_line(tmp_path: Path) -> None:
    data = b'name,email\nAnn,a@x.org\n"Bob,b@y.org\n' + b"x" * 140_000 + b"\nCy,c@z.org\n"
    with pytest.raises(UploadError, match=r"Line 3 could not be read"):
        _inspect(tmp_path, data)


def test_info_serialises(tmp_path: Path) -> None:
    _, info = _inspect(tmp_path, FIXTURES["quoted"][0])
    assert CsvInfo.from_dict(info.to_dict()) == info


# --- normalising --------------------------------------------------------------------------


def test_normalise_and_unique() -> None:
    df = pl.DataFrame(
        {
            "row": [0, 1, 2, 3, 4, 5, 6, 7],
            "email": [
                "  John.Doe@EXAMPLE.com ",
                "john.doe@example.COM",
                "John.Doe@example.com",
                "no-at-sign",
                None,
                "x@",
                "a@b@Ex.ORG",
                "Zoë@ExÄmple.org",
            ],
        }
    )
    out = normalise_emails(df)
    assert out.get_column("normalised").to_list() == [
        "John.Doe@example.com",
        "john.doe@example.com",
        "John.Doe@example.com",
        "no-at-sign",
        None,
        "x@",
        "a@b@ex.org",
        "Zoë@exämple.org",
    ]
    assert out.get_column("email").to_list() == df.get_column("email").to_list()  # untouched
    assert unique_emails(df) == [
        "John.Doe@example.com",
        "john.doe@example.com",
        "no-at-sign",
        "x@",
        "a@b@ex.org",
        "Zoë@exämple.org",
    ]
    assert values_for_rows(out, {"John.Doe@example.com": "Yes"}, "No") == [
        "Yes",
        "No",
        "Yes",
        "No",
        "No",
        "No",
        "No",
        "No",
    ]


# --- finder columns -----------------------------------------------------------------------


@pytest.mark.parametrize(
    ("first", "last", "dom"),
    [
        ("first_name", "last_name", "domain"),
        ("First Name", "Last Name", "Company Domain"),
        ("firstname", "lastname", "website"),
        ("first", "surname", "company_website"),
        ("given_name", "family_name", "url"),
    ],
)
def test_person_columns_detected(tmp_path: Path, first: str, last: str, dom: str) -> None:
    data = f"id,{first},{last},{dom}\r\n1,Ann,Lee,https://www.acme.com/about\r\n2, Bob ,,\r\n"
    path, info = _inspect(tmp_path, data.encode(), need_email=False)
    assert info.email_column is None
    cols = find_person_columns(info)
    assert (cols.first_name, cols.last_name, cols.domain) == (first, last, dom)
    assert (cols.first_name_index, cols.last_name_index, cols.domain_index) == (1, 2, 3)
    df = load_person_rows(path, info, cols.first_name_index, cols.last_name_index, cols.domain)
    assert df.columns == ["row", "first_name", "last_name", "domain"]
    # (the domain as typed: the finder reduces it, as the single lookup does)
    assert df.rows() == [(0, "Ann", "Lee", "https://www.acme.com/about"), (1, "Bob", None, None)]


def test_normalise_skips_only_cells_already_normal() -> None:
    """normalise_emails rewrites only the cells its regex flags. Every ASCII character and
    a spread of others, at the start, at the end, in the local part and in the domain, must
    give what the full rule (trim, lower-case the domain) gives on every cell."""
    chars = [chr(c) for c in (*range(128), *range(128, 0x110000, 61)) if not 0xD800 <= c <= 0xDFFF]
    chars += ["\u0130", "\u212a", "\ua7ce", "\U00016ea0", "\u2028", "\u3000", "\x85"]
    cells = [
        *(f"{c}a@b.org" for c in chars),
        *(f"a@b.org{c}" for c in chars),
        *(f"a{c}b@x.org" for c in chars),
        *(f"a@b{c}x.org" for c in chars),
        *(f"a@{c}@x.org" for c in chars),
        *(f"a@x.org@{c}" for c in chars),
        "",
        "   ",
        "plain@example.org",
    ]
    df = pl.DataFrame({"row": range(len(cells)), "email": cells})
    full = df.select(csv_io._normalised(pl.col("email"))).to_series()
    got = normalise_emails(df).get_column("normalised")
    differ = (got != full) | (got.is_null() != full.is_null())
    assert not differ.any(), df.filter(differ).head(5)
    assert got.is_null().sum() == 2 and (got != df.get_column("email")).sum() > 100


def test_distinct_in_order_is_exact_even_when_hashes_collide(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The hashed dedupe equals the exact one; when the dedupe key collides (here: a "hash"
    that is the value's length), the check notices and the exact dedupe answers."""
    rng = random.Random(5)
    values = pl.Series(
        "v",
        [
            rng.choice([None, *(f"u{rng.randrange(500)}@x.org" for _ in range(3))])
            for _ in range(5000)
        ],
    )
    exact = values.filter(values.is_not_null() & values.is_first_distinct()).to_list()
    assert distinct_in_order(values).to_list() == exact
    real = csv_io._hash_key

    def colliding(value: pl.Expr, seed: int) -> pl.Expr:
        if seed == csv_io._DEDUPE_SEED:
            return value.str.len_bytes().cast(pl.UInt64)
        return real(value, seed)

    monkeypatch.setattr(csv_io, "_hash_key", colliding)
    assert len(exact) > 10
    assert distinct_in_order(values).to_list() == exact


def test_person_columns_override_and_missing(tmp_path: Path) -> None:
    _, info = _inspect(tmp_path, b"Vorname,Nachname,Firma\nAnn,Lee,acme.com\n", need_email=False)
    with pytest.raises(UploadError) as err:
        find_person_columns(info)
    assert err.value.detail == (
        "No first-name or last-name or company-domain column found; columns are: Vorname, "
        "Nachname, Firma. Pass first_name_column, last_name_column, domain_column to choose them."
    )
    cols = find_person_columns(info, first="Vorname", last="nachname", domain="3")
    assert (cols.first_name, cols.last_name, cols.domain) == ("Vorname", "Nachname", "Firma")
    with pytest.raises(UploadError, match="domain_column 'Company' is not a column"):
        find_person_columns(info, domain="Company")


def test_a_people_files_first_row_is_its_header_unless_it_holds_an_address(
    tmp_path: Path,
) -> None:
    """As the README says: an address is never a header, so a first row with one is a
    person; names and domains alone cannot tell, so such a first row is the header."""
    _, with_address = _inspect(
        tmp_path, b"John,Smith,acme.test,old@x.test\nJane,Doe,acme.test,\n", need_email=False
    )
    assert not with_address.has_header and with_address.row_count == 2
    assert with_address.columns == ("column_1", "column_2", "column_3", "column_4")
    _, names_only = _inspect(
        tmp_path, b"John,Smith,acme.test\nJane,Doe,acme.test\n", need_email=False
    )
    assert names_only.has_header and names_only.row_count == 1
    assert names_only.columns == ("John", "Smith", "acme.test")


def test_finder_columns_appended(tmp_path: Path) -> None:
    data = b'first_name,last_name,domain\nAnn,Lee,acme.com\n"Bob","Roe, Jr",x.org\n'
    path, info = _inspect(tmp_path, data, need_email=False)
    out = tmp_path / "out.csv"
    write_results_csv(
        path,
        info,
        out,
        {
            "email": ["ann.lee@acme.com", None],
            "status": ["found", "not_found"],
            "confidence": ["0.95", "0"],
        },
    )
    assert out.read_bytes() == (
        b"first_name,last_name,domain,email,status,confidence\n"
        b"Ann,Lee,acme.com,ann.lee@acme.com,found,0.95\n"
        b'"Bob","Roe, Jr",x.org,,not_found,0\n'
    )


# --- writing ------------------------------------------------------------------------------


def test_blank_lines_pass_through_and_are_not_rows(tmp_path: Path) -> None:
    path, info = _inspect(tmp_path, b"email\n\na@x.org\n  \n\r\nb@y.org\n\n")
    assert info.row_count == 2
    out = tmp_path / "out.csv"
    write_results_csv(path, info, out, {"Safe to Send": ["Yes", "No"]})
    assert out.read_bytes() == b"email,Safe to Send\n\na@x.org,Yes\n  \n\r\nb@y.org,No\n\n"


def test_keep_leaves_out_rows_byte_for_byte(tmp_path: Path) -> None:
    """A segment: the header and the kept records exactly as they were, the others gone."""
    data = b'id,email\r\n1,a@x.org\r\n2,"b@y.org"\r\n3,"multi\nline"\r\n4,d@w.org'
    path, info = _inspect(tmp_path, data)
    out = tmp_path / "out.csv"
    written = write_results_csv(
        path, info, out, {"Safe to Send": ["Yes", "No", "No", "Yes"]},
        keep=[True, False, False, True],
    )  # fmt: skip
    assert written == 2
    assert out.read_bytes() == b"id,email,Safe to Send\r\n1,a@x.org,Yes\r\n4,d@w.org,Yes"
    with pytest.raises(ValueError, match="keep has 1 flags"):
        write_results_csv(path, info, out, {"Safe to Send": ["Yes"] * 4}, keep=[True])


def test_finder_results_partial_keeps_the_rows_looked_up_in_order(tmp_path: Path) -> None:
    """A finder job stopped by its owner: the rows with an outcome (given in any order),
    in the file's order, under the finished file's column names; rows not looked up are
    left out. A finished file must have every row."""
    data = b"first,last,domain,status\r\nA,B,x.test,old\r\nC,D,y.test,\r\nE,F,z.test,new"
    path, info = _inspect(tmp_path, data, need_email=False)
    outcomes = pl.DataFrame(
        {"row": [2, 0], "email": ["e.f@z.test", ""], "status": ["found", "not_found"],
         "confidence": ["0.90", "0.00"], "sub_status": [None, None]},
        schema_overrides={"sub_status": pl.String},
    )  # fmt: skip
    out = tmp_path / "out.csv"
    assert write_finder_results(path, info, out, outcomes, partial=True) == 2
    assert out.read_bytes() == (
        b"first,last,domain,status,finder_email,finder_status,finder_confidence\r\n"
        b"A,B,x.test,old,,not_found,0.00\r\nE,F,z.test,new,e.f@z.test,found,0.90"
    )
    with pytest.raises(ValueError, match="1 rows have no outcome"):
        write_finder_results(path, info, out, outcomes)


def test_appended_values_are_quoted_only_when_needed(tmp_path: Path) -> None:
    path, info = _inspect(tmp_path, b"email\na@x.org\nb@y.org\nc@z.org\nd@w.org\n")
    out = tmp_path / "out.csv"
    values = ["plain", "has,comma", 'has "quote"', "two\nlines"]
    write_results_csv(path, info, out, {"Note, x": values})
    assert out.read_bytes() == (
        b'email,"Note, x"\na@x.org,plain\nb@y.org,"has,comma"\n'
        b'c@z.org,"has ""quote"""\nd@w.org,"two\nlines"\n'
    )


def test_utf16_output_keeps_bom_and_encoding(tmp_path: Path) -> None:
    path, info = _inspect(tmp_path, FIXTURES["utf16be_bom"][0])
    out = tmp_path / "out.csv"
    write_results_csv(path, info, out, {"Safe to Send": ["Yes"]})
    assert out.read_bytes() == BOM16BE + "name;email;Safe to Send\nJosé;jose@x.org;Yes\n".encode(
        "utf-16-be"
    )


def test_8bit_output_replaces_what_the_code_page_lacks(tmp_path: Path) -> None:
    path, info = _inspect(tmp_path, FIXTURES["latin1"][0])
    out = tmp_path / "out.csv"
    write_results_csv(path, info, out, {"Note": ["José ✓", "ok"]})
    assert out.read_bytes() == "name,email,Note\nJosé,jose@x.org,José ?\nAnn,ann@x.org,ok\n".encode(
        "cp1252"
    )


def test_short_rows_are_padded_so_values_sit_under_their_header(tmp_path: Path) -> None:
    data = b"name,email,phone\nAnn,ann@x.org\nBob,bob@y.org,2,extra\n"
    path, info = _inspect(tmp_path, data)
    out = tmp_path / "out.csv"
    write_results_csv(path, info, out, {"Safe to Send": ["Yes", "No"]})
    assert out.read_bytes() == (
        b"name,email,phone,Safe to Send\nAnn,ann@x.org,,Yes\nBob,bob@y.org,2,extra,No\n"
    )
    write_results_csv(path, info, out, {"Safe to Send": ["Yes", "No"]}, pad_short_rows=False)
    assert out.read_bytes() == (
        b"name,email,phone,Safe to Send\nAnn,ann@x.org,Yes\nBob,bob@y.org,2,extra,No\n"
    )


def test_neutralise_formulas(tmp_path: Path) -> None:
    path, info = _inspect(tmp_path, FIXTURES["formula_cells"][0])
    out = tmp_path / "out.csv"
    values = ['=HYPERLINK("http://evil")', "No"]
    write_results_csv(path, info, out, {"Safe to Send": values})
    assert out.read_bytes() == (
        b"name,email,note,Safe to Send\n"
        b'=1+2,a@x.org,-5,"=HYPERLINK(""http://evil"")"\n'
        b"@SUM(A1),b@y.org,+x,No\n"
    )
    write_results_csv(path, info, out, {"Safe to Send": values}, neutralise_formulas=True)
    assert out.read_bytes() == (
        b"name,email,note,Safe to Send\n"
        b'\'=1+2,a@x.org,\'-5,"\'=HYPERLINK(""http://evil"")"\n'
        b"'@SUM(A1),b@y.org,'+x,No\n"
    )


def test_neutralise_requotes_quoted_records(tmp_path: Path) -> None:
    data = b'name,email\r\n"=cmd|\' /C calc\'!A0","a@x.org"\r\n"Ann, B","b@y.org"\r\n'
    path, info = _inspect(tmp_path, data)
    out = tmp_path / "out.csv"
    write_results_csv(path, info, out, {"Safe to Send": ["No", "No"]}, neutralise_formulas=True)
    assert out.read_bytes() == (
        b'name,email,Safe to Send\r\n\'=cmd|\' /C calc\'!A0,a@x.org,No\r\n"Ann, B","b@y.org",No\r\n'
    )


def test_quote_left_open_at_the_end_is_closed(tmp_path: Path) -> None:
    path, info = _inspect(tmp_path, b'name,email\nAnn,a@x.org\nBob,"b@y.org\n')
    assert load_emails(path, info).get_column("email").to_list() == ["a@x.org", "b@y.org\n"]
    out = tmp_path / "out.csv"
    write_results_csv(path, info, out, {"Safe to Send": ["Yes", "No"]})
    assert out.read_bytes() == b'name,email,Safe to Send\nAnn,a@x.org,Yes\nBob,"b@y.org",No\n'


def test_wrong_number_of_values_is_refused(tmp_path: Path) -> None:
    path, info = _inspect(tmp_path, FIXTURES["lf"][0])
    with pytest.raises(ValueError, match="has 1 values for 2 data rows"):
        write_results_csv(path, info, tmp_path / "out.csv", {"Safe to Send": ["Yes"]})
    assert list(tmp_path.iterdir()) == [path]


def _random_cell(rnd: random.Random) -> str:
    pick = rnd.random()
    if pick < 0.5:
        return rnd.choice(["Ann", "Bob", "", " ", "42", "Zoë", "李", "=1+2", "x@y"])
    if pick < 0.8:
        return rnd.choice(["Doe, John", 'say "hi"', "two\nlines", "crlf\r\ninside", ";", "\t"])
    return "".join(rnd.choice('ab ,;"\n\r\t') for _ in range(rnd.randrange(6)))


def _random_csv(rnd: random.Random, rows: int, delimiter: str) -> str:
    """A messy CSV written by Python's csv module with varying quoting and line endings, plus
    blank lines and hand-written stray quotes."""
    out = io.StringIO()
    header = ["name", "email", "note"]
    out.write(delimiter.join(header) + "\r\n")
    for i in range(rows):
        terminator = rnd.choice(["\n", "\r\n", "\r"])
        roll = rnd.random()
        if roll < 0.05:
            out.write(rnd.choice(["", "  ", "\t" if delimiter != "\t" else ""]) + terminator)
            continue
        email = rnd.choice([f"u{i}@x{i % 7}.org", "", f" U{i}@X.ORG "])
        if roll < 0.1:
            out.write(f'5" screen{delimiter}{email}{delimiter}"abc"def{terminator}')
            continue
        writer = csv.writer(
            out,
            delimiter=delimiter,
            lineterminator=terminator,
            quoting=rnd.choice([csv.QUOTE_MINIMAL, csv.QUOTE_ALL]),
        )
        cells = [_random_cell(rnd), email, _random_cell(rnd)]
        writer.writerow(cells[: rnd.choice([2, 3, 3, 3])])
    if rnd.random() < 0.5:
        out.write("last@x.org")  # no final newline
    return out.getvalue()


@pytest.mark.parametrize("seed", range(12))
def test_messy_files_match_python_csv_and_round_trip(tmp_path: Path, seed: int) -> None:
    rnd = random.Random(seed)
    delimiter = [",", ";", "\t"][seed % 3]
    encoding = ["utf-8", "utf-16-le", "cp1252"][seed % 3 if seed < 9 else 0]
    text = _random_csv(rnd, 300, delimiter)
    bom = {"utf-16-le": BOM16LE}.get(encoding, b"")
    data = bom + text.encode(encoding, errors="replace")
    path, info = _inspect(tmp_path, data, email_column="email")
    assert info.delimiter == delimiter
    # The reference: Python's csv module on the same text, blank records dropped.
    reference = [
        r
        for r in csv.reader(io.StringIO(_decode(data, info), newline=""), delimiter=delimiter)
        if r and not (len(r) == 1 and not r[0].strip())
    ][1:]
    expected = [r[1] if len(r) > 1 and r[1].strip() else None for r in reference]
    assert load_emails(path, info).get_column("email").to_list() == expected
    _assert_round_trip(path, info, tmp_path, pad=False)
    with open_info(path, info) as f:
        assert "".join(raw for raw, _ in iter_raw_records(f, delimiter)) == _decode(data, info)


def test_200k_rows_round_trip(tmp_path: Path) -> None:
    rnd = random.Random(200)
    parts = ["id,first_name,email,company,city,note\r\n"]
    for i in range(200_000):
        note = rnd.choice(["plain", '"Smith, J"', '"two\r\nlines"', '"say ""hi"""', ""])
        email = "" if i % 97 == 0 else f"user{i}@domain{i % 5000}.com"
        parts.append(f"{i},Fn{i},{email},Company {i % 777},City{i % 50},{note}\r\n")
        if i % 10_007 == 0:
            parts.append("\r\n")
    path = _write(tmp_path, "".join(parts).encode())
    info = inspect_csv(path, max_rows=1_000_000)
    assert (info.row_count, info.email_column, info.line_terminator) == (200_000, "email", "\r\n")
    df = normalise_emails(load_emails(path, info))
    assert df.height == 200_000
    assert df.get_column("email").null_count() == len(range(0, 200_000, 97))
    safe = values_for_rows(df, {e: "Yes" for e in unique_emails(df)[::2]}, "No")
    out = tmp_path / "out.csv"
    write_results_csv(path, info, out, {"Safe to Send": safe})
    produced = out.read_bytes()
    stripped = re.sub(rb",(?:Yes|No|Safe to Send)(?=\r\n)", b"", produced)
    assert stripped == path.read_bytes()
    _assert_round_trip(path, info, tmp_path)


# --- saving uploads -----------------------------------------------------------------------


async def test_save_upload_writes_everything_under_the_limit(tmp_path: Path) -> None:
    async def chunks() -> AsyncIterator[bytes]:
        for _ in range(4):
            yield b"x" * 25

    dest = tmp_path / "sub" / "upload.csv"
    assert await save_upload(chunks(), dest, max_bytes=100) == 100
    assert dest.read_bytes() == b"x" * 100


async def test_save_upload_stops_at_the_limit_and_leaves_no_file(tmp_path: Path) -> None:
    produced: list[int] = []
    closed: list[bool] = []

    async def chunks() -> AsyncIterator[bytes]:
        try:
            for i in range(1000):
                produced.append(i)
                yield b"x" * 40
        finally:
            closed.append(True)

    dest = tmp_path / "upload.csv"
    with pytest.raises(UploadTooLarge) as err:
        await save_upload(chunks(), dest, max_bytes=100)
    assert err.value.detail == "The file is larger than the 100 bytes upload limit."
    assert not dest.exists()
    assert len(produced) == 3
    assert closed == [True]


def test_save_upload_sync(tmp_path: Path) -> None:
    dest = tmp_path / "upload.csv"
    assert save_upload_sync(io.BytesIO(b"email\na@x.org\n"), dest, max_bytes=1 << 20) == 14
    with pytest.raises(UploadTooLarge, match="larger than the 1 MB upload limit"):
        save_upload_sync([b"x" * (1 << 19)] * 3, dest, max_bytes=1 << 20)
    assert not dest.exists()


def test_a_list_of_records_is_told_from_a_list_of_addresses() -> None:
    """``verimail verify --file`` refuses a file of records with the reader's own delimiters
    (the command once kept a copy without ``|``)."""
    from verimail.files.csv_detect import DELIMITERS, looks_delimited

    assert not looks_delimited(["alice@x.test", "bob@x.test", "carol@x.test"])
    for delimiter in DELIMITERS:
        rows = [f"name{delimiter}email", f"alice{delimiter}alice@x.test", f"bob{delimiter}b@x.test"]
        assert looks_delimited(rows), delimiter
    # One odd line among addresses is not a table.
    assert not looks_delimited(["a@x.test", "b@x.test", "c,d@x.test"])
