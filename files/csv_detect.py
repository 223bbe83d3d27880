"""Sniff an uploaded CSV: encoding, delimiter, header, row count and the columns we need.

The inspection (:func:`inspect_csv`) puts the parts together: the encoding
(:mod:`~verimail.files.csv_encoding`), a sample of records read by the one tokenizer
(:mod:`~verimail.files.csv_records`) to choose the delimiter and tell a header, the email
column (:mod:`~verimail.files.csv_columns`), and the rows counted by the native fast path
(:mod:`~verimail.files.csv_fast_path`) when it can prove the file plain, else by the
tokenizer. What it learns is a :class:`CsvInfo`, which every later pass reads the file by.

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

import contextlib
import io
import re
from collections import Counter
from collections.abc import Iterator, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import polars as pl

from verimail.files.csv_columns import (
    EMAIL_HEADERS,
    column_by_content,
    column_by_header,
    column_listing,
    email_like_columns,
    resolve_column,
)
from verimail.files.csv_encoding import detect_encoding, open_text
from verimail.files.csv_fast_path import fast_data_cells, read_whole
from verimail.files.csv_records import (
    QUOTE,
    UnclosedQuote,
    is_blank,
    iter_data_bodies,
    iter_data_cell,
    iter_raw_records,
    split_terminator,
)
from verimail.files.upload_errors import BINARY_DATA, UploadError, UploadTooLarge

DELIMITERS: tuple[str, ...] = (",", ";", "\t", "|")

_SAMPLE_CHARS = 64 * 1024
MAX_COLUMN_REFERENCE = 200
"""Longest header a job row keeps as its ``email_column`` (``String(200)`` in
``store/tables.py``); a longer one is referred to by position."""
MAX_COLUMNS = 20_000
"""Most columns a file may have (header or widest row); beyond it the upload is refused (413).
The header is read whole, so every column up to this limit can be found. More than any
spreadsheet holds (Excel 16,384, Google Sheets 18,278); at 1,000,000 each accepted upload's
names were held several times over (the inspection, the job's stored copy, its run, the
results file) and an API process running such jobs kept ~30 MB more per upload (issue 47)."""
_SAMPLE_RECORDS = 200
_CONTROL = re.compile(r"[\x00-\x08\x0e-\x1f\x7f]")


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
    other_email_columns: tuple[str, ...] = ()
    """Columns that look like email columns too (by header or content) but were not chosen:
    a file with ``email`` and ``work_email`` is verified on the first, and each surface says
    so (:meth:`column_notice`). Empty when the caller named the column."""

    def to_dict(self) -> dict[str, Any]:
        """JSON-able form, e.g. for a job row or a Prefect flow parameter."""
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> CsvInfo:
        """Inverse of :meth:`to_dict`."""
        others = tuple(data.get("other_email_columns", ()))
        return cls(**{**data, "columns": tuple(data["columns"]), "other_email_columns": others})

    def column_notice(self, advice: str) -> str | None:
        """The sentence telling which of several address columns is verified (None when
        there is one), ``advice`` (how this surface chooses another) after it."""
        if not self.other_email_columns or self.email_column is None:
            return None
        listed = ", ".join(repr(c) for c in (self.email_column, *self.other_email_columns))
        return (
            f"More than one column holds addresses ({listed}): {self.email_column!r} is "
            f"verified. {advice}"
        ).strip()

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
    except UnclosedQuote:
        if complete:  # (the whole file: the quote is never closed, not cut by the sample)
            raise
        cut = True
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
    :func:`~verimail.files.csv_columns.looks_like_email` on purpose — a headerless file
    whose first address is malformed (``john@gmail``) must not lose that row as a header —
    while a header such as ``Email @ work`` is still a header."""
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
        raise UploadError(BINARY_DATA)
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
    others: tuple[str, ...] = ()
    if email_column is not None and email_column.strip():
        try:
            email_index = resolve_column(columns, email_column, "email_column")
        except UploadError as exc:
            if has_header:
                raise
            raise UploadError(
                exc.base + " The first row holds an address, so the file has no header row.",
                fields=exc.fields,
            ) from None
    elif need_email:
        email_index = column_by_header(columns, EMAIL_HEADERS) if has_header else None
        if email_index is None:
            email_index = column_by_content(columns, data)
        if email_index is not None:
            others = tuple(
                columns[i]
                for i in email_like_columns(columns, data, has_header)
                if i != email_index
            )
        if email_index is None:
            raise UploadError(
                f"No email column found; columns are: {column_listing(columns)}.",
                advice="Pass email_column to choose one.",
                fields=("email_column",),
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
        other_email_columns=others,
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
            cells: Iterator[Any] = iter_data_bodies(f, delimiter, has_header)
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
