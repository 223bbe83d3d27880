"""The bodies of error answers: ``{"detail": "<a sentence a person understands>"}`` for
every error, and for a 422 the structured ``errors`` behind it (``api/errors.py`` writes
them), every field described for OpenAPI.
"""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict, Field


class ErrorBody(BaseModel):
    """The body of every error response."""

    model_config = ConfigDict(json_schema_extra={"example": {"detail": "Invalid API key."}})

    detail: str = Field(description="Human-readable explanation of what went wrong.")


class ValidationIssue(BaseModel):
    """One problem found in the request (the structured form behind `detail`)."""

    type: str = Field(description="Machine-readable error type, e.g. `missing`, `too_long`.")
    loc: list[str | int] = Field(
        description="Where the problem is: `body`, then field names and list indexes."
    )
    msg: str = Field(description="The validator's own message.")
    ctx: dict[str, Any] | None = Field(
        None, description='Limits involved, e.g. `{"max_length": 500}`.'
    )


class ValidationErrorBody(BaseModel):
    """The body of a 422: a readable `detail` plus the structured `errors` list."""

    model_config = ConfigDict(
        json_schema_extra={
            "example": {
                "detail": "emails: at most 500 addresses per request",
                "errors": [
                    {
                        "type": "too_long",
                        "loc": ["body", "emails"],
                        "msg": "List should have at most 500 items after validation, not 501",
                        "ctx": {"max_length": 500},
                    }
                ],
            }
        }
    )

    detail: str = Field(
        description="Every problem in one readable string, e.g. `email: field required`."
    )
    errors: list[ValidationIssue] | None = Field(
        None,
        description="The same problems, structured (absent when the refusal is about the "
        "request as a whole, e.g. an upload that is not a CSV).",
    )
