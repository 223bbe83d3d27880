"""A verification job's counts by status, over its data rows, as results come in.

An address stands for every row that holds it (a list with duplicates is charged and
counted per row); the counts are the job row's columns (``store/jobs.py``).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable

from verimail.schemas.results import VerificationResult
from verimail.schemas.status_groups import COUNT_FIELDS as STATUS_COUNTS


class Tally:
    """Counts by status over data rows, as results come in."""

    def __init__(self, rows_per_address: dict[str, int]):
        self.rows = rows_per_address
        self.counts: Counter[str] = Counter()
        self.processed = 0

    def add(self, results: Iterable[tuple[str, VerificationResult]]) -> None:
        self.add_statuses((address, result.status.value) for address, result in results)

    def add_statuses(self, statuses: Iterable[tuple[str, str]]) -> None:
        for address, status in statuses:
            n = self.rows.get(address, 1)
            self.processed += n
            for column in STATUS_COUNTS[status]:
                self.counts[column] += n

    def job_counts(self) -> dict[str, int]:
        return {
            column: self.counts.get(column, 0) for cols in STATUS_COUNTS.values() for column in cols
        }
