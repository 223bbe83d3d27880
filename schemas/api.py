"""Request and response models of the verify and health endpoints, every field described
for OpenAPI (the other resources' models have their own modules here).

The result record is the engine's :class:`~verimail.schemas.results.VerificationResult`
(SPEC §2.2 plus ``sub_status``, ``did_you_mean`` and ``catch_all_score``); it is re-declared
here only to give every field a description in the published schema.
"""

from __future__ import annotations

from datetime import datetime
from typing import Annotated, Literal

from pydantic import BaseModel, ConfigDict, Field

from verimail.schemas.limits import MAX_BATCH, MAX_EMAIL_LENGTH, TIMEOUT_MAX, TIMEOUT_MIN
from verimail.schemas.results import VerificationResult

EmailText = Annotated[
    str,
    Field(
        strict=True,
        max_length=MAX_EMAIL_LENGTH,
        # No `format: email`: any string is taken, the empty one too, and charged; what is
        # not an address is answered as an `invalid` result, not refused.
        description=(
            "Address to verify. Any string up to 320 characters is accepted, the empty "
            "string too: a malformed address is not a 422 but a result with status "
            "`invalid` and the syntax reason (and it costs its credit like any other)."
        ),
        examples=["alice@example.com"],
    ),
]


CallTimeout = Annotated[
    float | None,
    Field(
        strict=True,  # a number: `true` is not 1 second
        ge=TIMEOUT_MIN,
        le=TIMEOUT_MAX,
        description="Deadline of the call in seconds, 1 to 60 (default 10, the "
        "`VERIMAIL_VERIFY_TIMEOUT` setting). What is not settled by then is answered "
        "`unknown` with `sub_status` `timeout` (or `greylisted`, with `retry_after`); the "
        "answer never comes later than the deadline. Greylisting is never waited out here.",
        examples=[10],
    ),
]


class SingleRequest(BaseModel):
    """Body of `POST /api/verify/single`: the address to verify."""

    model_config = ConfigDict(json_schema_extra={"example": {"email": "alice@example.com"}})

    email: EmailText
    timeout: CallTimeout = None


class BatchRequest(BaseModel):
    """Body of `POST /api/verify/batch`: the addresses to verify."""

    model_config = ConfigDict(
        json_schema_extra={"example": {"emails": ["alice@example.com", "bob@example.org"]}}
    )

    emails: list[EmailText] = Field(
        min_length=1,
        max_length=MAX_BATCH,
        description="1 to 500 addresses. Each submitted address costs 1 credit, duplicates "
        "included; a duplicate is verified only once.",
    )
    timeout: CallTimeout = None


class VerifyResult(VerificationResult):
    """One verified address: the verdict (`status`, `sub_status`, `safe_to_send`), how
    sure it is, why, and what was learned about the domain and its mail server."""

    # (The fields are the engine's VerificationResult; this is the API's name for it.)

    @classmethod
    def of(cls, result: VerificationResult) -> VerifyResult:
        """The API form of an engine result (same fields)."""
        return cls.model_validate(result.model_dump())


class BatchSummary(BaseModel):
    """How many submitted addresses got each status (duplicates counted each time)."""

    valid: int = Field(description="Results with status `valid`.")
    invalid: int = Field(description="Results with status `invalid`.")
    disposable: int = Field(description="Results with status `disposable`.")
    catchall: int = Field(description="Results with status `catchall`.")
    unknown: int = Field(description="Results with status `unknown`.")
    likely_valid: int = Field(description="Results with status `likely_valid`.")
    risky: int = Field(description="Results with status `risky`.")


class BatchResponse(BaseModel):
    """Response of `POST /api/verify/batch`."""

    results: list[VerifyResult] = Field(
        description="One result per submitted address, in the order submitted."
    )
    credits_used: int = Field(
        description="Credits charged: 1 per submitted address, duplicates included."
    )
    summary: BatchSummary = Field(description="Count of results per status.")


class EgressHealth(BaseModel):
    """One egress's check: port 25 of the probe domain's mail server greeted us through it."""

    name: str = Field(description="The egress (`direct`, or a proxy's name).")
    ok: bool = Field(description="The server greeted us through it in time.")
    detail: str = Field(description="What was found (a proxy's password is never shown).")
    advice: str | None = Field(None, description="On failure, one sentence on what to do.")


class SmtpEgressHealth(BaseModel):
    """The SMTP egress checks `verimail doctor` runs, as the API last ran them in the
    background (every `VERIMAIL_DOCTOR_INTERVAL` seconds): a health answer never waits on
    SMTP."""

    ok: bool | None = Field(
        description="Every egress greeted us; null until the first round has ended."
    )
    checked_at: datetime | None = Field(description="When the last round ended (UTC).")
    egresses: list[EgressHealth] = Field(description="One entry per configured egress.")


class HealthResult(BaseModel):
    """Service health; 200 when healthy, 503 with the same body when not."""

    status: Literal["healthy", "unhealthy"] = Field(
        description="`healthy` when the database answers and the verifier is ready."
    )
    version: str = Field(description="API version.")
    uptime_seconds: float = Field(description="Seconds since this API process started.")
    database_connected: bool = Field(description="The database answered `SELECT 1` just now.")
    verifier_ready: bool = Field(
        description="The verification engine has a usable DNS resolver configuration."
    )
    verification_provider: str = Field(description="Verification service identifier.")
    timestamp: datetime = Field(description="Current server time, ISO 8601, UTC.")
    smtp_egress: SmtpEgressHealth | None = Field(
        None,
        description="Whether port 25 answers through each egress (see docs/egress.md); it "
        "does not change `status`. Null when the checks are off (`VERIMAIL_DOCTOR_INTERVAL=0`).",
    )
