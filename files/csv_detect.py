"""Sniff an uploaded CSV: encoding, delimiter, header, row count and the columns we need.

Why one long file: encoding, delimiter, header and column detection are one pipeline over one
tokenizer, and their heuristics score the same sample rows.

Everything here reads the file through one tokenizer, :func:`iter_records` (CPython's C
``csv`` semantics over the decoded text, with a split fast path for lines without quotes).
Counting, loading and writing all use it, so the n-th data row means the same record
everywhere and an appended value can never slide onto a neighbouring row. Counting and
loading one column may instead use :func:`fast_data_cells` (Polars, ~6x faster), which only
accepts files it has checked it reads exactly as the tokenizer does.

Rules (also in the report / README):

* Encoding: UTF-8 (BOM optional), UTF-16 LE/BE (with BOM, or without one when every other
  byte is NUL), else Windows-1252, else Latin-1. Decoding and re-encoding are exact, so the
  results file keeps every original byte.
* Delimiter: ``,`` ``;`` tab or ``|``, whichever splits the first record and gives the most
  consistent, widest rows in the first records; default ``,``. Quote character: ``"``.
* Header: the first non-blank record is a header unless one of its cells contains ``@``.
* Blank records (an empty line, or a line holding one empty / whitespace-only field) are not
  rows: they are not counted, not loaded, and written back unchanged with nothing appended.
"""

from __future__ import annotations

import codecs
import contextlib
import csv
import io
import re
from collections import Counter
from collections.abc import Iterator, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, TextIO

import polars as pl
import pyarrow as pa

from verimail.files.file_read import read_file

QUOTE = '"'
DELIMITERS: tuple[str, ...] = (",", ";", "\t", "|")

_CHUNK = 1 << 20
_SAMPLE_CHARS = 64 * 1024
MAX_COLUMN_REFERENCE = 200
"""Longest header a job row keeps as its ``email_column`` (``String(200)`` in
``store/tables.py``); a longer one is referred to by position."""
MAX_COLUMNS = 1_000_000
"""Most columns a file may have (header or widest row); beyond it the upload is refused (413).
The header is read whole, however long, so every column up to this limit can be found."""
_SAMPLE_RECORDS = 200

_BOMS: dict[str, bytes] = {
    "utf-8": codecs.BOM_UTF8,
    "utf-16-le": codecs.BOM_UTF16_LE,
    "utf-16-be": codecs.BOM_UTF16_BE,
}

# Signatures of files people upload by mistake; named so the message can say what it is.
_MAGIC: tuple[tuple[bytes, str], ...] = (
    (b"\x89PNG", "a PNG image"),
    (b"GIF8", "a GIF image"),
    (b"\xff\xd8\xff", "a JPEG image"),
    (b"%PDF", "a PDF document"),
    (b"PK\x03\x04", "an Excel workbook or a ZIP archive; save the sheet as CSV first"),
    (b"\xd0\xcf\x11\xe0", "an Excel or Office document; save the sheet as CSV first"),
    (b"\x1f\x8b", "a gzip archive"),
    (b"\x28\xb5\x2f\xfd", "a Zstandard archive"),
    (b"\xfd7zXZ\x00", "an xz archive"),
)
# Polars inflates a source that starts like a zlib stream (or gzip, zstd) on its own: such
# a file is left to the tokenizer, which reads its bytes as they are ("x^" is text too).
_ZLIB_HEADERS = (b"\x78\x01", b"\x78\x5e", b"\x78\x9c", b"\x78\xda")
# Every stream Polars inflates by itself when it sees its signature (zlib, gzip, Zstandard).
_INFLATED_BY_POLARS = (*_ZLIB_HEADERS, b"\x1f\x8b", b"\x28\xb5\x2f\xfd")
_BINARY = "The file does not look like a CSV text file (binary data found)."
_CP1252_UNDEFINED = re.compile(rb"[\x81\x8d\x8f\x90\x9d]")
_CONTROL = re.compile(r"[\x00-\x08\x0e-\x1f\x7f]")

# Header names compared after header_key(): case-folded, spaces, `_`, `-` and `.` removed.
# Order is preference when several columns match.
EMAIL_HEADERS: tuple[str, ...] = (
    "email",
    "emailaddress",
    "emails",
    "workemail",
    "businessemail",
    "contactemail",
    "emailaddresses",
    "mail",
    "mailaddress",
    "primaryemail",
    "emailid",
)
FIRST_NAME_HEADERS: tuple[str, ...] = ("firstname", "first", "givenname", "fname", "forename")
LAST_NAME_HEADERS: tuple[str, ...] = ("lastname", "last", "surname", "familyname", "lname")
DOMAIN_HEADERS: tuple[str, ...] = (
    "domain",
    "companydomain",
    "website",
    "companywebsite",
    "url",
    "companyurl",
    "websiteurl",
    "web",
    "emaildomain",
)


class UploadError(ValueError):
    """An upload we cannot use. ``detail`` is a sentence for the person who sent it (HTTP 422)."""

    def __init__(self, detail: str) -> None:
        super().__init__(detail)
        self.detail = detail


class UploadTooLarge(UploadError):
    """Over the byte or row limit (HTTP 413). A subclass of UploadError: catch it first."""


@dataclass(frozen=True)
class CsvInfo:
    """What a later pass needs to read or rewrite the file exactly as it is.

    ``encoding`` is a Python codec name without BOM handling (``utf-8``, ``utf-16-le``,
    ``utf-16-be``, ``cp1252`` or ``latin-1``); ``has_bom`` says whether a BOM precedes the text.
    ``columns`` are the header cells, or ``column_1``… for a headerless file; data rows wider
    than the header add ``column_N`` names. ``row_count`` counts data rows (no header, no blank
    records). ``email_count`` counts data rows whose email cell is not blank.
    ``line_terminator`` is the first record's (``\\n`` when the file is a single line).
    """

    encoding: str
    has_bom: bool
    delimiter: str
    has_header: bool
    columns: tuple[str, ...]
    line_terminator: str
    row_count: int
    email_column: str | None = None
    email_index: int | None = None
    email_count: int = 0
    quote_char: str = QUOTE

    def to_dict(self) -> dict[str, Any]:
        """JSON-able form, e.g. for a job row or a Prefect flow parameter."""
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> CsvInfo:
        """Inverse of :meth:`to_dict`."""
        return cls(**{**data, "columns": tuple(data["columns"])})

    @property
    def email_reference(self) -> str | None:
        """What names the email column for a later read of the file (a job's
        ``email_column``, given to :func:`resolve_column` again): its header, unless that
        is blank (a later read takes a blank name for none given, and detects afresh), longer
        than a job row holds, or finds another column first (a header used twice); then
        ``#N``, its position."""
        index = self.email_index
        if index is None:
            return None
        name = self.columns[index]
        if name.strip() and len(name) <= MAX_COLUMN_REFERENCE:
            with contextlib.suppress(UploadError):
                if resolve_column(self.columns, name, "email_column") == index:
                    return name
        return f"#{index + 1}"


@dataclass(frozen=True)
class PersonColumns:
    """The Email Finder's input columns: names as in ``CsvInfo.columns`` and 0-based indexes."""

    first_name: str
    last_name: str
    domain: str
    first_name_index: int
    last_name_index: int
    domain_index: int


# --- encoding --------------------------------------------------------------------------


def codec_errors(encoding: str) -> str:
    """Error handler that makes decode→encode exact (UTF-16 with lone surrogates is refused
    at inspection, so ``surrogatepass`` only keeps this exact should one get through)."""
    return "surrogatepass" if encoding.startswith("utf-16") else "strict"


def bom_bytes(info: CsvInfo) -> bytes:
    """The BOM to write before the text (empty when the file had none)."""
    return _BOMS[info.encoding] if info.has_bom else b""


def _guess_utf16(head: bytes) -> str | None:
    """UTF-16 without BOM: mostly-ASCII text has a NUL in every other byte."""
    n = len(head) - len(head) % 2
    if n < 4:
        return None
    half = n // 2
    even_nuls, odd_nuls = head[0:n:2].count(0), head[1:n:2].count(0)
    if odd_nuls >= 0.3 * half and even_nuls <= 0.02 * half:
        return "utf-16-le"
    if even_nuls >= 0.3 * half and odd_nuls <= 0.02 * half:
        return "utf-16-be"
    return None


def read_whole(path: Path) -> bytes | None:
    """The file's bytes when it is small enough to hold (one read serves every check and the
    native fast path), else None: larger files are streamed."""
    if path.stat().st_size > WHOLE_READ_MAX:
        return None
    return read_file(path)


def _chunks(path: Path, data: bytes | None, skip: int = 0) -> Iterator[bytes]:
    """The bytes from ``skip`` on in 1 MiB pieces (of ``data`` when the file was read whole):
    decoding piece by piece never builds the whole text."""
    if data is not None:
        for start in range(skip, len(data), _CHUNK):
            yield data[start : start + _CHUNK]
        return
    with path.open("rb") as f:
        f.seek(skip)
        while chunk := f.read(_CHUNK):
            yield chunk


def detect_encoding(path: Path, data: bytes | None = None) -> tuple[str, bool]:
    """(codec, has_bom) for the whole file; raises UploadError for empty or binary files.

    Reads the whole file (``data`` when the caller already has it, else 1 MiB chunks): a stray
    non-UTF-8 byte near the end must switch the codec, or that row could not be written back
    unchanged.
    """
    if data is not None:
        head = data[:4096]
    else:
        with path.open("rb") as f:
            head = f.read(4096)
    if not head:
        raise UploadError("The file is empty.")
    for magic, what in _MAGIC:
        if head.startswith(magic):
            raise UploadError(
                f"The file does not look like a CSV text file (it looks like {what})."
            )
    for encoding in ("utf-16-le", "utf-16-be", "utf-8"):
        if head.startswith(_BOMS[encoding]):
            has_bom = True
            break
    else:
        has_bom = False
        encoding = _guess_utf16(head) or "utf-8"
    skip = len(_BOMS[encoding]) if has_bom else 0
    if encoding.startswith("utf-16"):
        _check_utf16(path, data, encoding, skip)
        return encoding, has_bom
    return _check_8bit(path, data, has_bom)


def _check_utf16(path: Path, data: bytes | None, encoding: str, skip: int) -> None:
    """Strict: a lone surrogate is refused here. It cannot be stored as UTF-8 (Polars, the
    database), so a file holding one was accepted and charged, then failed its job."""
    decoder = codecs.getincrementaldecoder(encoding)(errors="strict")
    offset = skip
    try:
        for chunk in _chunks(path, data, skip):
            if "\x00" in decoder.decode(chunk):
                raise UploadError(_BINARY)
            offset += len(chunk)
        decoder.decode(b"", final=True)
    except UnicodeDecodeError as exc:
        if "surrogate" in exc.reason or "illegal" in exc.reason:
            at = offset + exc.start
            raise UploadError(
                f"The file looks like UTF-16 text but holds a broken character (an unpaired "
                f"surrogate) at byte {at:,}; save it again as UTF-8 or UTF-16."
            ) from None
        raise UploadError(
            "The file looks like UTF-16 text but is not valid UTF-16 (it may be cut off)."
        ) from None


def _check_8bit(path: Path, data: bytes | None, has_bom: bool) -> tuple[str, bool]:
    """UTF-8 if every byte decodes, else Windows-1252 if it has no undefined byte, else Latin-1."""
    if data is not None and b"\x00" not in data and data.isascii():
        return "utf-8", has_bom  # (two scans of the bytes, where the chunks below copy them)
    utf8 = codecs.getincrementaldecoder("utf-8")()
    utf8_ok = True
    for chunk in _chunks(path, data):
        if b"\x00" in chunk:
            raise UploadError(_BINARY)
        # ASCII with nothing pending decodes as it is: skip building the text (10x faster).
        if utf8_ok and not (chunk.isascii() and not utf8.getstate()[0]):
            try:
                utf8.decode(chunk)
            except UnicodeDecodeError:
                utf8_ok = False
    if utf8_ok:
        try:
            utf8.decode(b"", final=True)
            return "utf-8", has_bom
        except UnicodeDecodeError:
            pass
    # Not UTF-8; a UTF-8 "BOM" before it was not one: those bytes stay in the text as characters.
    for chunk in _chunks(path, data):
        if _CP1252_UNDEFINED.search(chunk):
            return "latin-1", False
    return "cp1252", False


def open_text(path: Path, encoding: str, has_bom: bool) -> TextIO:
    """The file's text after the BOM, line endings untouched (``newline=""``)."""
    raw = path.open("rb", buffering=_CHUNK)
    if has_bom:
        raw.seek(len(_BOMS[encoding]))
    return io.TextIOWrapper(raw, encoding=encoding, errors=codec_errors(encoding), newline="")


def open_info(path: Path, info: CsvInfo) -> TextIO:
    """:func:`open_text` for an inspected file."""
    return open_text(path, info.encoding, info.has_bom)


# --- records ---------------------------------------------------------------------------


def is_blank(fields: Sequence[str]) -> bool:
    """A blank record is not a row: an empty line or a single empty/whitespace field."""
    return not fields or (len(fields) == 1 and not fields[0].strip())


def _reader(lines: Any, delimiter: str) -> Any:
    return csv.reader(lines, delimiter=delimiter, quotechar=QUOTE, doublequote=True)


def iter_records(stream: TextIO, delimiter: str) -> Iterator[tuple[str, str, list[str] | None]]:
    """Yield ``(body, terminator, fields)`` per record, blank ones included.

    ``body + terminator`` is exactly the text the record spans, so joining them all gives back
    the whole text. A line without a quote character is a whole record; it comes with ``fields``
    None, meaning ``body.split(delimiter)`` (what the ``csv`` module would return; the caller
    splits only as far as it needs, which is most of the speed). A line with a quote goes to a
    C ``csv`` reader, which pulls its continuation lines itself and never reads ahead, so the
    lines taken meanwhile are exactly this record's.

    One repair: a quoted field still open at the end of the file (a stray ``"``) gets its
    closing quote added to ``body``, so a value appended after it is a cell of its own rather
    than more text of that field. It is the only way the text can differ from the file.
    """
    lines = iter(stream)
    queue: list[str] = []  # the line the reader is to parse next (at most one)
    pending: list[str] = []  # the lines of the record being parsed
    at_eof: list[bool] = []  # set when the reader ran out of lines inside a quoted field
    line_no = 0

    def source() -> Iterator[str]:
        nonlocal line_no
        while True:
            if queue:
                yield queue.pop()
                continue
            line = next(lines, None)
            if line is None:
                at_eof.append(True)
                return
            line_no += 1
            pending.append(line)
            yield line

    reader = _reader(source(), delimiter)
    for line in lines:
        line_no += 1
        if QUOTE not in line:
            body = line.rstrip("\r\n")
            yield body, line[len(body) :], None
            continue
        first_line = line_no
        queue.append(line)
        try:
            fields = next(reader, [])
        except csv.Error as exc:
            raise _csv_error(exc, first_line) from None
        if pending or at_eof:  # the record went on over more lines
            pending.insert(0, line)
            body, terminator = split_terminator("".join(pending))
            pending.clear()
            if at_eof:
                body += QUOTE
        else:
            body = line.rstrip("\r\n")
            terminator = line[len(body) :]
        yield body, terminator, fields


def iter_raw_records(stream: TextIO, delimiter: str) -> Iterator[tuple[str, list[str]]]:
    """``(raw_text, fields)`` per record, blank ones included (see :func:`iter_records`)."""
    for body, terminator, fields in iter_records(stream, delimiter):
        if fields is None:
            fields = body.split(delimiter) if body else []
        yield body + terminator, fields


def iter_data_records(stream: TextIO, delimiter: str, has_header: bool) -> Iterator[list[str]]:
    """Fields of each data row: blank records and the header skipped (same rule as writing)."""
    header_pending = has_header
    for _raw, fields in iter_raw_records(stream, delimiter):
        if is_blank(fields):
            continue
        if header_pending:
            header_pending = False
            continue
        yield fields


def iter_data_cells(
    stream: TextIO, delimiter: str, has_header: bool, indexes: Sequence[int]
) -> Iterator[list[str]]:
    """The cells at ``indexes`` of each data row (``""`` past a short row's end); the same rows
    as :func:`iter_data_records`, without splitting whole lines."""
    if len(indexes) == 1:
        for cell in iter_data_cell(stream, delimiter, has_header, indexes[0]):
            yield [cell]
        return
    maxsplit = max(indexes) + 1 if indexes else 0
    for body, fields in _data_bodies(stream, delimiter, has_header):
        parts = body.split(delimiter, maxsplit) if fields is None else fields
        n = len(parts)
        yield [parts[i] if i < n else "" for i in indexes]


def iter_data_cell(stream: TextIO, delimiter: str, has_header: bool, index: int) -> Iterator[str]:
    """One cell per data row (:func:`iter_data_cells` for one column, the hot path)."""
    maxsplit = index + 1
    for body, fields in _data_bodies(stream, delimiter, has_header):
        parts = body.split(delimiter, maxsplit) if fields is None else fields
        yield parts[index] if index < len(parts) else ""


def _data_bodies(
    stream: TextIO, delimiter: str, has_header: bool
) -> Iterator[tuple[str, list[str] | None]]:
    """``(body, fields)`` of data rows: blank records and the header skipped."""
    header_pending = has_header
    for body, _terminator, fields in iter_records(stream, delimiter):
        if fields is None:
            if delimiter not in body and not body.strip():
                continue
        elif not fields or (len(fields) == 1 and not fields[0].strip()):
            continue
        if header_pending:
            header_pending = False
            continue
        yield body, fields


def _csv_error(exc: csv.Error, line: int) -> UploadError:
    text = str(exc)
    if "NUL" in text:
        return UploadError(_BINARY)
    if "field larger than field limit" in text:
        return UploadError(
            f"Line {line} could not be read: a quoted field seems never to be closed "
            f'(a " opens a field that runs on for more than {csv.field_size_limit():,} '
            "characters)."
        )
    return UploadError(f"Line {line} could not be read as CSV ({text}).")


def split_terminator(raw: str) -> tuple[str, str]:
    """``raw`` split into body and line terminator (``\\r\\n``, ``\\n``, ``\\r`` or none)."""
    if raw.endswith("\r\n"):
        return raw[:-2], "\r\n"
    last = raw[-1:]
    if last in ("\n", "\r"):
        return raw[:-1], last
    return raw, ""


# --- native fast path --------------------------------------------------------------------
#
# Most uploads are plain: UTF-8, one record per line, quotes only around whole fields. For
# those, Polars (Rust, on every core) reads the file twice — as whole lines, and as CSV for the
# wanted column — and every line is checked to be one the tokenizer reads the same way; for
# any other file fast_data_cells returns None and the caller uses the tokenizer. The checks:
#
# * UTF-8 (BOM or not), no NUL, at most WHOLE_READ_MAX bytes and FAST_MAX_COLUMNS columns.
# * Lines: Polars' line count equals the LF count (+1 for an unterminated last line), and its
#   CSV read has as many rows; the lines' bytes plus all the LFs and CRs add up to the file's
#   size. Reading lines (no quote character, a separator the file lacks) Polars drops nothing
#   but line ends, so that sum means every CR was dropped with its line end (CRLF, or a final
#   CR) and none stayed inside a line, where Python would end a line and Polars does not.
#   (A separate search of every line for a CR cost 0.006 s per million lines and proved
#   nothing more; the bare-CR files in the tests are refused by the sum.)
# * Quotes: every line with a quote is whole, well-formed fields (``"…"`` with ``""`` inside,
#   or no quote at all) no longer than csv.field_size_limit(), so the csv reader ends its
#   record at the line's end with the RFC 4180 values, which Polars' quoted read gives too.
#   A line without a quote is ``line.split(delimiter)`` in the tokenizer and in Polars.
# * Blank records and blank cells use Python's whitespace (``str.strip``), not Rust's.

WHOLE_READ_MAX = 256 << 20
FAST_MAX_COLUMNS = 4096  # a million-column header costs Polars seconds, the tokenizer none

# Every character str.isspace() accepts (a test compares it with Python's).
PY_SPACES = (
    "\t\n\x0b\x0c\r\x1c\x1d\x1e\x1f \x85\xa0\u1680\u2000\u2001\u2002\u2003\u2004\u2005"
    "\u2006\u2007\u2008\u2009\u200a\u2028\u2029\u202f\u205f\u3000"
)
# Bytes a CSV rarely holds: one absent from the file is the separator that keeps lines whole.
_FREE_BYTES: tuple[str, ...] = tuple(chr(c) for c in (*range(1, 9), *range(14, 32)))


def _rx(char: str) -> str:
    """``char`` as a Rust regex escape, valid inside and outside a class."""
    return f"\\x{{{ord(char):x}}}"


def _space_class(but: str = "") -> str:
    return "[" + "".join(_rx(c) for c in PY_SPACES if c not in but) + "]"


_ALL_SPACE = f"^{_space_class()}*$"


def starts_oddly(expr: pl.Expr) -> pl.Expr:
    """Polars for "empty, or the first character is below ``!`` or from U+007F on": every
    cell that starts with a space (Python's or Unicode's) is one. A comparison, decided by the
    prefix a string view holds inline, costs a fifth of a regex anchored at the start."""
    return (expr < "!") | (expr >= "\x7f")


def space_only(expr: pl.Expr) -> pl.Expr:
    """Polars for ``not value.strip()`` (null counts as blank).

    The regex runs only on cells that :func:`starts_oddly` (the others are nulled first, and
    Polars skips nulls): 0.0012 s per million cells against 0.0058 s for the regex on all."""
    maybe = pl.when(starts_oddly(expr)).then(expr)
    return maybe.str.contains(_ALL_SPACE).fill_null(False) | expr.is_null()


def _line_patterns(delimiter: str) -> tuple[str, str]:
    """Regexes for a line of well-formed fields, and for a blank record: no delimiter and only
    spaces, or one quoted field of only spaces (a line holding a quote must also be valid)."""
    d = _rx(delimiter)
    field = f'(?:"(?:[^"]|"")*"|[^"{d}]*)'
    blank = f'^(?:"{_space_class()}*"|{_space_class(but=delimiter)}*)$'
    return f"^{field}(?:{d}{field})*$", blank


def fast_data_cells(
    data: bytes,
    encoding: str,
    has_bom: bool,
    delimiter: str,
    has_header: bool,
    index: int,
    *,
    checked: bool = False,
) -> pl.Series | None:
    """The cell at ``index`` of each data row as :func:`~verimail.files.csv_io.load_emails`
    holds it: the value :func:`iter_data_cell` reads, null when blank (``not value.strip()``,
    or past a short row's end). Read by Polars; None when the file needs the tokenizer.

    ``data`` is the whole file (BOM included). Safe to call on any file: every assumption is
    checked (see the comment above), and a file that fails one costs only this read.
    ``checked``: :func:`detect_encoding` passed these very bytes as UTF-8, so they hold no
    NUL and need no second search for one.
    """
    if encoding != "utf-8" or len(data) > WHOLE_READ_MAX:
        return None
    if not checked and b"\x00" in data:
        return None  # (the tokenizer refuses NUL bytes)
    if data.startswith(_INFLATED_BY_POLARS):
        return None  # Polars would read what it inflates, not the bytes
    first_line = data[: data.find(b"\n")] if b"\n" in data else data
    if first_line.count(delimiter.encode()) >= FAST_MAX_COLUMNS:
        return None  # Polars' cost grows with the width of the first line
    # The first spare byte is tried without a search: in a file holding it some line has two
    # fields, which Polars refuses (the line read is not told to truncate; a test pins
    # this), and then a byte the file does not hold is looked for (one search of the bytes
    # saved for nearly every file).
    cells = _checked_read(data, _FREE_BYTES[0], has_bom, delimiter, index)
    if cells is None and _FREE_BYTES[0].encode() in data:
        free = next((c for c in _FREE_BYTES if c.encode() not in data), None)
        cells = None if free is None else _checked_read(data, free, has_bom, delimiter, index)
    if cells is None:
        return None
    return cells.slice(1) if has_header else cells


def _checked_read(
    data: bytes, free: str, has_bom: bool, delimiter: str, index: int
) -> pl.Series | None:
    """:func:`_polars_read` with ``free`` keeping lines whole, if the lines match."""
    read = _polars_read(data, free, delimiter, index)
    if read is None:
        return None
    height, facts, cells = read
    body = len(data) - (len(_BOMS["utf-8"]) if has_bom else 0)
    return cells if _lines_match(facts, data, body, height) else None


def _polars_read(
    data: bytes, free: str, delimiter: str, index: int
) -> tuple[int, dict[str, Any], pl.Series] | None:
    """(lines, facts for :func:`_lines_match`, non-blank records' cells with blank ones null),
    None on any error.

    The lines are only summed up, in Polars' streaming engine, so they are never all in memory
    at once: a whole-file frame of lines cost more in fresh memory (page faults) than reading
    them did. Only the wanted column is kept, its blank cells made null in the same query (a
    second pass over the column, and the copy it makes, cost 0.015 s per million rows). The
    column is read first: in that order the two passes took 0.077 s against 0.081–0.10 s."""
    valid, blank = _line_patterns(delimiter)
    options: dict[str, Any] = {"has_header": False, "infer_schema": False}
    lines = pl.scan_csv(data, separator=free, quote_char=None, new_columns=["line"], **options)
    line = pl.col("line")
    is_blank = line.str.contains(blank).fill_null(True)
    maybe_blank = line  # a blank line holds no delimiter, unless the delimiter is a space
    if delimiter not in PY_SPACES:  # (a regex on every line costs more than this filter)
        maybe_blank = line.filter(~line.str.contains(delimiter, literal=True).fill_null(False))
    quoted = line.filter(line.str.contains('"', literal=True))
    size = line.str.len_bytes()
    try:
        cell = pl.nth(index)  # (null where a short row ends before it)
        cells = (
            pl.scan_csv(data, separator=delimiter, truncate_ragged_lines=True, **options)
            .select(pl.when(space_only(cell)).then(None).otherwise(cell))
            .collect()
            .to_series()
        )
        line_facts, byte_facts = pl.collect_all(
            [
                lines.select(
                    lines=pl.len(),
                    size=size.sum(),
                    blanks=maybe_blank.str.contains(blank).fill_null(True).sum(),
                    valid=quoted.str.contains(valid).all(),
                    longest=size.max(),
                ),
                _line_breaks(data),
            ],
            engine="streaming",
        )
        found = {**line_facts.row(0, named=True), **byte_facts.row(0, named=True)}
        if cells.len() != found["lines"]:
            return None
        if (found["longest"] or 0) > csv.field_size_limit():
            # Only a quoted field is held to the limit. The longest of all lines costs
            # nothing beside their sizes, where the longest quoted line cost 0.006 s more
            # per million lines; it is needed only when some line is this long.
            quoted_sizes = lines.select(quoted.str.len_bytes().max())
            found["longest"] = quoted_sizes.collect(engine="streaming").item()
        if found["blanks"]:  # blank records are not rows; rare enough for a second pass
            kept = lines.select(~is_blank).collect(engine="streaming").to_series()
            cells = cells.filter(kept)
    except (pl.exceptions.PolarsError, pl.exceptions.PanicException, OSError):
        return None  # whatever Polars cannot read, the tokenizer reads or explains
    return found["lines"], found, cells


class _ArrowBytes:
    """A ``UInt8`` Arrow view of ``data``, handed to Polars through the Arrow PyCapsule
    interface: zero-copy, and unlike ``pl.from_arrow`` it does not import
    ``pyarrow.compute`` (~0.1 s on first use)."""

    def __init__(self, data: bytes) -> None:
        self._array = pa.Array.from_buffers(pa.uint8(), len(data), [None, pa.py_buffer(data)])

    def __arrow_c_array__(self, requested_schema: object = None) -> tuple[object, object]:
        return self._array.__arrow_c_array__(requested_schema)


def _line_breaks(data: bytes) -> pl.LazyFrame:
    """``lf`` and ``crs``: the file's LF and CR counts, the independent count Polars' lines
    must match. Counted by Polars over a zero-copy view of ``data`` (``bytes.count`` takes
    ~40 ms per 100 MB for each byte value, holding the GIL)."""
    byte = pl.col("byte")
    view = pl.Series(_ArrowBytes(data)).to_frame("byte")
    return view.lazy().select(lf=(byte == 10).sum(), crs=(byte == 13).sum())


def _lines_match(facts: dict[str, Any], data: bytes, body: int, height: int) -> bool:
    """Polars' lines are Python's, and csv reads each as Polars did (see the section comment)."""
    lf = facts["lf"]
    if height != lf + (not data.endswith(b"\n")):
        return False
    if body - facts["size"] - lf != facts["crs"]:  # the bytes Polars dropped: LFs and CRs
        return False
    return facts["valid"] is not False and (facts["longest"] or 0) <= csv.field_size_limit()


# --- sample, delimiter, header ---------------------------------------------------------


def _read_sample(path: Path, encoding: str, has_bom: bool) -> tuple[str, bool]:
    """The first ≥64 K characters cut at a line end, and whether that is the whole file.

    The sample grows until it holds a line end, so a first line (the header) is read whole
    however long it is: the file itself is bounded by the upload limit, and a header cut
    short would hide the columns past the cut.
    """
    size = _SAMPLE_CHARS
    while True:
        with open_text(path, encoding, has_bom) as f:
            text = f.read(size + 1)
        if len(text) <= size:
            return text, True
        text = text[:size]
        cut = max(text.rfind("\n"), text.rfind("\r"))
        if cut > 0:
            return text[: cut + 1], False
        size *= 4


def _sample_rows(text: str, delimiter: str, complete: bool) -> list[list[str]]:
    rows: list[list[str]] = []
    cut = False
    try:
        for _raw, fields in iter_raw_records(io.StringIO(text, newline=""), delimiter):
            if not is_blank(fields):
                rows.append(fields)
            if len(rows) > _SAMPLE_RECORDS:
                cut = True
                break
    except UploadError:
        cut = True
    if not complete and not cut and len(rows) > 1:
        rows.pop()  # may be cut by the sample's end (an open quoted field)
    return rows[:_SAMPLE_RECORDS]


def _choose_delimiter(text: str, complete: bool) -> tuple[str, list[list[str]]]:
    """The candidate that splits the first record and gives the most regular, widest rows."""
    best: tuple[tuple[bool, int, float, int], str, list[list[str]]] | None = None
    for priority, delimiter in enumerate(DELIMITERS):
        rows = _sample_rows(text, delimiter, complete)
        if not rows or len(rows[0]) < 2:
            continue
        width, n = Counter(len(r) for r in rows).most_common(1)[0]
        share = n / len(rows)
        key = (share >= 0.9, width, share, -priority)
        if best is None or key > best[0]:
            best = (key, delimiter, rows)
    if best is None:
        return ",", _sample_rows(text, ",", complete)
    return best[1], best[2]


def _first_terminator(text: str, delimiter: str) -> str:
    for raw, fields in iter_raw_records(io.StringIO(text, newline=""), delimiter):
        if not is_blank(fields):
            return split_terminator(raw)[1] or "\n"
    return "\n"


def _holds_address(cell: str) -> bool:
    """Whether a first-row cell makes the file headerless: it holds an "@" and, trimmed, no
    space (but in a quoted local part, ``"john smith"@x.com``). Looser than
    :func:`looks_like_email` on purpose — a headerless file whose first address is
    malformed (``john@gmail``) must not lose that row as a header — while a header such as
    ``Email @ work`` is still a header."""
    local, at, domain = cell.strip().rpartition("@")
    if not at or any(c.isspace() for c in domain):
        return False
    quoted = len(local) >= 2 and local.startswith('"') and local.endswith('"')
    return quoted or not any(c.isspace() for c in local)


def looks_delimited(lines: Sequence[str]) -> bool:
    """Most of the first lines hold a delimiter the reader knows (:data:`DELIMITERS`): records
    of several fields, not one address a line (``verimail verify --file`` refuses such a
    file, whose lines would each be checked whole and come back invalid)."""
    sample = lines[:20]
    split = [line for line in sample if any(d in line for d in DELIMITERS)]
    return len(split) * 2 > len(sample)


def looks_like_email(value: str) -> bool:
    """Loose shape test for detection only: one ``@``, text before it, a dotted domain after."""
    value = value.strip()
    if value.count("@") != 1 or any(c.isspace() for c in value):
        return False
    local, domain = value.split("@")
    return bool(local) and "." in domain.strip(".")


# --- column matching -------------------------------------------------------------------

_KEY_DROP = re.compile(r"[\s_\-.\ufeff\u200b]+")


def header_key(name: str) -> str:
    """Case- and separator-blind form of a header: ``E-mail Address`` → ``emailaddress``."""
    return _KEY_DROP.sub("", name.removeprefix("ï»¿")).casefold()


def _listing(columns: Sequence[str], limit: int = 20) -> str:
    """Column names for a message: blanks shown, long names and long lists shortened."""
    shown = [
        (c if len(c) <= 40 else c[:39] + "…") if c.strip() else "(blank)" for c in columns[:limit]
    ]
    more = f" … ({len(columns)} in all)" if len(columns) > limit else ""
    return ", ".join(shown) + more


def resolve_column(columns: Sequence[str], wanted: str, param: str) -> int:
    """0-based index of the column a person named.

    ``#N`` is always the Nth column (what the dashboard's picker sends, and what a job
    stores when a header is used twice). Otherwise, in order: exact name; same name ignoring
    case and surrounding spaces; same :func:`header_key`; a whole number as a 1-based
    position (``1`` is the first column); ``column_N`` (the names headerless files get).
    First match wins among duplicates.
    """
    position = re.fullmatch(r"#(\d+)", wanted.strip())
    if position and 1 <= int(position.group(1)) <= len(columns):
        return int(position.group(1)) - 1
    if wanted in columns:
        return list(columns).index(wanted)
    folded = wanted.strip().casefold()
    for i, c in enumerate(columns):
        if c.strip().casefold() == folded:
            return i
    key = header_key(wanted)
    for i, c in enumerate(columns):
        if key and header_key(c) == key:
            return i
    match = re.fullmatch(r"(?:column[ _]?)?(\d+)", folded)
    if match and 1 <= int(match.group(1)) <= len(columns):
        return int(match.group(1)) - 1
    raise UploadError(
        f"{param} '{wanted}' is not a column of the file; columns are: {_listing(columns)}."
        + (" A number counts columns from 1." if match else "")
    )


def _by_header(columns: Sequence[str], names: Sequence[str]) -> int | None:
    keys = [header_key(c) for c in columns]
    for name in names:
        if name in keys:
            return keys.index(name)
    return None


def _by_content(columns: Sequence[str], data: Sequence[Sequence[str]]) -> int | None:
    """The column where most sampled non-blank values look like addresses (at least half)."""
    best: tuple[float, int, int] | None = None
    for i in range(len(columns)):
        values = [r[i] for r in data if i < len(r) and r[i].strip()]
        hits = sum(1 for v in values if looks_like_email(v))
        if not hits:
            continue
        share = hits / len(values)
        if share >= 0.5 and (best is None or (share, hits) > best[:2]):
            best = (share, hits, i)
    return best[2] if best else None


def find_person_columns(
    info: CsvInfo,
    first: str | None = None,
    last: str | None = None,
    domain: str | None = None,
) -> PersonColumns:
    """Columns for the Email Finder: the caller's names (see :func:`resolve_column`), else the
    recognised headers; one UploadError names every column still missing."""
    found: dict[str, int] = {}
    missing: list[tuple[str, str]] = []
    specs = (
        ("first_name", first, FIRST_NAME_HEADERS, "first-name"),
        ("last_name", last, LAST_NAME_HEADERS, "last-name"),
        ("domain", domain, DOMAIN_HEADERS, "company-domain"),
    )
    for field, wanted, names, label in specs:
        if wanted is not None and wanted.strip():
            found[field] = resolve_column(info.columns, wanted, f"{field}_column")
            continue
        index = _by_header(info.columns, names) if info.has_header else None
        if index is None:
            missing.append((label, f"{field}_column"))
        else:
            found[field] = index
    if missing:
        labels = " or ".join(label for label, _ in missing)
        params = ", ".join(param for _, param in missing)
        raise UploadError(
            f"No {labels} column found; columns are: {_listing(info.columns)}. "
            f"Pass {params} to choose {'it' if len(missing) == 1 else 'them'}."
        )
    return PersonColumns(
        first_name=info.columns[found["first_name"]],
        last_name=info.columns[found["last_name"]],
        domain=info.columns[found["domain"]],
        first_name_index=found["first_name"],
        last_name_index=found["last_name"],
        domain_index=found["domain"],
    )


# --- inspect ---------------------------------------------------------------------------


def inspect_csv(
    path: Path | str,
    *,
    max_rows: int,
    email_column: str | None = None,
    need_email: bool = True,
) -> CsvInfo:
    """Sniff the file and count its rows; raise UploadError with a sentence a person understands.

    With ``need_email`` (bulk verification) the email column is ``email_column`` when given
    (:func:`resolve_column`), else the first recognised header (:data:`EMAIL_HEADERS`), else
    the column whose sampled values mostly look like addresses; a file without one, or whose
    email cells are all blank, is refused. With ``need_email=False`` (Email Finder) the email
    fields stay empty unless ``email_column`` is given. More than ``max_rows`` data rows raises
    UploadTooLarge. CPU-bound (≈0.3 s per million rows of a plain UTF-8 file, which the
    native fast path counts; ≈1-3 s through the tokenizer): call it from a worker thread.
    """
    return inspect_csv_cells(
        path, max_rows=max_rows, email_column=email_column, need_email=need_email
    )[0]


def inspect_csv_cells(
    path: Path | str,
    *,
    max_rows: int,
    email_column: str | None = None,
    need_email: bool = True,
) -> tuple[CsvInfo, pl.Series | None]:
    """:func:`inspect_csv`, plus the email cell of every data row (null when blank) when the
    native fast path counted them (None otherwise), so loading needs no second read."""
    path = Path(path)
    raw = read_whole(path)
    encoding, has_bom = detect_encoding(path, raw)
    sample, complete = _read_sample(path, encoding, has_bom)
    if not sample.strip():
        raise UploadError("The file is empty.")
    controls = len(_CONTROL.findall(sample))
    if controls > max(2, len(sample) // 100):
        raise UploadError(_BINARY)
    delimiter, rows = _choose_delimiter(sample, complete)
    if not rows:
        raise UploadError("The file is empty.")
    first = rows[0]
    has_header = not any(_holds_address(cell) for cell in first)
    data = rows[1:] if has_header else rows
    width = Counter(len(r) for r in data).most_common(1)[0][0] if data else len(first)
    if max(width, len(first)) > MAX_COLUMNS:
        raise UploadTooLarge(
            f"The file has {max(width, len(first)):,} columns; at most {MAX_COLUMNS:,} "
            "columns are accepted."
        )
    if has_header:
        columns = tuple(first) + tuple(f"column_{i + 1}" for i in range(len(first), width))
    else:
        columns = tuple(f"column_{i + 1}" for i in range(max(width, len(first))))
    if has_header and complete and not data:
        raise UploadError(
            "The file has a header row but no data rows"
            + (", so there are no addresses to verify." if need_email else ".")
        )

    email_index: int | None = None
    if email_column is not None and email_column.strip():
        try:
            email_index = resolve_column(columns, email_column, "email_column")
        except UploadError as exc:
            if has_header:
                raise
            raise UploadError(
                exc.detail + " The first row holds an address, so the file has no header row."
            ) from None
    elif need_email:
        email_index = _by_header(columns, EMAIL_HEADERS) if has_header else None
        if email_index is None:
            email_index = _by_content(columns, data)
        if email_index is None:
            raise UploadError(
                f"No email column found; columns are: {_listing(columns)}. "
                "Pass email_column to choose one."
            )

    cells = None
    if raw is not None:
        index = email_index or 0
        cells = fast_data_cells(raw, encoding, has_bom, delimiter, has_header, index, checked=True)
        raw = None  # the tokenizer below streams the file: do not hold it meanwhile
    if cells is None:
        row_count, email_count = _count(
            path, encoding, has_bom, delimiter, has_header, email_index, max_rows
        )
    else:
        if cells.len() > max_rows:
            raise _too_many_rows(max_rows)
        row_count = cells.len()
        if email_index is None:
            cells, email_count = None, 0
        else:
            email_count = row_count - cells.null_count()
    if row_count == 0:
        raise UploadError(
            "The file has a header row but no data rows"
            + (", so there are no addresses to verify." if need_email else ".")
        )
    email_name = columns[email_index] if email_index is not None else None
    if need_email and email_count == 0:
        raise UploadError(f"Column '{email_name}' has no addresses in any row.")
    info = CsvInfo(
        encoding=encoding,
        has_bom=has_bom,
        delimiter=delimiter,
        has_header=has_header,
        columns=columns,
        line_terminator=_first_terminator(sample, delimiter),
        row_count=row_count,
        email_column=email_name,
        email_index=email_index,
        email_count=email_count,
    )
    return info, cells


def _count(
    path: Path,
    encoding: str,
    has_bom: bool,
    delimiter: str,
    has_header: bool,
    email_index: int | None,
    max_rows: int,
) -> tuple[int, int]:
    """(data rows, rows with a non-blank email cell); stops at ``max_rows`` + 1."""
    rows = emails = 0
    with open_text(path, encoding, has_bom) as f:
        if email_index is None:
            cells: Iterator[Any] = _data_bodies(f, delimiter, has_header)
        else:
            cells = iter_data_cell(f, delimiter, has_header, email_index)
        for cell in cells:
            rows += 1
            if rows > max_rows:
                raise _too_many_rows(max_rows)
            if email_index is not None and cell.strip():
                emails += 1
    return rows, emails


def _too_many_rows(max_rows: int) -> UploadTooLarge:
    return UploadTooLarge(f"The file has more than {max_rows:,} rows.")
