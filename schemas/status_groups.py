"""The status groups of a bulk job: the one definition every surface counts by.

Each verified address has exactly one status, so a job's results split into seven groups
(:data:`STATUSES`, in the order every surface shows them). The job row and the API keep
the spec's fields, which are sums of groups: ``catch_all_count`` is "addresses on detected
catch-all domains", both catch-all statuses (``catchall`` + ``likely_valid``), and
``likely_valid_count`` the confident part. A job page once showed Catch-all 1 and Likely
valid 2 in its chart and Catch-all 3 in the list under it, and the demo and the CLI each
had a grouping of their own: now the chart, the page's list, the API's fields, the CLI, the
Prefect summary and the demo all go through :data:`COUNT_FIELDS` and :func:`groups`.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

STATUSES = ("valid", "likely_valid", "catchall", "risky", "unknown", "disposable", "invalid")
"""The groups, one per status, in the order they are shown."""

COUNT_FIELDS: dict[str, tuple[str, ...]] = {
    "valid": ("valid_count",),
    "likely_valid": ("catch_all_count", "likely_valid_count"),
    "catchall": ("catch_all_count",),
    "risky": ("risky_count",),
    "unknown": ("unknown_count",),
    "disposable": ("disposable_count",),
    "invalid": ("invalid_count",),
}
"""The job's count fields (the job row's columns, the API's fields) an address of each
status adds one to."""

FIELDS = tuple(dict.fromkeys(field for fields in COUNT_FIELDS.values() for field in fields))
"""Every count field of a bulk job, each once."""


def _fields_of(source: Mapping[str, Any] | Any) -> Mapping[str, Any]:
    if isinstance(source, Mapping):
        return source
    return {name: getattr(source, name, 0) for name in FIELDS}


def groups(source: Mapping[str, Any] | Any) -> dict[str, int]:
    """A job's count per status group, in :data:`STATUSES` order, from its count fields:
    a mapping (the API's JSON, a dashboard view) or an object with them (a job row)."""
    fields = _fields_of(source)
    count = {name: int(fields.get(name) or 0) for name in FIELDS}
    out = {status: count[f"{status}_count"] for status in STATUSES if status != "catchall"}
    # catch_all_count holds both catch-all statuses: the plain ones are what is left.
    out["catchall"] = max(count["catch_all_count"] - count["likely_valid_count"], 0)
    return {status: out[status] for status in STATUSES}
