"""The native fast path (``fast_data_cells``) reads exactly what the tokenizer reads.

Every file here is read both ways: the Polars fast path, and the tokenizer
(``iter_data_cell``). When the fast path accepts a file, its cells must equal the
tokenizer's, row for row; files it cannot prove plain (bare CR, embedded newlines, stray
quotes, non-UTF-8, …) must be refused, so that the tokenizer reads them.
"""

from __future__ import annotations

import codecs
import csv
import io
import random
import struct
import sys
import zlib
from pathlib import Path

import polars as pl
import pytest

from verimail.files import csv_detect, csv_fast_path, csv_io
from verimail.files.csv_detect import inspect_csv
from verimail.files.csv_encoding import detect_encoding
from verimail.files.csv_fast_path import FAST_MAX_COLUMNS, PY_SPACES, fast_data_cells, space_only
from verimail.files.csv_io import load_emails, read_emails
from verimail.files.csv_records import iter_data_cell
from verimail.files.upload_errors import UploadError

BOM8 = codecs.BOM_UTF8


def _tokenizer_cells(data: bytes, delimiter: str, has_header: bool, index: int) -> list[str | None]:
    """The reference: the tokenizer's cells for a UTF-8 file (BOM skipped as open_text does),
    blank ones None as load_emails holds them."""
    text = data.removeprefix(BOM8).decode("utf-8")
    stream = io.StringIO(text, newline="")
    cells = iter_data_cell(stream, delimiter, has_header, index)
    return [cell if cell.strip() else None for cell in cells]


def _fast(data: bytes, delimiter: str, has_header: bool, index: int) -> list[str | None] | None:
    cells = fast_data_cells(data, "utf-8", data.startswith(BOM8), delimiter, has_header, index)
    return None if cells is None else cells.to_list()


def _assert_same(data: bytes, delimiter: str = ",", *, fast: bool) -> None:
    """For every column and both header settings: the fast path's cells are the tokenizer's;
    ``fast`` says whether the fast path must accept the file or refuse it."""
    for has_header in (True, False):
        for index in range(3):
            got = _fast(data, delimiter, has_header, index)
            if got is None:
                assert not fast or index > 0, f"fast path refused {data!r} (column {index})"
                continue
            assert fast, f"fast path accepted {data!r}"
            assert got == _tokenizer_cells(data, delimiter, has_header, index), (
                data,
                has_header,
                index,
            )


# Files the fast path must take, and read as the tokenizer does.
PLAIN: dict[str, tuple[bytes, str]] = {
    "lf": (b"name,email\nAnn,ann@x.org\nBob,bob@y.org\n", ","),
    "crlf": (b"name,email\r\nAnn,ann@x.org\r\nBob,bob@y.org\r\n", ","),
    "lf_and_crlf": (b"name,email\r\nAnn,ann@x.org\nBob,bob@y.org\r\nCy,c@z.org\n", ","),
    "no_final_newline": (b"name,email\nAnn,ann@x.org\nBob,bob@y.org", ","),
    "final_bare_cr": (b"name,email\nAnn,ann@x.org\nBob,bob@y.org\r", ","),
    "utf8_bom": (BOM8 + b"email,name\nann@x.org,Zo\xc3\xab\n", ","),
    "double_bom": (BOM8 + BOM8 + b"email,name\nann@x.org,x\n", ","),
    "blank_lines": (b"\nname,email\n\nAnn,a@x.org\n   \n\r\n\t\nBob,b@y.org\n\n\n", ","),
    "blank_lines_crlf_end": (b"name,email\r\n\r\nAnn,a@x.org\r\n\r\n", ","),
    "only_spaces_and_delimiters": (b"name,email\n , \n,\nAnn,a@x.org\n", ","),
    "unicode_spaces": (
        "name,email\n\u3000\nAnn,\u00a0\n\x1c\nBob, b@y.org\u2003\n\u2028\n".encode(),
        ",",
    ),
    "short_and_long_rows": (b"a,b,c\nd\ne,f,g,h,i\n,\nj,k\n", ","),
    "trailing_delimiter": (b"name,email,\nAnn,a@x.org,\nBob,b@y.org,,\n", ","),
    "quoted_fields": (
        b'name,email,note\n"Doe, John","jd@x.org","said ""hi"", left"\n'
        b'Ann,ann@x.org,""\n"","",""\n"""",x@y.org,"a""""b"\n',
        ",",
    ),
    "quoted_blank_records": (b'email,n\n""\n"   "\na@x.org,1\n" \t "\n', ","),
    "all_quoted_excel": (b'"Name","Email"\r\n"Ann","ann@x.org"\r\n"Bob","bob@y.org"\r\n', ","),
    "semicolon": (b'name;email;amount\nAnn;ann@x.org;1,5\n"B;b";b@y.org;"2;25"\n', ";"),
    "tab": (b'name\temail\nDoe, John\tjd@x.org\n\t\n"\t"\nRoe\t"r\ta@y.org"\n', "\t"),
    "pipe": (b"name|email\nAnn|ann@x.org\n|\n", "|"),
    "single_column": (b"a@x.org\nb@y.org\n\nc@z.org", ","),
    "unicode": ("name,email\nZoë,zoë@exämple.org\n李,li@例子.中国\n😀,s@x.org\n".encode(), ","),
    "formula_cells": (b"name,email,note\n=1+2,a@x.org,-5\n@SUM(A1),b@y.org,+x\n", ","),
    "control_chars": (b"name,email\nA\x0bB,a@x.org\nC\x0cD,\x1fb@y.org\n", ","),
    "header_only": (b"name,email\n", ","),
    "nothing_but_blanks": (b"\n \n\r\n", ","),
}

# Files the fast path must refuse: the tokenizer reads them its own way.
TRICKY: dict[str, tuple[bytes, str]] = {
    "cr_only": (b"name,email\rAnn,ann@x.org\rBob,bob@y.org\r", ","),
    "bare_cr_mid_file": (b"name,email\nAnn,ann@x.org\rBob,bob@y.org\n", ","),
    "cr_cr_lf": (b"name,email\r\r\nAnn,ann@x.org\n", ","),
    "cr_inside_line": (b"name,email\nA\rnn,ann@x.org\n", ","),
    "embedded_newline": (b'name,email,note\nAnn,a@x.org,"two\nlines"\nBob,b@y.org,x\n', ","),
    "embedded_crlf": (b'name,email,note\r\nAnn,a@x.org,"two\r\nlines"\r\n', ","),
    "quote_inside_unquoted": (b'item,email\n5" screen,a@x.org\n', ","),
    "text_after_closing_quote": (b'item,email\n"abc"def,b@y.org\n', ","),
    "space_before_quote": (b'item,email\nx, "a@x.org"\n', ","),
    "quote_left_open": (b'email,n\na@x.org,1\n"b@y.org,2\n', ","),
    "quoted_blank_then_space": (b'email\n"  " \na@x.org\n', ","),
    "first_line_too_narrow": (b"x\nAnn,a@x.org,1\n", ","),
    "nul_byte": (b"name,email\nAnn,a@x.org\x00\n", ","),
}


@pytest.mark.parametrize("name", sorted(PLAIN))
def test_plain_files_take_the_fast_path_and_match(name: str) -> None:
    data, delimiter = PLAIN[name]
    _assert_same(data, delimiter, fast=True)


@pytest.mark.parametrize("name", sorted(TRICKY))
def test_tricky_files_fall_back(name: str) -> None:
    data, delimiter = TRICKY[name]
    if name == "first_line_too_narrow":
        assert _fast(data, delimiter, True, 1) is None
        assert _fast(data, delimiter, True, 0) == _tokenizer_cells(data, delimiter, True, 0)
        return
    _assert_same(data, delimiter, fast=False)


def test_python_whitespace_is_the_blank_rule() -> None:
    assert set(PY_SPACES) == {chr(c) for c in range(sys.maxunicode + 1) if chr(c).isspace()}


def test_space_only_is_pythons_blank_rule_for_every_start() -> None:
    """space_only runs its regex only on cells whose first character could be a space: every
    BMP character (and a spread beyond) first, alone, doubled and before a letter, must give
    ``not cell.strip()``."""
    chars = [chr(c) for c in (*range(0x10000), *range(0x10000, 0x110000, 97))]
    chars = [c for c in chars if not 0xD800 <= ord(c) <= 0xDFFF]
    cells = [None, "", *chars, *(c * 2 for c in chars), *(c + "a" for c in chars)]
    cells += [" \u3000\t", "\xa0a", "\x1c\x1d\x1e\x1f", "a "]
    got = pl.Series(cells, dtype=pl.String).to_frame("c").select(space_only(pl.col("c")))
    want = [cell is None or not cell.strip() for cell in cells]
    assert got.to_series().to_list() == want


def test_other_encodings_are_not_taken() -> None:
    data = "name,email\nJosé,j@x.org\n".encode("latin-1")
    for encoding in ("cp1252", "latin-1", "utf-16-le", "utf-16-be"):
        assert fast_data_cells(data, encoding, False, ",", True, 1) is None


def test_a_file_holding_every_spare_byte_is_not_taken() -> None:
    spare = bytes([*range(1, 9), *range(14, 32)])
    data = b"name,email\n" + spare + b",a@x.org\n"
    assert _fast(data, ",", True, 1) is None


def test_a_file_holding_the_first_spare_byte_is_still_taken() -> None:
    """The first spare byte is tried without looking for it: a file that holds it (in a cell,
    twice in one line, in the first line) is refused by the line checks, then read with
    another byte."""
    first = csv_fast_path._FREE_BYTES[0].encode()
    for data, index in (
        (b"name,email\nAn" + first + b"n,ann@x.org\nBob,bob@y.org\n", 1),
        (b"name,email\r\n" + first * 2 + b',ann@x.org\r\n"B' + first + b'ob",bob@y.org\r\n', 1),
        (b"email\na@x.org" + first + b"\n", 0),
        (b"na" + first + b"me,email\nAnn,ann@x.org\nBob,bob@y.org\n", 1),  # in the first line
    ):
        got = _fast(data, ",", True, index)
        assert got is not None, data
        assert got == _tokenizer_cells(data, ",", True, index)


def test_the_line_read_refuses_a_line_split_by_its_separator() -> None:
    """What trying the first spare byte unsearched relies on: Polars refuses (it does not
    truncate) a line the separator splits, in the first line or a later one. Were it to drop
    the rest of such a line, those bytes could offset a CR kept inside another line."""
    first = csv_fast_path._FREE_BYTES[0]
    for data in (
        b"email\na@x.org" + first.encode() + b"bb\nc\r@y\r.org\n",
        b"em" + first.encode() + b"ail\na@x.org\n",
    ):
        assert csv_fast_path._polars_read(data, first, ",", 0) is None


def test_a_quoted_line_over_the_field_limit_is_not_taken() -> None:
    limit = csv.field_size_limit()
    data = b'email,note\na@x.org,"' + b"x" * limit + b'"\nb@y.org,short\n'
    assert _fast(data, ",", True, 0) is None
    # Without quotes the tokenizer splits the line itself: no limit, and the fast path agrees.
    plain = b"email,note\na@x.org," + b"x" * limit + b"\nb@y.org,short\n"
    assert _fast(plain, ",", True, 0) == ["a@x.org", "b@y.org"]


def test_a_very_wide_file_is_left_to_the_tokenizer() -> None:
    header = ",".join(f"c{i}" for i in range(FAST_MAX_COLUMNS + 1))
    data = f"{header}\na@x.org\n".encode()
    assert _fast(data, ",", True, 0) is None
    narrower = ",".join(f"c{i}" for i in range(FAST_MAX_COLUMNS))
    assert _fast(f"{narrower}\na@x.org\n".encode(), ",", True, 0) == ["a@x.org"]


# --- random files: either refused, or read exactly as the tokenizer reads them ---------------


def _random_line(rnd: random.Random, delimiter: str) -> str:
    """A record that is often well-formed and sometimes not (stray quotes, CRs, blanks)."""
    roll = rnd.random()
    if roll < 0.08:
        return rnd.choice(["", " ", "\t", "\u00a0", '""', '" "', delimiter])
    cells = []
    for _ in range(rnd.randrange(1, 5)):
        pick = rnd.random()
        if pick < 0.5:
            cells.append(rnd.choice(["Ann", "", " ", "a@x.org", " B@Y.ORG ", "Zoë", "\u3000"]))
        elif pick < 0.98:
            inner = rnd.choice(["Doe, John", 'say "hi"', "", " ", delimiter, "x;y|z\tw", "李"])
            cells.append('"' + inner.replace('"', '""') + '"')
        else:
            cells.append("".join(rnd.choice(f'ab "{delimiter}\r\t') for _ in range(4)))
    return delimiter.join(cells)


def _random_file(rnd: random.Random, delimiter: str) -> bytes:
    lines = ["name" + delimiter + "email" + delimiter + "note"]
    lines += [_random_line(rnd, delimiter) for _ in range(rnd.randrange(1, 25))]
    endings = rnd.choice([["\n"], ["\r\n"], ["\n", "\r\n"]] * 3 + [["\n", "\r"]])
    text = "".join(line + rnd.choice(endings) for line in lines)
    if rnd.random() < 0.3:
        text = text.rstrip("\r\n")
    data = text.encode()
    return BOM8 + data if rnd.random() < 0.2 else data


def test_random_files_are_refused_or_read_the_same() -> None:
    rnd = random.Random(9)
    taken = refused = 0
    for i in range(400):
        delimiter = [",", ";", "\t", "|"][i % 4]
        data = _random_file(rnd, delimiter)
        for index in (0, 1, 2):
            got = _fast(data, delimiter, True, index)
            if got is None:
                refused += 1
                continue
            taken += 1
            assert got == _tokenizer_cells(data, delimiter, True, index), (data, index)
    assert taken > 400 and refused > 200  # both paths exercised


# --- end to end: inspect + load with and without the fast path -----------------------------


def _outcome(path: Path, column: str | None, max_rows: int = 1000) -> tuple:
    """What inspect_csv, load_emails and read_emails make of the file, in comparable form."""
    try:
        info = inspect_csv(path, max_rows=max_rows, email_column=column)
        one_pass_info, one_pass = read_emails(path, max_rows=max_rows, email_column=column)
    except UploadError as exc:
        return ("refused", type(exc).__name__, exc.detail)
    frame = load_emails(path, info)
    assert frame.schema == pl.Schema({"row": pl.Int64, "email": pl.String})
    assert one_pass_info == info and one_pass.equals(frame)
    return ("read", info, frame.to_dict(as_series=False))


def _outcome_without_fast_path(
    path: Path, column: str | None, monkeypatch: pytest.MonkeyPatch, max_rows: int = 1000
) -> tuple:
    with monkeypatch.context() as patch:
        patch.setattr(csv_detect, "fast_data_cells", lambda *args, **kwargs: None)
        patch.setattr(csv_io, "fast_data_cells", lambda *args, **kwargs: None)
        return _outcome(path, column, max_rows)


@pytest.mark.parametrize("column", [None, "2"])
@pytest.mark.parametrize("name", sorted({**PLAIN, **TRICKY}))
def test_inspect_and_load_are_the_same_either_way(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, name: str, column: str | None
) -> None:
    data, _delimiter = {**PLAIN, **TRICKY}[name]
    path = tmp_path / "in.csv"
    path.write_bytes(data)
    assert _outcome(path, column) == _outcome_without_fast_path(path, column, monkeypatch)


def _crm_export(rows: int) -> bytes:
    """Like bench/data.py: CRLF, quoted companies and notes, some blank emails."""
    rnd = random.Random(5)
    lines = ["id,first_name,last_name,Email,company,notes"]
    for i in range(rows):
        email = "" if i % 97 == 0 else f"u{i}@d{i % 50}.example"
        company = f'"Company {i}, Inc."' if rnd.random() < 0.1 else f"Company {i}"
        note = '"said ""hi"" on the phone"' if rnd.random() < 0.05 else "call back"
        lines.append(f"{i},Ann,Lee,{email},{company},{note}")
    return ("\r\n".join(lines) + "\r\n").encode()


def test_a_crm_export_is_read_once_by_the_fast_path(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = tmp_path / "crm.csv"
    path.write_bytes(_crm_export(3000))
    expected = _outcome_without_fast_path(path, None, monkeypatch, max_rows=10_000)
    calls: list[bool] = []
    real = csv_detect.fast_data_cells

    def spy(*args: object, **kwargs: object) -> pl.Series | None:
        cells = real(*args, **kwargs)  # type: ignore[arg-type]
        calls.append(cells is not None)
        return cells

    monkeypatch.setattr(csv_detect, "fast_data_cells", spy)
    info, frame = read_emails(path, max_rows=10_000)
    assert calls == [True]  # one read: inspect counted, and its cells are the loaded column
    assert ("read", info, frame.to_dict(as_series=False)) == expected
    assert (info.row_count, info.email_count) == (3000, 3000 - len(range(0, 3000, 97)))


def test_too_many_rows_is_the_same_refusal(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = tmp_path / "big.csv"
    path.write_bytes(b"email\n" + b"".join(b"u%d@x.org\n" % i for i in range(1001)))
    fast = _outcome(path, None)
    assert fast == ("refused", "UploadTooLarge", "The file has more than 1,000 rows.")
    assert fast == _outcome_without_fast_path(path, None, monkeypatch)


@pytest.mark.parametrize(
    "data",
    [
        b"email\na@x.org\n",
        BOM8 + b"email\na@x.org\n",
        "email\nJosé@x.org\n".encode("latin-1"),
        "email\n“x”@x.org\n".encode("cp1252"),
        b"email\nJ\x81@x.org\n",
        codecs.BOM_UTF16_LE + "email\na@x.org\n".encode("utf-16-le"),
        "email\na@x.org\n".encode("utf-16-be"),
        "é".encode() * 700_000 + b"\xff",  # the stray byte is past the first 1 MiB piece
        b"ab" * 600_000 + "é".encode(),  # a character split across two pieces
    ],
)
def test_encoding_is_the_same_from_memory_or_the_file(tmp_path: Path, data: bytes) -> None:
    path = tmp_path / "in.csv"
    path.write_bytes(data)
    assert detect_encoding(path, data) == detect_encoding(path)


def _zlib_stored_stream() -> bytes:
    """A zlib stream (header ``x\\x01``, one stored block, Adler-32 trailer) that is also
    valid UTF-8 text: its block length bytes are ``A\\xc3`` and their complement ``\\xbe<``,
    and the padding is chosen so that the trailer is printable."""
    length = 0xC341
    body = b"".join(f"u{i}@x.org\n".encode() for i in range(6000))
    for pad in range(10_000):
        raw = (b"email\n" + b"n" * pad + b"\n" + body)[:length]
        trailer = struct.pack(">I", zlib.adler32(raw))
        if all(0x20 <= byte < 0x7F for byte in trailer):
            return b"x\x01\x01A\xc3\xbe<" + raw + trailer
    raise AssertionError("no printable trailer found")


def test_an_upload_polars_would_inflate_is_never_handed_to_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Polars inflates a source that starts like a zlib stream, all of it, in memory — a
    50 MB upload could become gigabytes before any check runs (a zip bomb). Such an upload
    (here a stored block, so it is text as well) never reaches Polars, and is read byte for
    byte: its first line is the header it really has, not the inflated text."""
    data = _zlib_stored_stream()
    assert zlib.decompress(data).startswith(b"email\n")  # what Polars would have read
    sources: list[bytes] = []
    scan_csv = pl.scan_csv

    def watched(source: object, *args: object, **kwargs: object) -> pl.LazyFrame:
        if isinstance(source, bytes):
            sources.append(source[:2])
        return scan_csv(source, *args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(csv_detect.pl, "scan_csv", watched)
    path = tmp_path / "stream.csv"
    path.write_bytes(data)
    info, rows = read_emails(path, max_rows=100_000)
    assert b"x\x01" not in sources
    assert info.columns[0].startswith("x\x01")
    assert info.row_count == data.count(b"\n")
    assert rows.height == info.row_count


@pytest.mark.parametrize("magic", [b"\x1f\x8b\x08\x00", b"\x28\xb5\x2f\xfd"], ids=["gzip", "zstd"])
def test_fast_data_cells_leaves_other_compressed_streams_to_the_tokenizer(magic: bytes) -> None:
    """Polars inflates gzip and Zstandard sources too; it raised OSError on these (not a
    PolarsError), out of a function that promises to be safe on any file. The upload path
    refuses them earlier, by their signature; the fast path must not rely on that."""
    assert fast_data_cells(magic + b"email\na@b.test\n", "utf-8", False, ",", True, 0) is None
