"""A sharded job's files: each shard's addresses, and the results it has saved so far.

Under the job's folder, ``shards/shard-<n>/``: ``input.parquet`` (the normalised addresses
of the shard, each once, with the number of rows it stands for) and ``results/`` (Parquet
parts, written as results come: :class:`~verimail.files.bulk_io.ResultParts`). A shard run
that starts again after its worker died reads what the parts already hold and verifies only
the rest; the job's merge reads every shard's parts (``data_dir`` shared by every worker).
"""

from __future__ import annotations

import shutil
from collections.abc import Sequence
from pathlib import Path

import polars as pl

from verimail.files.bulk_io import ResultParts, read_parts

SHARDS_DIR = "shards"
INPUT_SCHEMA = {"normalised": pl.String, "rows": pl.Int64}


def shard_dir(job_directory: Path, shard: int) -> Path:
    return job_directory / SHARDS_DIR / f"shard-{shard:04d}"


def write_shard_input(
    job_directory: Path, shard: int, addresses: Sequence[str], rows: Sequence[int]
) -> None:
    """Keep shard ``shard``'s addresses (and the rows each stands for), atomically."""
    folder = shard_dir(job_directory, shard)
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / "input.parquet"
    partial = path.with_suffix(".partial")
    pl.DataFrame({"normalised": addresses, "rows": rows}, schema=INPUT_SCHEMA).write_parquet(
        partial
    )
    partial.replace(path)


def read_shard_input(job_directory: Path, shard: int) -> pl.DataFrame:
    return pl.read_parquet(shard_dir(job_directory, shard) / "input.parquet")


def shard_results(job_directory: Path, shard: int, attempt: int) -> ResultParts:
    """Where run ``attempt`` of a shard writes its results; the parts of its earlier runs
    stay (their addresses are not verified again)."""
    return ResultParts(shard_dir(job_directory, shard) / "results", prefix=f"run-{attempt}")


def merged_results(job_directory: Path, shards: int) -> pl.DataFrame:
    """Every shard's results, one row per address (the job's merge)."""
    frames = [read_parts(shard_dir(job_directory, n) / "results") for n in range(shards)]
    return pl.concat(frames) if frames else read_parts(job_directory / SHARDS_DIR)


def remove_shards(job_directory: Path) -> None:
    shutil.rmtree(job_directory / SHARDS_DIR, ignore_errors=True)
