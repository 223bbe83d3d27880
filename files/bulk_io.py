"""A bulk job's files: read the upload into a work list, write results and history.

Why one long file: the reader of a job's input and the writers of its results share one
column layout (below), which must not drift between them.

Layout under ``<data_dir>/jobs/<job_id>/``:

- ``upload.csv`` — the upload exactly as received (or the JSON list, as a one-column CSV);
- ``results.parquet`` — one row per data row: ``row``, the original cell, every result field;
- ``results.csv`` — the upload byte-for-byte plus ``Safe to Send`` (``Yes``/``No``);
- ``results-details.csv`` — the same plus ``Status``, ``Sub Status``, ``Reason``, ``Score``,
  ``Did You Mean`` (made on demand, like the other ``results-*.csv`` variants: formulas
  neutralised, one segment);
- ``.run-<n>.results.*`` — run ``n``'s files until they are put in place under the job's row
  lock as it completes (:class:`StagedFiles`);
- ``result-parts/`` — while a run works: its results so far, one row per address, in Parquet
  parts (:class:`ResultSink`); read back and removed once the files above are written.

History: ``<data_dir>/history/date=YYYY-MM-DD/*.parquet``, one file per job or run, read by
DuckDB (``files/history.py``).
"""

from __future__ import annotations

import contextlib
import csv
import json
import shutil
import time
import uuid
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from types import UnionType
from typing import Any, Union, get_args, get_origin

import polars as pl

from verimail.files.csv_detect import CsvInfo
from verimail.files.csv_io import (
    distinct_in_order,
    load_emails,
    normalise_emails,
    read_emails,
    write_results_csv,
)
from verimail.files.result_changes import (
    PREVIOUS_COLUMN,
    change_columns,
    count_egress_blocked,
    count_transitions,
    with_previous_status,
)
from verimail.schemas.results import VerificationResult

SAFE_COLUMN = "Safe to Send"
RESULT_FIELDS = tuple(VerificationResult.model_fields)
# Field -> column in results frames: ``email`` is ``verified_email`` there, beside the row's
# own ``email`` cell and its ``normalised`` form.
RESULT_COLUMNS = {name: "verified_email" if name == "email" else name for name in RESULT_FIELDS}
RESULT_PARTS = "result-parts"
PART_ROWS = 20_000  # results a run holds before writing them out
PART_SECONDS = 5.0
"""...or for at most this long (a shard's parts; a bulk run's :class:`ResultSink` writes
each batch at once, for ``jobs/cancel.py``)."""


def _dtype(annotation: Any) -> pl.DataType:
    """The Polars type of a result field (the record has no other kinds)."""
    kind = annotation
    if get_origin(annotation) in (Union, UnionType):  # X | None
        (kind,) = (a for a in get_args(annotation) if a is not type(None))
    if get_origin(kind) is list and get_args(kind) == (str,):
        return pl.List(pl.String())
    if kind is bool:
        return pl.Boolean()
    if kind is int:
        return pl.Int64()
    if kind is float:
        return pl.Float64()
    if isinstance(kind, type) and issubclass(kind, str):  # str and the str enums
        return pl.String()
    raise TypeError(f"no Polars type for result field type {annotation!r}")


# One schema for every results frame, so that parts written apart read back as one table
# (a part whose suggestions are all null must not become a column of nulls of its own type).
RESULT_SCHEMA = pl.Schema(
    {
        "normalised": pl.String(),
        **{
            RESULT_COLUMNS[name]: _dtype(field.annotation)
            for name, field in VerificationResult.model_fields.items()
        },
    }
)


def job_dir(data_dir: Path, job_id: int) -> Path:
    return Path(data_dir) / "jobs" / str(job_id)


# The header of a stored JSON list. With it, the sniffer reads the list as written: a
# one-field first row leaves the delimiter at "," (entries holding ";" or tabs stay whole) and
# the data starts at the first entry, whether or not it holds an "@".
ADDRESS_LIST_COLUMN = "email"


def write_address_list(path: Path, emails: Sequence[str]) -> None:
    """Store a JSON-submitted list as a one-column CSV under :data:`ADDRESS_LIST_COLUMN` (same
    path as uploads; the job names that column, so nothing about the list is guessed)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("w", encoding="utf-8", newline="") as fh:
        writer = csv.writer(fh, lineterminator="\n")
        writer.writerow([ADDRESS_LIST_COLUMN])
        for email in emails:
            writer.writerow([email])


@dataclass
class JobInput:
    """The upload read for verification."""

    info: CsvInfo
    rows: pl.DataFrame  # row, email, normalised — one per data row
    uniques: list[str]  # normalised addresses, each once, first-seen order

    @property
    def address_rows(self) -> int:
        """Rows that hold an address (what a job is charged for)."""
        return int(self.rows.get_column("normalised").is_not_null().sum())

    def row_counts(self) -> dict[str, int]:
        """How many rows each normalised address stands in."""
        counts = self.rows.get_column("normalised").drop_nulls().value_counts()
        return dict(zip(counts[:, 0].to_list(), counts[:, 1].to_list(), strict=True))


def read_job_input(
    upload: Path, email_column: str | None, max_rows: int, info: CsvInfo | None = None
) -> JobInput:
    """Load, normalise and dedupe the upload (Polars; raises ``UploadError``).

    ``info``: the upload's inspection when it was made before (the API inspects an upload
    as it takes it, and the job keeps what it learned): the file is loaded as it says,
    without sniffing it again. Without it the file is sniffed first, in the same read as
    the load when the fast path applies."""
    if info is not None:
        emails = load_emails(upload, info)
    else:
        info, emails = read_emails(upload, max_rows=max_rows, email_column=email_column)
    rows = normalise_emails(emails)
    uniques = distinct_in_order(rows.get_column("normalised")).to_list()
    return JobInput(info, rows, uniques)


INFO_FILE = "upload-info.json"
"""What inspecting a job's upload learned, in its folder (for its run and its download)."""


def save_info(directory: Path, info: CsvInfo) -> None:
    (directory / INFO_FILE).write_text(json.dumps(info.to_dict()), encoding="utf-8")


def load_info(directory: Path) -> CsvInfo:
    return CsvInfo.from_dict(json.loads((directory / INFO_FILE).read_text(encoding="utf-8")))


def results_frame(results: Mapping[str, VerificationResult]) -> pl.DataFrame:
    """One row per normalised address: ``normalised`` and every result field (``email``
    renamed ``verified_email``), in :data:`RESULT_SCHEMA`."""
    records = [r.model_dump(mode="json") for r in results.values()]
    columns = {"normalised": list(results)}
    for name, column in RESULT_COLUMNS.items():
        columns[column] = [rec[name] for rec in records]
    return pl.DataFrame(columns, schema=RESULT_SCHEMA)


class ResultParts:
    """Results as they come, written to Parquet parts in ``directory`` every
    :data:`PART_ROWS` results: the writer holds at most that many records, however long
    the list. Parts already in the folder (``prefix``: this writer's names) are kept, and
    read back by :meth:`frame` with the new ones."""

    def __init__(self, directory: Path, part_rows: int | None = None, *, prefix: str = "part"):
        self.directory = directory
        self.directory.mkdir(parents=True, exist_ok=True)
        self.prefix = prefix
        self.part_rows = part_rows or PART_ROWS
        self.pending: dict[str, VerificationResult] = {}
        self.parts = len(list(directory.glob(f"{prefix}-*.parquet")))
        self.flushed_at = time.monotonic()

    def add(self, results: Iterable[tuple[str, VerificationResult]]) -> None:
        self.pending.update(results)
        if len(self.pending) >= self.part_rows or (
            self.pending and time.monotonic() - self.flushed_at >= PART_SECONDS
        ):
            self.flush()

    def flush(self) -> None:
        if self.pending:
            path = self.directory / f"{self.prefix}-{self.parts:05d}.parquet"
            partial = path.with_suffix(".partial")
            results_frame(self.pending).write_parquet(partial)
            partial.replace(path)  # (a reader sees a whole part or none)
            self.parts += 1
            self.pending = {}
        self.flushed_at = time.monotonic()

    def frame(self) -> pl.DataFrame:
        """Every result written to the folder, one row per address."""
        self.flush()
        return read_parts(self.directory)


def read_parts(directory: Path) -> pl.DataFrame:
    """The results in a folder of parts, one row per address (the first written wins)."""
    if not any(directory.glob("*.parquet")):
        return RESULT_SCHEMA.to_frame()
    frame = pl.read_parquet(directory / "*.parquet", schema=RESULT_SCHEMA)
    return frame.unique("normalised", keep="first", maintain_order=True)


class ResultSink(ResultParts):
    """A bulk run's results as they come (:class:`ResultParts` under
    ``result-parts/run-<n>/``). A new sink clears the parts of earlier runs (a resumed job
    verifies again from the start), never a later run's: an earlier run that wakes up after
    being taken for dead, even before it made its own sink, cannot remove or mix into the
    parts of the run that has the job (its own are gone if that run started after it had
    made them, and it fails to write)."""

    def __init__(self, directory: Path, part_rows: int | None = None, *, run: int = 1) -> None:
        self.root = directory / RESULT_PARTS
        if self.root.is_dir():
            for entry in self.root.iterdir():
                number = entry.name.removeprefix("run-")
                if not number.isdigit() or int(number) <= run:  # (later runs' stay)
                    shutil.rmtree(entry, ignore_errors=True)
        self.root.mkdir(parents=True, exist_ok=True)
        (self.root / f"run-{run}").mkdir()
        super().__init__(self.root / f"run-{run}", part_rows)

    def add(self, results: Iterable[tuple[str, VerificationResult]]) -> None:
        """Each batch written as it comes (a pass has at most ``MAX_CHUNKS`` + 1 of them,
        and pieces of ``PIECE_ADDRESSES``): a stop keeps every row the progress counted.
        Held for :data:`PART_SECONDS`, a batch a slow server kept the next one from
        pushing out was lost — progress showed 231 of 633, the partial file had none."""
        self.pending.update(results)
        self.flush()

    def remove(self) -> None:
        shutil.rmtree(self.directory, ignore_errors=True)
        with contextlib.suppress(OSError):
            self.root.rmdir()  # (unless a later run has started its own meanwhile)


def _result_frame(job_input: JobInput, by_address: pl.DataFrame) -> pl.DataFrame:
    """One row per data row with every result field (empty cells get no result)."""
    return job_input.rows.select("row", "email", "normalised").join(
        by_address, on="normalised", how="left", maintain_order="left"
    )


@dataclass(frozen=True)
class StagedFiles:
    """A run's result files under names of its own (``.run-<n>.<name>``), put in place by
    :meth:`publish` only once the job is known to be the run's: it is called under the
    job's row lock as the job is completed (``mark_completed(publish=...)``), so a run that
    lost the job while writing (taken for dead, resumed elsewhere) cannot replace the
    results of the run that has it. :meth:`discard` removes what was never published."""

    moves: tuple[tuple[Path, Path], ...]
    transitions: dict[str, int] | None = None  # a re-verification's, e.g. {"valid->invalid": 3}
    egress_blocked: dict[str, int] | None = None  # rows refused our IP, by egress

    @classmethod
    def for_run(cls, directory: Path, run: int, names: Sequence[str]) -> StagedFiles:
        return cls(tuple((directory / f".run-{run}.{name}", directory / name) for name in names))

    def staged(self, name: str) -> Path:
        return next(tmp for tmp, final in self.moves if final.name == name)

    def final(self, name: str) -> Path:
        return next(final for _, final in self.moves if final.name == name)

    def publish(self) -> None:
        for tmp, final in self.moves:
            tmp.replace(final)  # (atomic: a download reads the old file or the new one)

    def discard(self) -> None:
        for tmp, _ in self.moves:
            tmp.unlink(missing_ok=True)


def write_job_results(
    directory: Path,
    upload: Path,
    job_input: JobInput,
    by_address: pl.DataFrame,
    *,
    run: int,
    previous: Path | None = None,
) -> StagedFiles:
    """Stage ``results.parquet`` and ``results.csv`` from :func:`results_frame`'s rows (one
    per address) as run ``run``'s; :meth:`StagedFiles.publish` puts them in place.

    ``previous``: the ``results.parquet`` of the run a re-verification compares with; each
    row then gets its ``previous_status`` there, and the files say what changed."""
    directory.mkdir(parents=True, exist_ok=True)
    files = StagedFiles.for_run(directory, run, ("results.parquet", "results.csv"))
    try:
        frame = _result_frame(job_input, by_address)
        transitions = None
        if previous is not None:
            frame = with_previous_status(frame, previous)
            transitions = count_transitions(frame)
        blocked = count_egress_blocked(frame)
        frame.write_parquet(files.staged("results.parquet"))
        safe = frame.get_column("safe_to_send").fill_null(False)
        values = ["Yes" if v else "No" for v in safe.to_list()]
        out = files.staged("results.csv")
        columns = {SAFE_COLUMN: values, **change_columns(frame)}
        write_results_csv(upload, job_input.info, out, columns)
        save_info(directory, job_input.info)
    except BaseException:
        files.discard()
        raise
    return StagedFiles(files.moves, transitions, blocked)


SEGMENTS: dict[str, tuple[str, ...]] = {
    "valid": ("valid",),
    "valid_and_catchall": ("valid", "likely_valid", "catchall"),
    "invalid": ("invalid", "disposable"),
    "unknown": ("unknown", "risky"),
}
"""The result segments a download can be cut to, by status. ``valid_and_catchall``,
``invalid`` and ``unknown`` split the rows with an address between them; a row without
one is in no segment."""

DETAIL_NAMES = {
    "Status": "status",
    "Sub Status": "sub_status",
    "Reason": "reason",
    "Score": "confidence_score",
    "Did You Mean": "did_you_mean",
}
"""The details columns (``include=details``) and the result fields they show."""


def _details(frame: pl.DataFrame) -> dict[str, list[str]]:
    # (a row without an address has no status: counting it invalid would not match the
    # job's counts, which leave such rows out)
    empty = frame.get_column("status").is_null().to_list()
    out: dict[str, list[str]] = {}
    for header, field in DETAIL_NAMES.items():
        values = frame.get_column(field).to_list()
        if field == "confidence_score":
            out[header] = ["" if v is None else f"{v:.2f}" for v in values]
        elif field == "reason":
            out[header] = [
                "The cell holds no address." if none else (v or "")
                for v, none in zip(values, empty, strict=True)
            ]
        else:
            out[header] = [v or "" for v in values]
    return out


def results_csv(
    directory: Path,
    upload: Path,
    *,
    details: bool = False,
    neutralise_formulas: bool = False,
    segment: str | None = None,
) -> Path:
    """A variant of the results CSV, made once and then reused: with the details columns
    (``Status``, ``Sub Status``, ``Reason``, ``Score``, ``Did You Mean``), with formulas
    neutralised, and/or only the rows of one of :data:`SEGMENTS`."""
    name = "results" + "".join(
        part
        for part, wanted in (
            ("-details", details),
            ("-safe", neutralise_formulas),
            (f"-{segment}", segment is not None),
        )
        if wanted
    )
    out = directory / f"{name}.csv"
    if out.exists():
        return out
    fields = ["row", "safe_to_send", "status", *(DETAIL_NAMES.values() if details else ())]
    frame = _read_results(directory, list(dict.fromkeys(fields)))
    columns: dict[str, list[str]] = {
        SAFE_COLUMN: ["Yes" if v else "No" for v in frame.get_column("safe_to_send").to_list()]
    }
    if details:
        columns.update(_details(frame))
    columns.update(change_columns(frame))  # (a re-verification's, after the rest)
    keep = None
    if segment is not None:
        keep = frame.get_column("status").is_in(SEGMENTS[segment]).fill_null(False).to_list()
    tmp = out.with_suffix(f".{uuid.uuid4().hex}.tmp")
    write_results_csv(
        upload,
        load_info(directory),
        tmp,
        columns,
        neutralise_formulas=neutralise_formulas,
        keep=keep,
    )
    tmp.replace(out)
    return out


def write_partial_results(
    upload: Path,
    job_input: JobInput,
    by_address: pl.DataFrame,
    dest: Path,
    *,
    every_row: bool = False,
    details: bool = True,
) -> int:
    """The rows of a stopped job that have a result, with ``Safe to Send`` and the details
    columns, to ``dest`` (its owner keeps what was verified); the rows written.
    ``every_row``: rows without an address too (a parked job's results so far, which hold
    every address); ``details``: False leaves the details columns out."""
    frame = _result_frame(job_input, by_address)
    keep = None if every_row else frame.get_column("status").is_not_null().to_list()
    safe = frame.get_column("safe_to_send").fill_null(False).to_list()
    columns = {SAFE_COLUMN: ["Yes" if v else "No" for v in safe]}
    if details:
        columns.update(_details(frame))
    return write_results_csv(upload, job_input.info, dest, columns, keep=keep)


def _read_results(directory: Path, columns: list[str]) -> pl.DataFrame:
    """``columns`` of the job's results in row order, and a re-verification's previous
    statuses when it has them."""
    path = directory / "results.parquet"
    if PREVIOUS_COLUMN in pl.read_parquet_schema(path):
        columns = [*columns, PREVIOUS_COLUMN]
    return pl.read_parquet(path, columns=columns).sort("row")


def segment_parquet(directory: Path, segment: str) -> Path:
    """``results.parquet`` cut to the rows of one of :data:`SEGMENTS` (made once)."""
    out = directory / f"results-{segment}.parquet"
    if not out.exists():
        frame = pl.read_parquet(directory / "results.parquet")
        tmp = out.with_suffix(f".{uuid.uuid4().hex}.tmp")
        frame.filter(pl.col("status").is_in(SEGMENTS[segment])).write_parquet(tmp)
        tmp.replace(out)
    return out


@dataclass(frozen=True)
class ResultFilter:
    """What a results preview shows: rows of these statuses, sub-status and domain."""

    statuses: tuple[str, ...] = ()
    sub_status: str | None = None
    domain: str | None = None

    def expression(self) -> pl.Expr:
        where = pl.col("status").is_not_null()
        if self.statuses:
            where &= pl.col("status").is_in(self.statuses)
        if self.sub_status:
            where &= pl.col("sub_status") == self.sub_status
        if self.domain:
            where &= pl.col("domain") == self.domain.strip().lower()
        return where


def read_result_page(
    directory: Path, offset: int, limit: int, where: ResultFilter | None = None
) -> tuple[list[dict], int]:
    """Results ``offset .. offset+limit`` as SPEC §2.2 dicts, and how many there are: one
    per data row that holds an address (and passes ``where``), in row order (a CSV job's
    rows without one have no result, so they are not records)."""
    rows = pl.scan_parquet(directory / "results.parquet").filter(
        (where or ResultFilter()).expression()
    )
    frame, count = pl.collect_all([rows.sort("row").slice(offset, limit), rows.select(pl.len())])
    out = []
    for rec in frame.iter_rows(named=True):
        item = {f: rec[f] for f in RESULT_FIELDS if f != "email"}
        item["email"] = rec["verified_email"] if rec["verified_email"] is not None else rec["email"]
        out.append(item)
    return out, count.item()


def result_facets(directory: Path) -> dict[str, list[tuple[str, int]]]:
    """The statuses, sub-statuses and (top 50) domains of a job's results with their row
    counts, most frequent first: the choices of the results preview's filters."""
    rows = pl.scan_parquet(directory / "results.parquet").filter(pl.col("status").is_not_null())
    frames = pl.collect_all(
        [
            rows.group_by(name).len().sort(["len", name], descending=[True, False]).head(limit)
            for name, limit in (("status", 50), ("sub_status", 50), ("domain", 50))
        ]
    )
    return {
        name: [(str(v), int(n)) for v, n in frame.iter_rows()]
        for name, frame in zip(("status", "sub_status", "domain"), frames, strict=True)
    }


def append_history(
    data_dir: Path,
    results: pl.DataFrame,
    *,
    job_id: int | None,
    account_id: int | None,
    source: str,
    now: datetime | None = None,
    once_per_job: bool = False,
) -> Path | None:
    """Add a :func:`results_frame` (the bulk flow's, read back from its parts, or
    re-verification's) to the history dataset: a new Parquet file in today's partition, in
    one schema whatever the values (a batch whose suggestions are all null must not write a
    column of nulls).

    ``once_per_job``: the job's results are one file, which a later write for the same job
    replaces (in whichever day's partition it was): a run resumed after dying between this
    write and marking the job completed, or a run taken for dead that wakes up and writes
    after the run that replaced it, must not put every address in the history twice."""
    now = now or datetime.now(UTC)
    frame = results.select(pl.col(column).alias(name) for name, column in RESULT_COLUMNS.items())
    if frame.is_empty():
        return None
    frame = frame.with_columns(
        pl.lit(now).alias("verified_at"),
        pl.lit(job_id, dtype=pl.Int64).alias("job_id"),
        pl.lit(account_id, dtype=pl.Int64).alias("account_id"),
        pl.lit(source).alias("source"),
    )
    root = Path(data_dir) / "history"
    part = root / f"date={now:%Y-%m-%d}"
    part.mkdir(parents=True, exist_ok=True)
    if once_per_job and job_id is not None:
        path = part / f"{source}-{job_id}.parquet"
        for earlier in (
            *root.glob(f"date=*/{source}-{job_id}.parquet"),
            *root.glob(f"date=*/{source}-{job_id}-*.parquet"),  # (as older versions named it)
        ):
            if earlier != path:
                earlier.unlink(missing_ok=True)
    else:
        path = part / f"{source}-{job_id or 'x'}-{now:%H%M%S}-{uuid.uuid4().hex[:8]}.parquet"
    tmp = part / f".{path.stem}-{uuid.uuid4().hex[:8]}.tmp"
    frame.write_parquet(tmp)
    tmp.replace(path)
    return path


def change_report_csv(directory: Path) -> Path:
    """A re-verification's change report (made once): the rows whose status changed, as
    ``row, email, previous_status, status, reason`` (UTF-8; ``row`` counts data rows from 1)."""
    out = directory / "changes.csv"
    if out.exists():
        return out
    frame = _read_results(directory, ["row", "email", "status", "reason"])
    if PREVIOUS_COLUMN not in frame.columns:
        raise ValueError("not a re-verification: its results have no previous statuses")
    changed = frame.filter(
        pl.col("status").is_not_null()
        & pl.col(PREVIOUS_COLUMN).is_not_null()
        & (pl.col("status") != pl.col(PREVIOUS_COLUMN))
    ).select((pl.col("row") + 1).alias("row"), "email", PREVIOUS_COLUMN, "status", "reason")
    tmp = out.with_suffix(f".{uuid.uuid4().hex}.tmp")
    changed.write_csv(tmp)
    tmp.replace(out)
    return out
