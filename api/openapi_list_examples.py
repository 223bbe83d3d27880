"""Examples of the answers of the issue-45 additions (the jobs lists, usage per day, the
credit ledger, a partial download), beside :mod:`verimail.api.openapi_examples`, whose jobs
they list. :mod:`verimail.api.openapi_doc` merges :data:`SUCCESS` over that module's.
"""

from __future__ import annotations

from typing import Any

from verimail.api.openapi_examples import FINDER_STATES, JOB_STATES, RESULTS_CSV, one_example

JOB_LIST: dict[str, Any] = {
    "jobs": [
        {**JOB_STATES["processing"]["value"], "job_id": 43, "created_at": "2026-11-20T10:02:11Z"},
        JOB_STATES["completed"]["value"],
    ],
    "next_cursor": "ajo0Mg",
}
FINDER_LIST: dict[str, Any] = {"jobs": [FINDER_STATES["completed"]["value"]], "next_cursor": None}
USAGE: dict[str, Any] = {
    "from": "2026-11-18",
    "to": "2026-11-20",
    "granularity": "day",
    "total_spent": 2530,
    "days": [
        {"date": "2026-11-18", "credits_spent": 0},
        {"date": "2026-11-19", "credits_spent": 30},
        {"date": "2026-11-20", "credits_spent": 2500},
    ],
}
LEDGER: dict[str, Any] = {
    "entries": [
        {
            "id": 311,
            "delta": 10,
            "kind": "refund",
            "source": "prepaid",
            "reason": "reserved credits not used",
            "reference": "job:42",
            "balance_after": 1610,
            "created_at": "2026-11-20T09:21:47Z",
        },
        {
            "id": 305,
            "delta": -2500,
            "kind": "reserve",
            "source": "prepaid",
            "reason": "bulk_csv job 42: 2500 rows",
            "reference": "job:42",
            "balance_after": 1600,
            "created_at": "2026-11-20T09:15:02Z",
        },
    ],
    "next_cursor": "bDozMDU",
}
PARTIAL_CSV = (
    "name,email,Safe to Send,Retry Pending\r\n"
    "Alice,alice@example.com,Yes,No\r\n"
    "Carol,carol@slow.example.net,No,Yes\r\n"
)

# (method, path) -> media type -> examples of its 200 answer
SUCCESS: dict[tuple[str, str], dict[str, dict[str, Any]]] = {
    ("get", "/api/bulk/{job_id}/download"): {
        "text/csv": {
            "examples": {
                "completed": {
                    "summary": "The upload with `Safe to Send` appended",
                    "value": RESULTS_CSV,
                },
                "partial": {
                    "summary": "`partial=true` while a retry pass waits: parked rows marked",
                    "value": PARTIAL_CSV,
                },
            }
        },
    },
    ("get", "/api/bulk"): {"application/json": one_example("A page of two jobs", JOB_LIST)},
    ("get", "/api/find-email/csv"): {
        "application/json": one_example("The last page: one job", FINDER_LIST)
    },
    ("get", "/api/account/usage"): {"application/json": one_example("Three days", USAGE)},
    ("get", "/api/account/ledger"): {
        "application/json": one_example("A job's reservation and its refund", LEDGER)
    },
}
