"""A verification job's counts by status, over its data rows, as results come in.

An address stands for every row that holds it (a list with duplicates is charged and
counted per row); the counts are the job row's columns (``store/jobs.py``).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable

from verimail.schemas.results import VerificationResult

# Job columns counted by status. catch_all_count holds both catch-all statuses (SPEC:
# "addresses on detected catch-all domains"); likely_valid_count is the confident part.
STATUS_COUNTS = {
    "valid": ("valid_count",),
    "invalid": ("invalid_count",),
    "catchall": ("catch_all_count",),
    "likely_valid": ("catch_all_count", "likely_valid_count"),
    "disposable": ("disposable_count",),
    "unknown": ("unknown_count",),
    "risky": ("risky_count",),
}


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
