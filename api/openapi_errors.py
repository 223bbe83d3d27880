"""Examples of the refusals every operation can answer: an error body per status (some
worded for one operation), the validation errors, and the refusals of a request body that
the body limit answers before any route runs (:mod:`verimail.api.body_limit`).
"""

from __future__ import annotations

from typing import Any

from verimail.api.openapi_examples import model_example
from verimail.schemas.errors import ValidationErrorBody

# status -> example detail (any operation); see ERROR_OVERRIDES for per-operation ones
ERRORS: dict[str, str] = {
    "401": "Invalid API key: it is unknown or has been revoked.",
    "402": "Not enough credits: this request needs 500, the balance is 120.",
    "403": "The Email Finder is not enabled for this account.",
    "404": "No bulk job 42 for this account.",
    "408": "The request body did not arrive in time (nothing for 30 s); nothing was done.",
    "409": "Job 42 is processing (1100 of 2500 verified); download it once its status is "
    "completed.",
    "413": "The request body is larger than the limit of 4 MiB; nothing was done. Send at "
    "most 10,000 addresses per request, or upload a CSV.",
    "429": "Rate limit exceeded: your plan allows 60 requests per minute. Retry in 12 s.",
    "500": "Internal error; nothing was charged.",
    "503": "The database is unavailable right now; nothing was charged. Try again shortly.",
}
ERROR_OVERRIDES: dict[tuple[str, str, str], str] = {
    ("post", "/api/bulk", "413"): "The upload is larger than the limit of 50 MB; nothing "
    "was stored.",
    ("post", "/api/find-email/csv", "413"): "The upload is larger than the limit of 50 MB; "
    "nothing was stored.",
    ("post", "/api/bulk", "402"): "Not enough credits: this job needs 2500 (1 per address), "
    "the balance is 120. Nothing was stored or charged.",
    ("post", "/api/verify/bulk", "402"): "Not enough credits: this job needs 4 (1 per "
    "address), the balance is 2. Nothing was stored or charged.",
    ("post", "/api/bulk", "422"): "No email column found; columns are: name, company, "
    "phone. Pass email_column to choose one.",
    ("post", "/api/find-email/csv", "422"): "No domain column found; columns are: "
    "first_name, last_name, company. Pass domain_column to name it.",
    ("post", "/api/find-email", "402"): "Not enough credits: a found address costs 10, the "
    "balance is 4; nothing was looked up or charged.",
    ("get", "/api/find-email/csv/{job_id}", "404"): "No finder job 'fj_3kq9x2m7' for this account.",
    ("get", "/api/find-email/csv/{job_id}/download", "404"): "No finder job 'fj_3kq9x2m7' "
    "for this account.",
    ("get", "/api/find-email/csv/{job_id}/download", "409"): "Job fj_3kq9x2m7 is processing "
    "(120 of 300 rows done); download it once its status is completed.",
    ("post", "/api/bulk/{job_id}/reverify", "402"): "Not enough credits: re-verifying "
    "this list needs 2500 (1 per address), the balance is 120. Nothing was charged.",
    ("post", "/api/bulk/{job_id}/reverify", "409"): "Job 42 is processing (1100 of 2500 "
    "verified); re-verify it once its status is completed.",
    ("get", "/api/bulk/{job_id}/changes", "409"): "Job 42 is not a re-verification, so it "
    "has no changes.",
    ("put", "/api/bulk/{job_id}/reverify-schedule", "409"): "List 42 has no completed run "
    "yet; schedule it once it has.",
    ("get", "/api/bulk/{job_id}/reverify-schedule", "404"): "List 42 has no "
    "re-verification schedule.",
    ("delete", "/api/bulk/{job_id}/reverify-schedule", "404"): "List 42 has no "
    "re-verification schedule.",
    ("post", "/api/bulk/{job_id}/cancel", "409"): "Job 42 had already completed: nothing to "
    "cancel; download it.",
    ("post", "/api/find-email/csv/{job_id}/cancel", "409"): "Job fj_3kq9x2m7 had already "
    "completed: nothing to cancel; download it.",
    ("post", "/api/find-email/csv/{job_id}/cancel", "404"): "No finder job 'fj_3kq9x2m7' for "
    "this account.",
    ("delete", "/api/find-email/csv/{job_id}", "404"): "No finder job 'fj_3kq9x2m7' for this "
    "account.",
    ("get", "/api/bulk", "422"): "created_from (2026-11-20T00:00:00+00:00) must be before "
    "created_to (2026-11-01T00:00:00+00:00): no job can be in that window.",
    ("get", "/api/find-email/csv", "422"): "cursor: not a cursor of this list; pass the "
    "next_cursor of the previous page unchanged (or leave it out for the first page).",
    ("get", "/api/account/usage", "422"): "from 2025-01-01 to 2026-11-20 is 690 days; ask for "
    "at most 366 days at a time.",
    ("get", "/api/account/ledger", "422"): "cursor: not a cursor of this list; pass the "
    "next_cursor of the previous page unchanged (or leave it out for the first page).",
}
VALIDATION: dict[str, Any] = model_example(ValidationErrorBody)
VALIDATION_OVERRIDES: dict[tuple[str, str], dict[str, Any]] = {
    ("post", "/api/verify/single"): {
        "detail": "email: field required",
        "errors": [{"type": "missing", "loc": ["body", "email"], "msg": "Field required"}],
    },
    ("post", "/api/find-email"): {
        "detail": "domain: at most 300 characters",
        "errors": [
            {
                "type": "string_too_long",
                "loc": ["body", "domain"],
                "msg": "String should have at most 300 characters",
                "ctx": {"max_length": 300},
            }
        ],
    },
    ("post", "/api/verify/bulk"): {
        "detail": "emails[3]: holds a control character (U+000A, line feed); send one "
        "address per entry, without control characters",
        "errors": [
            {
                "type": "control_character",
                "loc": ["body", "emails", 3],
                "msg": "holds a control character (U+000A, line feed); send one address per "
                "entry, without control characters",
                "ctx": {"code": "U+000A", "name": "line feed"},
            }
        ],
    },
    ("get", "/api/verify/bulk/{job_id}"): {
        "detail": "limit: Input should be less than or equal to 1000",
        "errors": [
            {
                "type": "less_than_equal",
                "loc": ["query", "limit"],
                "msg": "Input should be less than or equal to 1000",
                "ctx": {"le": 1000},
            }
        ],
    },
}

BODY_REFUSALS: dict[str, str] = {
    "413": "The request body is larger than the server's body limit (4 MiB unless "
    "configured otherwise; the CSV uploads have their own, larger limit); refused while it "
    "streams in, before the API key is checked. Nothing was done.",
    "408": "The request body stopped arriving (nothing for 30 s unless configured "
    "otherwise); the connection is closed. Nothing was done.",
}


def error_example(method: str, path: str, status: str) -> dict[str, Any] | None:
    """The example body of an operation's refusal with ``status`` (None: no example known)."""
    if status == "422":
        value = VALIDATION_OVERRIDES.get((method, path), VALIDATION)
        if (method, path, status) in ERROR_OVERRIDES:
            value = {"detail": ERROR_OVERRIDES[(method, path, status)]}
        return {"example": value}
    detail = ERROR_OVERRIDES.get((method, path, status), ERRORS.get(status))
    return {"example": {"detail": detail}} if detail else None
