"""The body of ``POST /api/verify/bulk``: up to 10,000 addresses verified as a job, each
entry refused (422) when the job's stored list could not give it back as sent.

Its answers (``JsonBulkCreated``, ``JsonBulkJob``) are job models, in ``schemas/jobs.py``.
"""

from __future__ import annotations

import unicodedata
from typing import Annotated

from pydantic import AfterValidator, AnyHttpUrl, BaseModel, Field, UrlConstraints
from pydantic_core import PydanticCustomError

from verimail.schemas.limits import MAX_EMAIL_LENGTH, MAX_JSON_BULK, MAX_URL_LENGTH

WebhookUrl = Annotated[AnyHttpUrl, UrlConstraints(max_length=MAX_URL_LENGTH)]
"""A job's ``webhook_url`` as the JSON bodies take it (the upload forms: a text field)."""


def _storable(entry: str) -> str:
    """Refuse an entry the job's stored list could not give back as sent.

    The list is kept as a CSV file that the job reads with the upload reader, so a control
    character (a CR read as a line end, a NUL read as binary data) would split or fail the
    job after its credits were reserved. Line breaks and tabs around an address are
    whitespace, trimmed as single and batch trim them (a CRLF file split at LF leaves a CR
    on every line); one inside an entry, or any other control character, is a 422: no
    address holds one, and it is nearly always lines sent unsplit."""
    if entry.isprintable():
        return entry  # (the common case: no control character at all)
    core = entry.strip()
    for char in core:
        if unicodedata.category(char) == "Cc":
            name = unicodedata.name(char, "") or _CONTROL_NAMES.get(char, "control character")
            raise PydanticCustomError(
                "control_character",
                "holds a control character ({code}, {name}); send one address per entry, "
                "without control characters",
                {"code": f"U+{ord(char):04X}", "name": name.lower()},
            )
    # Only trimmed when the edges held a control character: other entries stay as sent.
    return core if any(unicodedata.category(c) == "Cc" for c in entry) else entry


STORABLE_ENTRY = r"^\s*[^\x00-\x1f\x7f-\x9f]*\s*$"
"""What :func:`_storable` lets through, for the schema: no control character but in the
whitespace around the entry."""

JsonBulkEntry = Annotated[
    str,
    Field(max_length=MAX_EMAIL_LENGTH, json_schema_extra={"pattern": STORABLE_ENTRY}),
    AfterValidator(_storable),
]

_CONTROL_NAMES = {"\x00": "NUL", "\t": "tab", "\n": "line feed", "\r": "carriage return"}


class JsonBulkRequest(BaseModel):
    """``POST /api/verify/bulk``: up to 10,000 addresses verified as a job."""

    emails: list[JsonBulkEntry] = Field(
        min_length=1,
        max_length=MAX_JSON_BULK,
        description="1 to 10,000 addresses, one per entry; an entry holding a control "
        "character (a line break, a tab, NUL) is a 422. Empty entries are dropped (not "
        "charged), but at least one entry must hold an address.",
        json_schema_extra={"contains": {"type": "string", "pattern": r"\S"}},
    )
    webhook_url: WebhookUrl | None = Field(
        None,
        description="Optional: POSTed the final job when it completes or fails, signed "
        "with the `webhook_secret` of the response (polling works as well).",
    )
    retry_unknowns: bool = Field(
        True,
        strict=True,  # true or false: 0 and "no" are refused, as the schema says
        description="Retry greylisted and temporarily failed addresses in later passes "
        "(the job shows `phase` `waiting_to_retry` meanwhile); `false`: finish after the "
        "first pass.",
    )
