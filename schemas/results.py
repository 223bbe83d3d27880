"""The verification result record: every field of SPEC §2.2 plus our own extras."""

from __future__ import annotations

from pydantic import BaseModel, Field

from verimail.schemas.outcomes import Status, SubStatus


class VerificationResult(BaseModel):
    """One verified address: the verdict, how sure it is, why, and what was learned about
    the domain and its mail server."""

    email: str = Field(
        description="Address that was verified: as submitted, trimmed, with its domain "
        "lower-cased and IDNA-encoded (the local part kept as typed)."
    )
    safe_to_send: bool = Field(description="True only when `status` is `valid`.")
    status: Status = Field(
        description="Overall verdict: `valid`, `invalid`, `disposable`, `catchall`, "
        "`unknown`, `likely_valid` or `risky`."
    )
    confidence_score: float = Field(
        ge=0.0, le=1.0, description="Confidence in `status`, 0.0 to 1.0 inclusive."
    )
    reason: str = Field(description="Human-readable explanation of the verdict.")
    domain: str = Field(description="Domain of the address (lower-case, IDNA/ASCII form).")
    is_disposable: bool = Field(description="The domain belongs to a disposable email service.")
    is_role_based: bool = Field(
        description="The local part is a role (info@, support@ …) rather than a person."
    )
    is_free: bool = Field(description="The domain is a free email provider.")
    is_catch_all: bool = Field(description="The domain's mail server accepts any address.")
    mx_records: list[str] = Field(description="MX hosts of the domain, by preference.")
    smtp_response: str | None = Field(
        None, description="Last SMTP reply about this address; null when there was none."
    )
    verification_time_ms: int | None = Field(
        None, ge=0, description="Time the verification took, in milliseconds."
    )
    api_version: str | None = Field(None, description="API version that produced the result.")
    sub_status: SubStatus = Field(
        SubStatus.OK, description="A finer reason than `status`, e.g. `mailbox_not_found`."
    )
    did_you_mean: str | None = Field(
        None, description="Suggested correction for a likely typo in the domain; else null."
    )
    catch_all_score: int | None = Field(
        None,
        ge=0,
        le=100,
        description="On catch-all domains, 0-100 likelihood that the mailbox exists (80 and "
        "above: high confidence, status `likely_valid`); null elsewhere.",
    )
    retry_after: int | None = Field(
        None,
        ge=0,
        description="With `sub_status` `greylisted`: seconds after which asking again is "
        "worthwhile (the server's own figure when its reply names one); null otherwise.",
    )
