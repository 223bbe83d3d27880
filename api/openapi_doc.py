"""The published OpenAPI document: FastAPI's, completed with examples and the edge refusals.

Why one long file: it is mostly data, the examples and refusals of every operation, kept
together so that /docs reads consistently.

FastAPI builds the schema from the routes and models; this module adds what a reader of
``/docs`` needs and the routes cannot say one by one:

- response examples for every status of every operation: results (valid, invalid,
  catch-all, unknown), jobs in each state, and an error body for each refusal;
- the refusals every operation with a body can answer before its route runs (413 body too
  large, 408 body too slow, see :mod:`verimail.api.body_limit`).

Examples already declared on a route are kept. Nothing here changes what the server does.
"""

from __future__ import annotations

import copy
from typing import Any

from fastapi import FastAPI
from fastapi.openapi.utils import get_openapi

from verimail import API_VERSION
from verimail.schemas.errors import ValidationErrorBody
from verimail.schemas.finder import FindEmailResponse


def _model_example(model: Any) -> dict[str, Any]:
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
    "reason": "The mail server for example.com says this mailbox does not exist.",
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

FIND_EMAIL_EXAMPLES: dict[str, dict[str, Any]] = {
    "found": {
        "summary": "Found and verified (charged)",
        "value": _model_example(FindEmailResponse),
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


def _one(summary: str, value: Any) -> dict[str, Any]:
    return {"examples": {"example": {"summary": summary, "value": value}}}


# (method, path) -> media type -> examples of its 200 answer
SUCCESS: dict[tuple[str, str], dict[str, dict[str, Any]]] = {
    ("get", "/api/health"): {"application/json": _one("Healthy", HEALTHY)},
    ("post", "/api/verify/single"): {"application/json": _examples(RESULT_EXAMPLES)},
    ("post", "/api/verify/batch"): {
        "application/json": _one("Four addresses, four verdicts", BATCH_EXAMPLE)
    },
    ("post", "/api/find-email"): {"application/json": _examples(FIND_EMAIL_EXAMPLES)},
    ("post", "/api/bulk"): {
        "application/json": _one("Created", JOB_STATES["pending"]["value"]),
    },
    ("get", "/api/bulk/{job_id}"): {"application/json": _examples(JOB_STATES)},
    ("get", "/api/bulk/{job_id}/download"): {
        "text/csv": _one("The upload with `Safe to Send` appended", RESULTS_CSV),
    },
    ("post", "/api/verify/bulk"): {
        "application/json": _one(
            "Created",
            {"job_id": 43, "status": "pending", "total_emails": 4, "webhook_secret": None},
        )
    },
    ("get", "/api/verify/bulk/{job_id}"): {
        "application/json": _examples({state: _json_job(state) for state in JOB_STATES})
    },
    ("post", "/api/find-email/csv"): {
        "application/json": _one("Created", FINDER_STATES["pending"]["value"]),
    },
    ("get", "/api/find-email/csv/{job_id}"): {"application/json": _examples(FINDER_STATES)},
    ("get", "/api/find-email/csv/{job_id}/download"): {
        "text/csv": _one("The upload with the finder's columns appended", FINDER_CSV),
    },
    ("post", "/api/bulk/{job_id}/reverify"): {
        "application/json": _one("Created: job 57 re-verifies job 42", REVERIFY_CREATED),
    },
    ("get", "/api/bulk/{job_id}/changes"): {
        "text/csv": _one("The rows whose status changed", CHANGES_CSV),
    },
    ("put", "/api/bulk/{job_id}/reverify-schedule"): {
        "application/json": _one("Every 30 days", SCHEDULE),
    },
    ("get", "/api/bulk/{job_id}/reverify-schedule"): {
        "application/json": _one("Every 30 days", SCHEDULE),
    },
    ("get", "/api/reverify-schedules"): {
        "application/json": _one("One list on a schedule", [SCHEDULE]),
    },
    ("get", "/api/bulk/{job_id}/reverifications"): {
        "application/json": _one("A run made, then one skipped", REVERIFICATIONS),
    },
}

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
}
VALIDATION: dict[str, Any] = _model_example(ValidationErrorBody)
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


def _error_example(method: str, path: str, status: str) -> dict[str, Any] | None:
    if status == "422":
        value = VALIDATION_OVERRIDES.get((method, path), VALIDATION)
        if (method, path, status) in ERROR_OVERRIDES:
            value = {"detail": ERROR_OVERRIDES[(method, path, status)]}
        return {"example": value}
    detail = ERROR_OVERRIDES.get((method, path, status), ERRORS.get(status))
    return {"example": {"detail": detail}} if detail else None


def _add_body_refusals(method: str, operation: dict[str, Any]) -> None:
    """413/408: answered by the body limit before any route with a body runs."""
    if "requestBody" not in operation:
        return
    responses = operation["responses"]
    error_ref = {"$ref": "#/components/schemas/ErrorBody"}
    for status, description in BODY_REFUSALS.items():
        if status not in responses:
            responses[status] = {
                "description": description,
                "content": {"application/json": {"schema": error_ref}},
            }
    operation["responses"] = dict(sorted(responses.items()))


def _schema_example(document: dict[str, Any], schema: Any) -> dict[str, Any] | None:
    """The example a response's model declares (``json_schema_extra``), for operations this
    module has no example of its own for."""
    if not isinstance(schema, dict):
        return None
    ref = schema.get("$ref", "")
    if ref.startswith("#/components/schemas/"):
        schema = document.get("components", {}).get("schemas", {}).get(ref.rsplit("/", 1)[1], {})
    if "example" in schema:
        return {"example": schema["example"]}
    if schema.get("examples"):
        return {"example": schema["examples"][0]}
    return None


def complete_document(document: dict[str, Any]) -> dict[str, Any]:
    """``document`` with examples on every response and the edge refusals documented."""
    for path, operations in document.get("paths", {}).items():
        for method, operation in operations.items():
            _add_body_refusals(method, operation)
            for status, response in operation.get("responses", {}).items():
                for media_type, content in response.get("content", {}).items():
                    if "example" in content or "examples" in content:
                        continue
                    if status.startswith("2"):
                        found = SUCCESS.get((method, path), {}).get(media_type)
                        found = found or _schema_example(document, content.get("schema"))
                    elif status == "503" and path == "/api/health":
                        found = _one("Unhealthy: the database did not answer", UNHEALTHY)
                    else:
                        found = _error_example(method, path, status)
                    if found:
                        content.update(copy.deepcopy(found))
    return document


def install_openapi(app: FastAPI) -> None:
    """Serve the completed document at ``app.openapi_url`` (built once, on first request)."""

    def openapi() -> dict[str, Any]:
        if app.openapi_schema is None:
            app.openapi_schema = complete_document(
                get_openapi(
                    title=app.title,
                    version=app.version,
                    description=app.description,
                    routes=app.routes,
                    tags=app.openapi_tags,
                    servers=app.servers,
                )
            )
        return app.openapi_schema

    app.openapi = openapi  # type: ignore[method-assign]
