"""CSV uploads end to end: save the upload, sniff it, load its columns, write the results file.

Why one long file: saving, loading and writing an upload share its dialect and encoding, so
the results file is the upload byte for byte plus columns.

The results file is the original file byte for byte with columns appended at the end of each
record (``Safe to Send`` for bulk verification; ``email``, ``status``, ``confidence`` for the
Email Finder). To make that safe, one tokenizer decides where records start and end for
counting, loading and writing alike (see :mod:`verimail.files.csv_records`). Polars holds the
loaded columns and does the vectorised normalising and de-duplication. It parses the file
itself only on the fast path (``fast_data_cells``), for files where every line is checked to
read the same both ways: Polars 2.1 refuses real-world quoting that spreadsheets produce
(``5" screen``, ``"abc"def``), does not split on bare-CR line endings and reads only UTF-8,
so any such file, and any file it cannot prove plain, goes through the tokenizer, and row *n*
is the same record everywhere.
"""

from __future__ import annotations

import contextlib
import io
import itertools
import os
import re
import secrets
import uuid
from collections.abc import AsyncIterator, Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any, BinaryIO, TextIO

import polars as pl

from verimail.files.csv_columns import (
    EMAIL_HEADERS,
    PersonColumns,
    find_person_columns,
    looks_like_email,
    resolve_column,
)
from verimail.files.csv_detect import DELIMITERS, CsvInfo, inspect_csv, inspect_csv_cells
from verimail.files.csv_encoding import bom_bytes, codec_errors, open_info
from verimail.files.csv_fast_path import fast_data_cells, read_whole, starts_oddly
from verimail.files.csv_records import is_blank, iter_data_cell, iter_data_cells, iter_records
from verimail.files.upload_errors import UploadError, UploadTooLarge

__all__ = [
    "DELIMITERS",
    "EMAIL_HEADERS",
    "FORMULA_PREFIXES",
    "CsvInfo",
    "PersonColumns",
    "UploadError",
    "UploadTooLarge",
    "distinct_in_order",
    "find_person_columns",
    "finder_columns",
    "finder_result_names",
    "inspect_csv",
    "load_emails",
    "load_person_rows",
    "looks_like_email",
    "normalise_emails",
    "read_emails",
    "read_finder_upload",
    "resolve_column",
    "save_upload",
    "save_upload_sync",
    "unique_emails",
    "values_for_rows",
    "write_finder_results",
    "write_results_csv",
]

_CHUNK = 1 << 20

# OWASP "CSV injection": a spreadsheet runs a cell starting with one of these as a formula.
FORMULA_PREFIXES: tuple[str, ...] = ("=", "+", "-", "@", "\t", "\r")


# --- saving an upload ------------------------------------------------------------------


def _size_text(n: int) -> str:
    for unit, size in (("GB", 1 << 30), ("MB", 1 << 20), ("KB", 1 << 10)):
        if n >= size and n % size == 0:
            return f"{n // size} {unit}"
    return f"{n:,} bytes"


def _too_large(max_bytes: int) -> UploadTooLarge:
    return UploadTooLarge(f"The file is larger than the {_size_text(max_bytes)} upload limit.")


async def save_upload(chunks: AsyncIterator[bytes], dest: Path, max_bytes: int) -> int:
    """Stream an upload to ``dest`` and return its size.

    Past ``max_bytes`` it stops reading (closing the source), deletes the partial file and
    raises UploadTooLarge, so an oversized upload never fills the disk. Chunk writes are
    plain blocking writes: a local write of one ≤1 MiB chunk is far shorter than a network read.
    """
    dest = Path(dest)
    dest.parent.mkdir(parents=True, exist_ok=True)
    total = 0
    try:
        with dest.open("wb") as out:
            async for chunk in chunks:
                total += len(chunk)
                if total > max_bytes:
                    raise _too_large(max_bytes)
                out.write(chunk)
    except BaseException:
        aclose = getattr(chunks, "aclose", None)
        if aclose is not None:
            # The source's own clean-up failing must not hide our error.
            with contextlib.suppress(Exception):
                await aclose()
        dest.unlink(missing_ok=True)
        raise
    return total


def save_upload_sync(source: BinaryIO | Iterable[bytes], dest: Path, max_bytes: int) -> int:
    """:func:`save_upload` for the CLI: ``source`` is a binary file or an iterable of chunks."""
    dest = Path(dest)
    dest.parent.mkdir(parents=True, exist_ok=True)
    if hasattr(source, "read"):
        reader = source
        chunks: Iterable[bytes] = iter(lambda: reader.read(_CHUNK), b"")  # type: ignore[union-attr]
    else:
        chunks = source  # type: ignore[assignment]
    total = 0
    try:
        with dest.open("wb") as out:
            for chunk in chunks:
                total += len(chunk)
                if total > max_bytes:
                    raise _too_large(max_bytes)
                out.write(chunk)
    except BaseException:
        dest.unlink(missing_ok=True)
        raise
    return total


# --- loading ---------------------------------------------------------------------------


def _row_index(n: int) -> pl.Series:
    return pl.int_range(0, n, dtype=pl.Int64, eager=True).alias("row")


def load_emails(path: Path | str, info: CsvInfo) -> pl.DataFrame:
    """``row`` (0-based data row, the order :func:`write_results_csv` expects values in) and
    ``email`` (the cell as typed; null when blank or missing from a short row).

    Read by the native fast path when the file allows it (same values; see
    :func:`~verimail.files.csv_fast_path.fast_data_cells`), else by the tokenizer."""
    index = info.email_index
    if index is None:
        raise ValueError("CsvInfo has no email column; inspect the file with need_email=True")
    path = Path(path)
    raw = read_whole(path) if info.encoding == "utf-8" else None
    if raw is not None:
        cells = fast_data_cells(
            raw, info.encoding, info.has_bom, info.delimiter, info.has_header, index
        )
        if cells is not None:
            return _email_frame(cells)
    return _load_emails_tokenized(path, info, index)


def _load_emails_tokenized(path: Path, info: CsvInfo, index: int) -> pl.DataFrame:
    """The tokenizer's read: any file the sniffer accepts, ~1 s per million rows."""
    emails: list[str | None] = []
    add = emails.append
    with open_info(path, info) as f:
        for value in iter_data_cell(f, info.delimiter, info.has_header, index):
            add(value if value.strip() else None)
    return pl.DataFrame([_row_index(len(emails)), pl.Series("email", emails, dtype=pl.String)])


def _email_frame(emails: pl.Series) -> pl.DataFrame:
    """:func:`load_emails`' frame from fast-path cells, blank ones already null."""
    return pl.DataFrame([_row_index(emails.len()), emails.alias("email")])


def read_emails(
    path: Path | str, *, max_rows: int, email_column: str | None = None
) -> tuple[CsvInfo, pl.DataFrame]:
    """:func:`inspect_csv` then :func:`load_emails`, reading the file once when the fast path
    applies (its count and its cells come from the same read)."""
    path = Path(path)
    info, cells = inspect_csv_cells(path, max_rows=max_rows, email_column=email_column)
    if cells is not None:
        return info, _email_frame(cells)
    if info.email_index is None:  # need_email: inspect_csv refuses a file without one
        raise ValueError("inspect_csv returned no email column")
    return info, _load_emails_tokenized(path, info, info.email_index)


# A cell whose normalised form may not be the cell itself: empty, a space or a non-ASCII
# character at either end (strip_chars trims Unicode White_Space), or an upper-case ASCII
# letter or a non-ASCII character after the last "@" (to_lowercase). Spelled in ASCII terms
# on purpose: the regex crate's Unicode tables can be older than the ones Rust's
# to_lowercase uses, so \p{Changes_When_Lowercased} missed letters it lower-cases.
_EDGE = r"[\t\n\x0B\x0C\r \x80-\x{10FFFF}]"
_ODD_END = rf"(?:{_EDGE}|@[^@]*[A-Z\x80-\x{{10FFFF}}][^@]*)$"


def _needs_normalising(email: pl.Expr) -> pl.Expr:
    """The cells above, and a few more that normalising leaves as they are (a control
    character first): the start is a comparison (:func:`starts_oddly`, 0.0012 s per million
    cells against 0.0057 s for a regex), the end a regex anchored there."""
    return starts_oddly(email) | email.str.contains(_ODD_END)


def _normalised(email: pl.Expr) -> pl.Expr:
    """The normalised form of each cell (see :func:`normalise_emails`).

    The domain is what follows the last ``@``. (Split + slice, not a capturing regex: 20x
    faster on a million rows.)"""
    trimmed = email.str.strip_chars()
    domain = pl.when(trimmed.str.contains("@", literal=True)).then(
        trimmed.str.split("@").list.last()
    )
    has_domain = domain.str.len_chars() > 0
    local = trimmed.str.head(trimmed.str.len_chars() - domain.str.len_chars() - 1)
    return (
        pl.when(has_domain)
        .then(pl.concat_str(local, pl.lit("@"), domain.str.to_lowercase()))
        .otherwise(pl.when(trimmed.str.len_chars() > 0).then(trimmed))
    )


def normalise_emails(df: pl.DataFrame) -> pl.DataFrame:
    """Add ``normalised``: the cell trimmed, its domain lower-cased, its local part kept as
    typed (it may be case-sensitive); null when blank. IDNA encoding is left to the syntax
    check.

    Most cells are normalised already, so only the others are worked on and put in place:
    the column shares the rest with ``email``. (Rewriting every cell cost more in fresh
    memory than in work: 0.2 s per million rows, against ~0.03 s for this.) One query finds
    the cells and normalises them: a second one gathering them by position cost 0.01 s more
    per million rows."""
    email = pl.col("email")
    todo = (
        df.lazy()
        .with_row_index("at")
        .filter(_needs_normalising(email))
        .select("at", fixed=_normalised(email))
        .collect()
    )
    normalised = df.get_column("email").alias("normalised")
    if todo.height:
        normalised = normalised.rechunk().scatter(todo.get_column("at"), todo.get_column("fixed"))
    return df.with_columns(normalised)


# Drawn per process, so nobody can prepare an upload whose addresses collide on both.
_DEDUPE_SEED, _CHECK_SEED = secrets.randbits(63), secrets.randbits(63)


def _hash_key(value: pl.Expr, seed: int) -> pl.Expr:
    """The 64-bit key :func:`distinct_in_order` dedupes on (a test swaps in a colliding one)."""
    return value.hash(seed)


def distinct_in_order(values: pl.Series) -> pl.Series:
    """The non-null values, each once, in first-seen order.

    Deduped on a 64-bit hash of each value (a hash table of strings costs 3-4x more), then
    checked: a second, independent hash must find as many distinct values. Two values that
    share a hash make the counts differ (unless both hashes collide alike, ~1e-15 at a
    million values), and the exact dedupe runs instead."""
    value = pl.col(values.name)
    frame = values.to_frame().lazy()
    firsts, counts = pl.collect_all(
        [
            frame.filter(value.is_not_null() & _hash_key(value, _DEDUPE_SEED).is_first_distinct()),
            frame.select(
                distinct=_hash_key(value, _CHECK_SEED).n_unique(), nulls=value.null_count()
            ),
        ]
    )
    distinct, nulls = counts.row(0)
    if firsts.height == distinct - (nulls > 0):  # (all nulls share one hash)
        return firsts.to_series()
    return values.filter(values.is_not_null() & values.is_first_distinct())


def unique_emails(df: pl.DataFrame) -> list[str]:
    """Normalised addresses, each once, in first-seen order (the verification work list)."""
    if "normalised" not in df.columns:
        df = normalise_emails(df)
    return distinct_in_order(df.get_column("normalised")).to_list()


def values_for_rows(df: pl.DataFrame, mapping: Mapping[str, str], default: str = "") -> list[str]:
    """One value per data row by looking up its normalised address (``{"a@x.com": "Yes"}``);
    rows without an address or missing from ``mapping`` get ``default``. Feeds
    :func:`write_results_csv`."""
    if "normalised" not in df.columns:
        df = normalise_emails(df)
    # A left join, not Series.replace_strict: 2.3x faster with a million distinct keys.
    lookup = pl.DataFrame(
        {"normalised": list(mapping), "_vm_value": list(mapping.values())},
        schema={"normalised": pl.String, "_vm_value": pl.String},
    )
    return (
        df.select("normalised")
        .join(lookup, on="normalised", how="left", maintain_order="left")
        .get_column("_vm_value")
        .fill_null(default)
        .to_list()
    )


def _column_index(info: CsvInfo, column: str | int, param: str) -> int:
    if isinstance(column, int):
        if not 0 <= column < len(info.columns):
            raise ValueError(f"{param} index {column} is outside 0..{len(info.columns) - 1}")
        return column
    return resolve_column(info.columns, column, param)


def load_person_rows(
    path: Path | str,
    info: CsvInfo,
    first_col: str | int,
    last_col: str | int,
    domain_col: str | int,
) -> pl.DataFrame:
    """``row``, ``first_name``, ``last_name``, ``domain`` for the Email Finder.

    Columns are names (as in ``CsvInfo.columns``) or 0-based indexes (``PersonColumns.*_index``;
    prefer these when headers repeat). Cells are trimmed, blank → null. The domain is kept as
    typed: the finder reduces it (URL, ``www.``, port, IDN) by the rules of the single lookup,
    so a row and ``POST /api/find-email`` get the same answer for the same cell.
    """
    i_first = _column_index(info, first_col, "first_name_column")
    i_last = _column_index(info, last_col, "last_name_column")
    i_domain = _column_index(info, domain_col, "domain_column")
    firsts: list[str | None] = []
    lasts: list[str | None] = []
    domains: list[str | None] = []
    indexes = [i_first, i_last, i_domain]
    with open_info(Path(path), info) as f:
        for first, last, domain in iter_data_cells(f, info.delimiter, info.has_header, indexes):
            firsts.append(first.strip() or None)
            lasts.append(last.strip() or None)
            domains.append(domain.strip() or None)
    return pl.DataFrame(
        [
            _row_index(len(firsts)),
            pl.Series("first_name", firsts, dtype=pl.String),
            pl.Series("last_name", lasts, dtype=pl.String),
            pl.Series("domain", domains, dtype=pl.String),
        ]
    )


def finder_columns(
    upload: Path, options: dict[str, Any], max_rows: int, info: CsvInfo | None = None
) -> tuple[CsvInfo, PersonColumns]:
    """A finder upload's inspection and its person columns (``options`` may name them;
    raises UploadError). ``info``: the upload's inspection when it was made before (kept
    with the job); else the file is sniffed first."""
    if info is None:
        info = inspect_csv(upload, max_rows=max_rows, need_email=False)
    columns = find_person_columns(
        info, options.get("first_name_column"), options.get("last_name_column"),
        options.get("domain_column"),
    )  # fmt: skip
    return info, columns


def read_finder_upload(
    upload: Path, options: dict[str, Any], max_rows: int, info: CsvInfo | None = None
) -> tuple[CsvInfo, pl.DataFrame]:
    """A finder upload's people (:func:`finder_columns`, then the rows loaded)."""
    info, columns = finder_columns(upload, options, max_rows, info)
    rows = load_person_rows(
        upload, info, columns.first_name_index, columns.last_name_index, columns.domain_index
    )
    return info, rows


# --- writing results -------------------------------------------------------------------


def _cell(value: str | None, delimiter: str, neutralise: bool) -> str:
    """One appended or rewritten cell, quoted only when it has to be."""
    if value is None:
        return ""
    if neutralise and value.startswith(FORMULA_PREFIXES):
        value = "'" + value
    if delimiter in value or '"' in value or "\n" in value or "\r" in value:
        return '"' + value.replace('"', '""') + '"'
    return value


def _suffixes(
    values: Sequence[Sequence[str | None]], delimiter: str, neutralise: bool
) -> list[str]:
    """``<delimiter><cell>…`` per data row, built column-wise in Polars (same rules as _cell)."""
    frame = pl.DataFrame(
        [pl.Series(f"c{i}", column, dtype=pl.String) for i, column in enumerate(values)]
    )
    special = "[" + re.escape(delimiter + '"\r\n') + "]"
    cells = []
    for name in frame.columns:
        cell = pl.col(name).fill_null("")
        if neutralise:
            risky = pl.any_horizontal([cell.str.starts_with(p) for p in FORMULA_PREFIXES])
            cell = pl.when(risky).then(pl.lit("'") + cell).otherwise(cell)
        quoted = pl.concat_str(
            pl.lit('"'), cell.str.replace_all('"', '""', literal=True), pl.lit('"')
        )
        cells.append(pl.when(cell.str.contains(special)).then(quoted).otherwise(cell))
    suffix = pl.concat_str([pl.lit(""), *cells], separator=delimiter)
    return frame.select(suffix.alias("s")).to_series().to_list()


def _open_out(path: Path, info: CsvInfo) -> TextIO:
    raw = path.open("wb", buffering=_CHUNK)
    raw.write(bom_bytes(info))
    # Original text always re-encodes exactly; only an appended character the 8-bit code page
    # lacks becomes "?" instead of failing the whole job.
    errors = codec_errors(info.encoding) if info.encoding.startswith("utf") else "replace"
    return io.TextIOWrapper(raw, encoding=info.encoding, errors=errors, newline="")


def write_results_csv(
    src: Path | str,
    info: CsvInfo,
    dest: Path | str,
    columns: Mapping[str, Sequence[str | None]],
    *,
    neutralise_formulas: bool = False,
    pad_short_rows: bool = True,
    keep: Sequence[bool] | None = None,
) -> int:
    """Write ``src`` to ``dest`` with ``columns`` appended; return the data rows written.

    ``columns`` maps each appended header to one value per data row, in ``load_emails`` row
    order (a list or a Polars Series; None writes an empty cell). Every original character is
    kept (encoding, BOM, delimiter, quoting, each record's own line ending, a missing final
    newline); ``<delimiter><value>`` goes before each record's terminator, quoted only when
    needed. The header row gets the header names; a headerless file gets none; blank records
    pass through with nothing appended.

    ``pad_short_rows``: a row with fewer cells than ``info.columns`` gets empty cells first,
    so the appended values sit under their header in a spreadsheet (only ragged files change).
    ``neutralise_formulas``: every cell, original or appended, that starts with ``= + - @``,
    tab or CR gets a leading ``'`` (OWASP CSV-injection advice); records holding such a cell
    are re-quoted minimally, so the file is deliberately no longer byte-identical.

    ``keep``: one flag per data row (same order); rows flagged False are left out (a
    segment of the results), the header and every kept record still byte for byte.

    Streams the file: memory is the appended values plus one record. Written to a temporary
    file beside ``dest`` and renamed, so a reader never sees half a file.
    """
    src, dest = Path(src), Path(dest)
    names = list(columns)
    if not names:
        raise ValueError("no columns to append")
    values = [columns[name] for name in names]
    for name, column in zip(names, values, strict=True):
        if len(column) != info.row_count:
            raise ValueError(
                f"column {name!r} has {len(column)} values for {info.row_count} data rows"
            )
    if keep is not None and len(keep) != info.row_count:
        raise ValueError(f"keep has {len(keep)} flags for {info.row_count} data rows")
    delimiter = info.delimiter
    width = len(info.columns) if pad_short_rows else 0
    neutralise = neutralise_formulas
    header_suffix = "".join(delimiter + _cell(n, delimiter, neutralise) for n in names)
    suffixes = _suffixes(values, delimiter, neutralise)
    total = len(suffixes)

    tmp = dest.with_name(f".{dest.name}.{uuid.uuid4().hex}.part")  # unique: writers may race
    row = written = 0
    header_pending = info.has_header
    try:
        with open_info(src, info) as fin, _open_out(tmp, info) as fout:
            write = fout.write
            for body, terminator, fields in iter_records(fin, delimiter):
                if fields is None:  # one line, no quote character
                    if delimiter in body:
                        n = body.count(delimiter) + 1 if width else 0
                    elif body.strip():
                        n = 1
                    else:
                        write(body + terminator)  # blank: not a row
                        continue
                    if neutralise:
                        cells = body.split(delimiter)
                        if any(c.startswith(FORMULA_PREFIXES) for c in cells):
                            body = delimiter.join(_cell(c, delimiter, True) for c in cells)
                else:
                    if is_blank(fields):
                        write(body + terminator)
                        continue
                    n = len(fields)
                    if neutralise and any(f.startswith(FORMULA_PREFIXES) for f in fields):
                        body = delimiter.join(_cell(f, delimiter, True) for f in fields)
                if header_pending:
                    header_pending = False
                    suffix = header_suffix
                else:
                    if row >= total:
                        raise ValueError("the file has more rows than when it was inspected")
                    suffix = suffixes[row]
                    row += 1
                    if keep is not None and not keep[row - 1]:
                        continue
                    written += 1
                if n < width:
                    body += delimiter * (width - n)
                write(body + suffix + terminator)
        if row != total:
            raise ValueError(f"the file has {row} data rows, {total} when it was inspected")
        os.replace(tmp, dest)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    return written


FINDER_OUTCOMES = ("email", "status", "confidence")
"""What the Email Finder appends to each row (one frame column each, beside ``row``)."""


def finder_result_names(columns: Sequence[str]) -> tuple[str, str, str]:
    """``email, status, confidence``; if the file has any of them, all three prefixed
    ``finder_``, then ``finder1_``… until none is taken (a results file with two columns
    of one name is ambiguous to whoever reads it)."""
    taken = {c.strip().lower() for c in columns}
    prefixes = itertools.chain([""], (f"finder{n or ''}_" for n in itertools.count()))
    for prefix in prefixes:
        names = (f"{prefix}email", f"{prefix}status", f"{prefix}confidence")
        if not taken.intersection(names):
            return names
    raise AssertionError("unreachable")


def write_finder_results(
    src: Path, info: CsvInfo, dest: Path, outcomes: pl.DataFrame, *, partial: bool = False
) -> int:
    """The Email Finder's results file: ``src`` plus :func:`finder_result_names`, filled
    from ``outcomes`` (``row`` and :data:`FINDER_OUTCOMES`, one row per data row looked up);
    the data rows written. ``partial`` (a job its owner stopped): the rows without an
    outcome are left out; else every row must have one."""
    frame = (
        _row_index(info.row_count)
        .to_frame()
        .join(outcomes.select("row", *FINDER_OUTCOMES), on="row", how="left")
        .sort("row")
    )
    looked_up = frame.get_column("status").is_not_null()
    if not partial and not looked_up.all():
        raise ValueError(f"{int((~looked_up).sum())} rows have no outcome")
    names = finder_result_names(info.columns)
    columns = {
        n: frame.get_column(c).to_list() for n, c in zip(names, FINDER_OUTCOMES, strict=True)
    }
    return write_results_csv(
        src, info, dest, columns, keep=looked_up.to_list() if partial else None
    )
