"""Result downloads: the whole file, always.

Starlette's ``FileResponse`` answers ``Range`` requests with 206, and malformed or
unsatisfiable ranges with a plain-text 400 or 416 — statuses and bodies outside the API's
contract (every error is ``{"detail": str}``). Results files are small enough to fetch
whole, and RFC 9110 lets a server ignore ``Range``: so it is ignored and ``Accept-Ranges:
none`` says so.
"""

from __future__ import annotations

import contextlib
from pathlib import Path

from fastapi.responses import FileResponse
from starlette.types import Receive, Scope, Send

from verimail.api.errors import ApiError
from verimail.config import Settings
from verimail.files.bulk_io import load_info
from verimail.jobs.cancel import partial_results
from verimail.store.jobs import Job

_RANGE_HEADERS = (b"range", b"if-range")


class WholeFileResponse(FileResponse):
    """A ``FileResponse`` that always sends the whole file with 200."""

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        self.headers["accept-ranges"] = "none"
        headers = [(k, v) for k, v in scope.get("headers", []) if k.lower() not in _RANGE_HEADERS]
        await super().__call__({**scope, "headers": headers}, receive, send)


# Python's codec names as IANA charsets. UTF-16 with a BOM is "utf-16": the LE/BE labels
# say there is no BOM (RFC 2781 §3.3), and the file keeps the upload's.
_CHARSETS = {"utf-8": "utf-8", "cp1252": "windows-1252", "latin-1": "iso-8859-1"}
_UTF16 = {"utf-16-le": "utf-16le", "utf-16-be": "utf-16be"}


def csv_response(path: Path, directory: Path, filename: str) -> WholeFileResponse:
    """A results CSV labelled with its real charset: it is written in the upload's encoding
    (kept byte for byte), so ``text/csv`` with Starlette's default ``charset=utf-8`` made
    clients that trust the label garble a Windows-1252 or UTF-16 file."""
    charset = "utf-8"
    with contextlib.suppress(OSError, ValueError, KeyError, TypeError):  # (no info: UTF-8)
        info = load_info(directory)
        if info.encoding in _UTF16:
            charset = "utf-16" if info.has_bom else _UTF16[info.encoding]
        else:
            charset = _CHARSETS.get(info.encoding, charset)
    return WholeFileResponse(path, media_type=f"text/csv; charset={charset}", filename=filename)


def partial_response(
    settings: Settings, job: Job, filename: str, *, variant: str | None = None
) -> WholeFileResponse:
    """A cancelled job's download: the rows it had settled (``jobs/cancel.py``), as one CSV
    with the details columns. 409 when it settled none, or for a ``variant`` (Parquet, a
    segment) that a partial file does not come in."""
    path = partial_results(settings, job)
    if variant is not None:
        raise ApiError(
            409,
            f"Job {job.public_id if job.kind == 'finder_csv' else job.id} was cancelled: its "
            f"settled rows are one CSV with the details columns, without {variant}; download "
            "it without that parameter.",
        )
    if not path.is_file():
        raise ApiError(
            409, f"{job.failed_reason}: no row was settled before, so there is nothing to download."
        )
    return csv_response(path, path.parent, filename=filename)
