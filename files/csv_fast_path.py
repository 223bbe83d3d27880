"""The native fast path: the cells of one column read by Polars (Rust, on every core), for
files checked to read exactly as the tokenizer (:mod:`verimail.files.csv_records`) reads them.
Counting and loading one column take it when they can (~6x faster); any other file is left
to the tokenizer.
"""

from __future__ import annotations

import codecs
import csv
from pathlib import Path
from typing import Any

import polars as pl
import pyarrow as pa

from verimail.files.file_read import read_file

# Polars inflates a source that starts like a zlib stream (or gzip, zstd) on its own: such
# a file is left to the tokenizer, which reads its bytes as they are ("x^" is text too).
_ZLIB_HEADERS = (b"\x78\x01", b"\x78\x5e", b"\x78\x9c", b"\x78\xda")
# Every stream Polars inflates by itself when it sees its signature (zlib, gzip, Zstandard).
_INFLATED_BY_POLARS = (*_ZLIB_HEADERS, b"\x1f\x8b", b"\x28\xb5\x2f\xfd")

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
    body = len(data) - (len(codecs.BOM_UTF8) if has_bom else 0)
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


def read_whole(path: Path) -> bytes | None:
    """The file's bytes when it is small enough to hold (one read serves every check and the
    native fast path), else None: larger files are streamed."""
    if path.stat().st_size > WHOLE_READ_MAX:
        return None
    return read_file(path)
