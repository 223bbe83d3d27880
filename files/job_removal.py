"""A deleted job's files removed from the data dir: everything that came from its upload.

What a job leaves in ``<data_dir>``: its upload (``uploads/<random>/``, or the list the
service wrote into the job's folder), its folder ``jobs/<id>/`` (the upload's inspection,
result parts, shards, a parked pass's state, results CSV and Parquet, segment and details
variants, a cancelled job's partial results) and its rows in the history
(``history/date=*/<source>-<id>.parquet``, and ``<source>-<id>-<time>-<n>.parquet`` as
older versions named them). Each removal is idempotent: a sweep may do it again.
"""

from __future__ import annotations

import shutil
from pathlib import Path

from verimail.files.bulk_io import job_dir
from verimail.files.history import history_dir

HISTORY_SOURCES = ("bulk", "reverify")
"""The sources whose history files carry a job's id in their name (``append_history``)."""


def job_history_files(data_dir: Path, job_id: int) -> list[Path]:
    """The history files holding job ``job_id``'s results."""
    root = history_dir(data_dir)
    found: list[Path] = []
    for source in HISTORY_SOURCES:
        found += root.glob(f"date=*/{source}-{job_id}.parquet")
        found += root.glob(f"date=*/{source}-{job_id}-*.parquet")
    return found


def _inside(path: Path, folder: Path) -> bool:
    try:
        path.resolve().relative_to(folder.resolve())
    except ValueError:
        return False
    return True


def remove_job_files(data_dir: Path, job_id: int, upload_path: str | None) -> None:
    """Remove the job's upload, folder and history files (what is already gone is skipped).

    An upload in its own folder under ``<data_dir>/uploads`` goes with its folder; an upload
    anywhere else (a file a Prefect-UI run verified in place) is the operator's, not ours,
    and stays."""
    data_dir = Path(data_dir)
    uploads = data_dir / "uploads"
    if upload_path:
        upload = Path(upload_path)
        if _inside(upload, uploads) and upload.parent.resolve() != uploads.resolve():
            shutil.rmtree(upload.parent, ignore_errors=True)
    shutil.rmtree(job_dir(data_dir, job_id), ignore_errors=True)
    for path in job_history_files(data_dir, job_id):
        path.unlink(missing_ok=True)
