"""The one tokenizer every pass reads an upload through: records, their exact text, the
cells of data rows.

:func:`iter_records` has CPython's C ``csv`` semantics over the decoded text, with a split
fast path for lines without quotes. Counting, loading and writing all use it, so the n-th
data row means the same record everywhere and an appended value can never slide onto a
neighbouring row. Blank records (an empty line, or a line holding one empty /
whitespace-only field) are not rows: they are not counted, not loaded, and written back
unchanged with nothing appended.
"""

from __future__ import annotations

import csv
from collections.abc import Iterator, Sequence
from typing import Any, TextIO

from verimail.files.upload_errors import BINARY_DATA, UploadError

QUOTE = '"'


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

    A quoted field still open at the end of the file (a stray ``"``) that took in the lines
    after its own is refused (:func:`unclosed_quote`): those lines would silently have become
    one cell of one row. On the last line alone it is repaired: its closing quote is added to
    ``body``, so a value appended after it is a cell of its own rather than more text of that
    field. It is the only way the text can differ from the file.
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
        if at_eof and pending:
            raise unclosed_quote(first_line, len(pending))
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
    for body, fields in iter_data_bodies(stream, delimiter, has_header):
        parts = body.split(delimiter, maxsplit) if fields is None else fields
        n = len(parts)
        yield [parts[i] if i < n else "" for i in indexes]


def iter_data_cell(stream: TextIO, delimiter: str, has_header: bool, index: int) -> Iterator[str]:
    """One cell per data row (:func:`iter_data_cells` for one column, the hot path)."""
    maxsplit = index + 1
    for body, fields in iter_data_bodies(stream, delimiter, has_header):
        parts = body.split(delimiter, maxsplit) if fields is None else fields
        yield parts[index] if index < len(parts) else ""


def iter_data_bodies(
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


class UnclosedQuote(UploadError):
    """A quoted field open at the end of the file, which took in the lines after its own."""


def unclosed_quote(line: int, swallowed: int) -> UnclosedQuote:
    """A ``"`` on ``line`` opens a field never closed: the ``swallowed`` lines after it, to the
    end of the file, would be read as text of that one cell (issue 36: a row vanished so)."""
    after = "the next line" if swallowed == 1 else f"all {swallowed:,} lines after it"
    return UnclosedQuote(
        f'Line {line} could not be read: a " there opens a quoted field that is never closed, '
        f"so {after} would be read as part of one cell. Close the quote (or remove the stray "
        f'"; a " inside a quoted field is written "").'
    )


def _csv_error(exc: csv.Error, line: int) -> UploadError:
    text = str(exc)
    if "NUL" in text:
        return UploadError(BINARY_DATA)
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
