"""The verification result record: every field of SPEC §2.2 plus our own extras."""

from __future__ import annotations

from pydantic import BaseModel, Field

from verimail.schemas.outcomes import Status, SubStatus


class VerificationResult(BaseModel):
    """One verified address (SPEC §2.2) with ``sub_status``, ``did_you_mean`` and
    ``catch_all_score`` added."""

    email: str = Field(description="Address that was verified, as submitted (trimmed).")
    safe_to_send: bool = Field(description="True only when `status` is `valid`.")
    status: Status
    confidence_score: float = Field(ge=0.0, le=1.0)
    reason: str = Field(description="Human-readable explanation.")
    domain: str = Field(description="Domain of the address (lower-case, IDNA/ASCII form).")
    is_disposable: bool
    is_role_based: bool
    is_free: bool
    is_catch_all: bool
    mx_records: list[str] = Field(description="MX hosts of the domain, by preference.")
    smtp_response: str | None = Field(
        None, description="Last SMTP reply about this address; null when none."
    )
    verification_time_ms: int | None = Field(None, ge=0)
    api_version: str | None = None
    sub_status: SubStatus = SubStatus.OK
    did_you_mean: str | None = Field(None, description="Suggested address for a likely typo.")
    catch_all_score: int | None = Field(
        None, ge=0, le=100, description="On catch-all domains: 0-100 likelihood it exists."
    )
