"""Examples of the answers every operation of the API gives when it succeeds: results
(valid, invalid, catch-all, unknown, a typo), bulk and finder jobs in each state, the health
check, the CSV downloads and re-verification. :mod:`verimail.api.openapi_doc` puts them in
the published document (:data:`SUCCESS`: by operation and media type).
"""

from __future__ import annotations

import copy
from typing import Any

from verimail import API_VERSION
from verimail.schemas.finder import FindEmailResponse


def model_example(model: Any) -> dict[str, Any]:
    """The example a model declares for its schema (one source for both places)."""
    return copy.deepcopy(model.model_config["json_schema_extra"]["example"])


# --- results ----------------------------------------------------------------------------

_RESULT_BASE: dict[str, Any] = {
    "is_disposable": False,
    "is_role_based": False,
    "is_free": False,
    "api_version": API_VERSION,
    "did_you_mean": None,
    "catch_all_score": None,
}

VALID_RESULT: dict[str, Any] = {
    **_RESULT_BASE,
    "email": "alice@example.com",
    "safe_to_send": True,
    "status": "valid",
    "confidence_score": 0.97,
    "reason": "The mail server for example.com confirmed that this mailbox exists.",
    "domain": "example.com",
    "is_catch_all": False,
    "mx_records": ["mx1.example.com", "mx2.example.com"],
    "smtp_response": "250 2.1.5 Ok",
    "verification_time_ms": 412,
    "sub_status": "ok",
}
INVALID_RESULT: dict[str, Any] = {
    **_RESULT_BASE,
    "email": "nobody@example.com",
    "safe_to_send": False,
    "status": "invalid",
    "confidence_score": 0.95,
    "reason": "The mail server for example.com says this mailbox does not exist or is "
    "disabled; mail to it bounces for good.",
    "domain": "example.com",
    "is_catch_all": False,
    "mx_records": ["mx1.example.com", "mx2.example.com"],
    "smtp_response": "550 5.1.1 <nobody@example.com>: Recipient address rejected: User unknown",
    "verification_time_ms": 388,
    "sub_status": "mailbox_not_found",
}
CATCHALL_RESULT: dict[str, Any] = {
    **_RESULT_BASE,
    "email": "j.doe@catchall.example.org",
    "safe_to_send": False,
    "status": "catchall",
    "confidence_score": 0.53,
    "reason": "The mail server for catchall.example.org accepts mail for any address, so "
    "this mailbox cannot be confirmed (catch-all score 43/100).",
    "domain": "catchall.example.org",
    "is_catch_all": True,
    "mx_records": ["mail.catchall.example.org"],
    "smtp_response": "250 2.1.5 Ok",
    "verification_time_ms": 530,
    "sub_status": "catch_all",
    "catch_all_score": 43,
}
UNKNOWN_RESULT: dict[str, Any] = {
    **_RESULT_BASE,
    "email": "carol@slow.example.net",
    "safe_to_send": False,
    "status": "unknown",
    "confidence_score": 0.2,
    "reason": "The mail server for slow.example.net kept asking us to try again later "
    "(greylisting).",
    "domain": "slow.example.net",
    "is_catch_all": False,
    "mx_records": ["mx.slow.example.net"],
    "smtp_response": "451 4.7.1 Greylisted, please try again later",
    "verification_time_ms": 9120,
    "sub_status": "greylisted",
}
TYPO_RESULT: dict[str, Any] = {
    **INVALID_RESULT,
    "email": "bob@gmial.com",
    "confidence_score": 0.99,
    "reason": "The domain gmial.com does not exist.",
    "domain": "gmial.com",
    "mx_records": [],
    "smtp_response": None,
    "verification_time_ms": 35,
    "sub_status": "nxdomain",
    "did_you_mean": "bob@gmail.com",
}

RESULT_EXAMPLES: dict[str, dict[str, Any]] = {
    "valid": {"summary": "A mailbox the server confirmed", "value": VALID_RESULT},
    "invalid": {"summary": "A mailbox that does not exist", "value": INVALID_RESULT},
    "catchall": {"summary": "A domain that accepts every address", "value": CATCHALL_RESULT},
    "unknown": {"summary": "A server that would not say (greylisting)", "value": UNKNOWN_RESULT},
    "typo": {"summary": "A typo in the domain, with a suggestion", "value": TYPO_RESULT},
}

BATCH_EXAMPLE: dict[str, Any] = {
    "results": [VALID_RESULT, INVALID_RESULT, CATCHALL_RESULT, UNKNOWN_RESULT],
    "credits_used": 4,
    "summary": {
        "valid": 1,
        "invalid": 1,
        "disposable": 0,
        "catchall": 1,
        "unknown": 1,
        "likely_valid": 0,
        "risky": 0,
    },
}

# --- jobs -------------------------------------------------------------------------------

_JOB_ZERO: dict[str, Any] = {
    "job_id": 42,
    "total_emails": 2500,
    "processed_emails": 0,
    "percent_complete": 0.0,
    "valid_count": 0,
    "invalid_count": 0,
    "catch_all_count": 0,
    "likely_valid_count": 0,
    "disposable_count": 0,
    "unknown_count": 0,
    "risky_count": 0,
    "unique_emails": None,
    "credits_reserved": 2500,
    "credits_refunded": 0,
    "created_at": "2026-11-20T09:15:02Z",
    "completed_at": None,
    "failed_reason": None,
    "webhook_secret": None,
}
_JOB_COUNTS: dict[str, Any] = {
    "valid_count": 1710,
    "invalid_count": 402,
    "catch_all_count": 233,
    "likely_valid_count": 61,
    "disposable_count": 38,
    "unknown_count": 105,
    "risky_count": 12,
    "unique_emails": 2490,
}
JOB_STATES: dict[str, dict[str, Any]] = {
    "pending": {
        "summary": "Accepted, waiting for a worker",
        "value": {**_JOB_ZERO, "status": "pending"},
    },
    "processing": {
        "summary": "Being verified",
        "value": {
            **_JOB_ZERO,
            "status": "processing",
            "processed_emails": 1100,
            "percent_complete": 44.0,
            "valid_count": 760,
            "invalid_count": 181,
            "catch_all_count": 97,
            "likely_valid_count": 25,
            "disposable_count": 15,
            "unknown_count": 40,
            "risky_count": 7,
            "unique_emails": 2490,
        },
    },
    "completed": {
        "summary": "Done: download the results",
        "value": {
            **_JOB_ZERO,
            **_JOB_COUNTS,
            "status": "completed",
            "processed_emails": 2500,
            "percent_complete": 100.0,
            "completed_at": "2026-11-20T09:21:47Z",
        },
    },
    "failed": {
        "summary": "Failed: the unverified addresses were refunded",
        "value": {
            **_JOB_ZERO,
            "status": "failed",
            "processed_emails": 600,
            "percent_complete": 24.0,
            "valid_count": 410,
            "invalid_count": 120,
            "catch_all_count": 40,
            "likely_valid_count": 9,
            "disposable_count": 10,
            "unknown_count": 20,
            "unique_emails": 2490,
            "credits_refunded": 1900,
            "completed_at": "2026-11-20T09:40:10Z",
            "failed_reason": "The job stopped responding twice and was given up; the 1,900 "
            "addresses not verified were refunded.",
        },
    },
}
JOB_STATES["cancelled"] = {
    "summary": "Cancelled by its owner: the settled rows downloadable, the rest refunded",
    "value": {
        **JOB_STATES["failed"]["value"],
        "failed_reason": "cancelled by its owner after 600 of 2500 rows",
        "cancelled_at": "2026-11-20T09:40:10Z",
    },
}


def _json_job(state: str) -> dict[str, Any]:
    example = copy.deepcopy(JOB_STATES[state])
    value = example["value"]
    value.update({"offset": 0, "limit": 100, "next_offset": None, "results": None})
    if state == "completed":
        value.update(
            {
                "total_emails": 4,
                "processed_emails": 4,
                "credits_reserved": 4,
                "valid_count": 1,
                "invalid_count": 1,
                "catch_all_count": 1,
                "likely_valid_count": 0,
                "disposable_count": 0,
                "unknown_count": 1,
                "risky_count": 0,
                "unique_emails": 4,
                "results": [VALID_RESULT, INVALID_RESULT, CATCHALL_RESULT, UNKNOWN_RESULT],
            }
        )
    return example


_FINDER_ZERO: dict[str, Any] = {
    "job_id": "fj_3kq9x2m7",
    "total_rows": 300,
    "processed_rows": 0,
    "percent_complete": 0.0,
    "found_count": 0,
    "not_found_count": 0,
    "catch_all_count": 0,
    "invalid_input_count": 0,
    "skipped_no_credits_count": 0,
    "credits_used": 0,
    "created_at": "2026-11-20T10:02:11Z",
    "completed_at": None,
    "failed_reason": None,
}
FINDER_STATES: dict[str, dict[str, Any]] = {
    "pending": {"summary": "Accepted", "value": {**_FINDER_ZERO, "status": "pending"}},
    "processing": {
        "summary": "Looking people up",
        "value": {
            **_FINDER_ZERO,
            "status": "processing",
            "processed_rows": 120,
            "percent_complete": 40.0,
            "found_count": 71,
            "not_found_count": 30,
            "catch_all_count": 15,
            "invalid_input_count": 4,
            "credits_used": 710,
        },
    },
    "completed": {
        "summary": "Done: download the results",
        "value": {
            **_FINDER_ZERO,
            "status": "completed",
            "processed_rows": 300,
            "percent_complete": 100.0,
            "found_count": 176,
            "not_found_count": 71,
            "catch_all_count": 40,
            "invalid_input_count": 9,
            "skipped_no_credits_count": 4,
            "credits_used": 1760,
            "completed_at": "2026-11-20T10:09:30Z",
        },
    },
    "failed": {
        "summary": "Failed",
        "value": {
            **_FINDER_ZERO,
            "status": "failed",
            "processed_rows": 50,
            "percent_complete": 16.66,
            "found_count": 30,
            "not_found_count": 20,
            "credits_used": 300,
            "completed_at": "2026-11-20T10:05:00Z",
            "failed_reason": "The job stopped responding twice and was given up.",
        },
    },
}
FINDER_STATES["cancelled"] = {
    "summary": "Cancelled by its owner: the finds in its partial results stay charged",
    "value": {
        **FINDER_STATES["failed"]["value"],
        "failed_reason": "cancelled by its owner after 50 of 300 rows",
        "cancelled_at": "2026-11-20T10:05:00Z",
    },
}

FIND_EMAIL_EXAMPLES: dict[str, dict[str, Any]] = {
    "found": {
        "summary": "Found and verified (charged)",
        "value": model_example(FindEmailResponse),
    },
    "catch_all": {
        "summary": "A best guess on a catch-all domain (free)",
        "value": {
            "found": False,
            "email": "john.smith@catchall.example.org",
            "status": "catch_all",
            "confidence": 0.55,
            "elapsed_ms": 380,
            "credits_used": 0,
            "pattern": "first.last",
            "alternatives": [],
            "reason": "The mail server for catchall.example.org accepts any address, so "
            "the most common pattern is given unverified.",
        },
    },
    "not_found": {
        "summary": "No address found (free)",
        "value": {
            "found": False,
            "email": None,
            "status": "not_found",
            "confidence": 0.0,
            "elapsed_ms": 1240,
            "credits_used": 0,
            "pattern": None,
            "alternatives": ["john.smith@example.com", "john@example.com", "jsmith@example.com"],
            "reason": "The mail server for example.com refused every candidate address.",
        },
    },
}

HEALTHY: dict[str, Any] = {
    "status": "healthy",
    "version": API_VERSION,
    "uptime_seconds": 8123.402,
    "database_connected": True,
    "verifier_ready": True,
    "verification_provider": "verimail",
    "timestamp": "2026-11-20T09:15:02Z",
}
UNHEALTHY = {**HEALTHY, "status": "unhealthy", "database_connected": False}

RESULTS_CSV = (
    "name,email,Safe to Send\r\nAlice,alice@example.com,Yes\r\nNobody,nobody@example.com,No\r\n"
)
FINDER_CSV = (
    "first_name,last_name,domain,email,status,confidence\r\n"
    "John,Smith,example.com,john.smith@example.com,found,0.92\r\n"
    "Ann,Lee,catchall.example.org,ann.lee@catchall.example.org,catch_all,0.55\r\n"
)

# --- re-verification --------------------------------------------------------------------

REVERIFY_CREATED: dict[str, Any] = {
    **JOB_STATES["pending"]["value"],
    "job_id": 57,
    "created_at": "2026-12-20T09:00:03Z",
    "reverify_of": 42,
    "transitions": None,
}
CHANGES_CSV = (
    "row,email,previous_status,status,reason\n"
    "3,bob@example.com,valid,invalid,The mail server for example.com says this mailbox "
    "does not exist.\n"
    "7,carol@example.com,unknown,valid,The mail server for example.com confirmed that this "
    "mailbox exists.\n"
)
SCHEDULE: dict[str, Any] = {
    "list_job_id": 42,
    "every_days": 30,
    "next_run_at": "2026-12-20T09:00:00Z",
    "created_at": "2026-11-20T09:30:12Z",
}
REVERIFICATIONS: list[dict[str, Any]] = [
    {
        "requested_at": "2027-01-19T09:00:02Z",
        "scheduled": True,
        "previous_job_id": 57,
        "job_id": None,
        "status": "skipped",
        "transitions": {},
        "skipped_reason": "Not enough credits: re-verifying this list needs 2500 (1 per "
        "address), the balance is 120. Nothing was charged.",
    },
    {
        "requested_at": "2026-12-20T09:00:03Z",
        "scheduled": True,
        "previous_job_id": 42,
        "job_id": 57,
        "status": "completed",
        "transitions": {"valid->invalid": 31, "unknown->valid": 4},
        "skipped_reason": None,
    },
]


def _examples(table: dict[str, dict[str, Any]]) -> dict[str, Any]:
    return {"examples": copy.deepcopy(table)}


def one_example(summary: str, value: Any) -> dict[str, Any]:
    """A media type's ``examples`` holding the one example ``value``."""
    return {"examples": {"example": {"summary": summary, "value": value}}}


# (method, path) -> media type -> examples of its 200 answer
SUCCESS: dict[tuple[str, str], dict[str, dict[str, Any]]] = {
    ("get", "/api/health"): {"application/json": one_example("Healthy", HEALTHY)},
    ("post", "/api/verify/single"): {"application/json": _examples(RESULT_EXAMPLES)},
    ("post", "/api/verify/batch"): {
        "application/json": one_example("Four addresses, four verdicts", BATCH_EXAMPLE)
    },
    ("post", "/api/find-email"): {"application/json": _examples(FIND_EMAIL_EXAMPLES)},
    ("post", "/api/bulk"): {
        "application/json": one_example("Created", JOB_STATES["pending"]["value"]),
    },
    ("get", "/api/bulk/{job_id}"): {"application/json": _examples(JOB_STATES)},
    ("get", "/api/bulk/{job_id}/download"): {
        "text/csv": one_example("The upload with `Safe to Send` appended", RESULTS_CSV),
    },
    ("post", "/api/verify/bulk"): {
        "application/json": one_example(
            "Created",
            {"job_id": 43, "status": "pending", "total_emails": 4, "webhook_secret": None},
        )
    },
    ("get", "/api/verify/bulk/{job_id}"): {
        "application/json": _examples({state: _json_job(state) for state in JOB_STATES})
    },
    ("post", "/api/find-email/csv"): {
        "application/json": one_example("Created", FINDER_STATES["pending"]["value"]),
    },
    ("get", "/api/find-email/csv/{job_id}"): {"application/json": _examples(FINDER_STATES)},
    ("get", "/api/find-email/csv/{job_id}/download"): {
        "text/csv": one_example("The upload with the finder's columns appended", FINDER_CSV),
    },
    ("post", "/api/bulk/{job_id}/reverify"): {
        "application/json": one_example("Created: job 57 re-verifies job 42", REVERIFY_CREATED),
    },
    ("get", "/api/bulk/{job_id}/changes"): {
        "text/csv": one_example("The rows whose status changed", CHANGES_CSV),
    },
    ("put", "/api/bulk/{job_id}/reverify-schedule"): {
        "application/json": one_example("Every 30 days", SCHEDULE),
    },
    ("get", "/api/bulk/{job_id}/reverify-schedule"): {
        "application/json": one_example("Every 30 days", SCHEDULE),
    },
    ("get", "/api/reverify-schedules"): {
        "application/json": one_example("One list on a schedule", [SCHEDULE]),
    },
    ("post", "/api/bulk/{job_id}/cancel"): {
        "application/json": {"examples": {"cancelled": copy.deepcopy(JOB_STATES["cancelled"])}},
    },
    ("post", "/api/find-email/csv/{job_id}/cancel"): {
        "application/json": {"examples": {"cancelled": copy.deepcopy(FINDER_STATES["cancelled"])}},
    },
    ("get", "/api/bulk/{job_id}/reverifications"): {
        "application/json": one_example("A run made, then one skipped", REVERIFICATIONS),
    },
}
