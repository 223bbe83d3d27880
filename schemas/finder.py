"""The Email Finder's contract: ``POST /api/find-email``'s body and answer, and
``GET /api/domain-pattern``'s answer, every field described for OpenAPI.

The checks that a name has usable letters and that ``domain`` is a domain name are the
engine's (its title and suffix lists, its address syntax), which this package may not
import: the route adds them to :class:`FindEmailRequest` in a subclass of the same name
(``api/routes/finder.py``), and that subclass is what the API and the dashboard validate
with. ``of(result)`` takes the engine's finder result (anything with its attributes).
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from verimail.schemas.api import CallTimeout
from verimail.schemas.limits import DOMAIN_MAX_LENGTH, DOMAIN_PATTERN, NAME_MAX_LENGTH


class FindEmailRequest(BaseModel):
    """Body of `POST /api/find-email`: the person and their company's domain."""

    model_config = ConfigDict(
        json_schema_extra={
            "example": {"first_name": "John", "last_name": "Smith", "domain": "example.com"}
        }
    )

    first_name: str = Field(
        min_length=1,
        max_length=NAME_MAX_LENGTH,
        description="Person's first name. Titles (Dr, Mr …) are ignored, accents folded.",
    )
    last_name: str = Field(
        min_length=1,
        max_length=NAME_MAX_LENGTH,
        description="Person's last name. Suffixes (Jr, PhD …) are ignored, accents folded.",
    )
    domain: str = Field(
        min_length=1,
        max_length=DOMAIN_MAX_LENGTH,
        description="Company domain, e.g. `example.com`. A URL or `www.` prefix is trimmed; "
        "IP addresses and single-label names are refused (422).",
        json_schema_extra={"pattern": DOMAIN_PATTERN},
    )

    timeout: CallTimeout = None


class FindEmailResponse(BaseModel):
    """What the Email Finder found: the address (when any), how sure, and why."""

    model_config = ConfigDict(
        json_schema_extra={
            "example": {
                "found": True,
                "email": "john.smith@example.com",
                "status": "found",
                "confidence": 0.92,
                "elapsed_ms": 412,
                "credits_used": 10,
                "pattern": "first.last",
                "alternatives": [],
                "reason": "The mail server for example.com confirmed that "
                "john.smith@example.com exists …",
            }
        }
    )

    found: bool = Field(description="True when a verified email was found (status `found`).")
    email: str | None = Field(
        description="The verified address; on `catch_all` the most likely (unverified) "
        "guess; null when none was found. Never a role inbox (info@, sales@ …)."
    )
    status: Literal["found", "not_found", "catch_all"] = Field(
        description="`found`: verified over SMTP. `catch_all`: the domain accepts any "
        "address, so `email` is a best guess. `not_found`: no address (see `reason`)."
    )
    confidence: float = Field(
        ge=0.0,
        le=1.0,
        description="0.0 to 1.0; 0 when not found. Found: pattern likelihood (raised by "
        "the domain's learned pattern, see `GET /api/domain-pattern`) × verification "
        "confidence (≈0.92 for first.last). Catch-all guesses stay at or below 0.6.",
    )
    elapsed_ms: int = Field(ge=0, description="Lookup time in milliseconds.")
    credits_used: int = Field(
        ge=0, description="Credits charged: the finder charge when found, else 0."
    )
    pattern: str | None = Field(
        description="Local-part pattern of `email`, e.g. `first.last`, `flast`; null if none."
    )
    alternatives: list[str] = Field(
        description="Other candidate addresses probed over SMTP, in the order tried."
    )
    reason: str = Field(description="Human-readable explanation of the result.")

    @classmethod
    def of(cls, result: Any, credits_used: int) -> FindEmailResponse:
        """The answer for the engine's ``FinderResult``, with what was charged for it."""
        return cls(
            found=result.found,
            email=result.email,
            status=result.status,
            confidence=result.confidence,
            elapsed_ms=result.elapsed_ms,
            credits_used=credits_used,
            pattern=result.pattern,
            alternatives=list(result.alternatives),
            reason=result.reason,
        )


class LearnedPattern(BaseModel):
    """One pattern found at the domain and how often."""

    pattern: str = Field(description="Local-part pattern, e.g. `last.f`.")
    finds: int = Field(ge=0, description="Verified finds of this pattern at the domain.")
    confidence: float = Field(
        ge=0.0, le=1.0, description="share of the domain's finds × finds / (finds + 1)."
    )


class DomainPatternResponse(BaseModel):
    """A domain's learned local-part pattern (pattern names and counts only)."""

    model_config = ConfigDict(
        json_schema_extra={
            "example": {
                "domain": "example.com",
                "pattern": "last.f",
                "confidence": 0.95,
                "finds": 20,
                "total_finds": 20,
                "scope": "all",
                "patterns": [{"pattern": "last.f", "finds": 20, "confidence": 0.95}],
            }
        }
    )

    domain: str = Field(description="The domain (normalised: lower case, IDNA).")
    pattern: str | None = Field(
        description="The pattern most finds at the domain used; null before any find. The "
        "finder tries it first."
    )
    confidence: float = Field(
        ge=0.0,
        le=1.0,
        description="How established `pattern` is: its share of the domain's finds × "
        "finds / (finds + 1); one find gives 0.5, twenty 0.95, 0 before any find.",
    )
    finds: int = Field(ge=0, description="Verified finds of `pattern` at the domain.")
    total_finds: int = Field(ge=0, description="Verified finds at the domain, all patterns.")
    scope: Literal["all", "account"] = Field(
        description="Whose finds are counted: `all` accounts or this `account` only (the "
        "server's `VERIMAIL_FINDER_PATTERN_SCOPE`)."
    )
    patterns: list[LearnedPattern] = Field(
        description="Every pattern found at the domain, most found first (the order the "
        "finder tries them in)."
    )
