"""``POST /api/find-email``: the Email Finder, single lookup (SPEC §2.5, §2.6, §4 #6).

Unlike verification, the finder is charged *after* the work and only for a verified find
(SPEC §1): ``settings.finder_charge`` credits, else nothing. Order of the checks:

1. 401 missing/invalid key, 429 over the plan's limits (``AccountDep``);
2. 403 when the account has the finder switched off;
3. 422 invalid body, names with nothing usable, a domain that is not one;
4. 402 when the balance is below the charge — before any DNS or SMTP work, so a client
   without credits never costs us (or the mail server) a session;
5. the lookup; on ``found`` the charge, atomically through
   :func:`verimail.api.billing.charged`. If it fails because a concurrent request spent
   the credits meanwhile, the answer is 402 and the address is *not* returned: a find is
   only handed out once it is paid for.
"""

from __future__ import annotations

from typing import Annotated, Literal

from anyio import to_thread
from fastapi import APIRouter, Depends, Query, Request
from fastapi.exceptions import RequestValidationError
from pydantic import BaseModel, ConfigDict, Field, ValidationInfo, field_validator
from pydantic_core import PydanticCustomError

from verimail.api.billing import charged
from verimail.api.deps import AccountDep, EngineDep, StoreDep
from verimail.api.errors import (
    AUTH_ERRORS,
    COMMON_ERRORS,
    ApiError,
    ValidationErrorBody,
    error_doc,
)
from verimail.config import Settings
from verimail.engine.finder import (
    NAME_MAX_LENGTH,
    FinderInputError,
    FinderResult,
    NameField,
    check_name_part,
    find_email_within,
    normalise_finder_domain,
)
from verimail.engine.smtp.host_slots import urgent
from verimail.flows.learned_patterns import StoredPatterns
from verimail.schemas.api import CallTimeout
from verimail.store.accounts import Account
from verimail.store.credits import balance
from verimail.store.prices import price

router = APIRouter(tags=["email finder"])

FINDER_DISABLED = "The Email Finder is not enabled for this account."
DOMAIN_MAX_LENGTH = 300  # a pasted URL is trimmed to its host, so allow some slack


def _input_error(exc: FinderInputError) -> PydanticCustomError:
    return PydanticCustomError("finder_input", "{detail}", {"detail": exc.detail})


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
    )

    timeout: CallTimeout = None

    @field_validator("first_name", "last_name")
    @classmethod
    def _usable_name(cls, value: str, info: ValidationInfo) -> str:
        field: NameField = "last_name" if info.field_name == "last_name" else "first_name"
        try:
            check_name_part(value, field)
        except FinderInputError as exc:
            raise _input_error(exc) from exc
        return value

    @field_validator("domain")
    @classmethod
    def _real_domain(cls, value: str) -> str:
        try:
            return normalise_finder_domain(value)
        except FinderInputError as exc:
            raise _input_error(exc) from exc


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
    def of(cls, result: FinderResult, credits_used: int) -> FindEmailResponse:
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


def app_settings(request: Request) -> Settings:
    """The settings the app was created with (the finder charge and probe limit)."""
    settings: Settings = request.app.state.settings
    return settings


async def finder_account(account: AccountDep) -> Account:
    """The caller's account, refused with 403 when its Email Finder is switched off."""
    if not account.finder_enabled:
        raise ApiError(403, FINDER_DISABLED)
    return account


FinderAccountDep = Annotated[Account, Depends(finder_account)]
SettingsDep = Annotated[Settings, Depends(app_settings)]


@router.post(
    "/api/find-email",
    response_model=FindEmailResponse,
    summary="Find a person's email address",
    description="Builds the likely addresses from the name (first.last, first, flast …; "
    "never role inboxes), then checks them over one SMTP session with the domain's mail "
    "server until one is accepted. Charged only for a verified find (`credits_used`); "
    "`not_found` and `catch_all` cost nothing. The balance must cover one find before "
    "the lookup starts (else 402, nothing is looked up). The domain's learned pattern "
    "(`GET /api/domain-pattern`) is tried first, and a find teaches it. At most "
    "`VERIMAIL_FINDER_MAX_PROBES` candidates (20) are asked; a policy block or a 421 on the "
    "first ends the lookup as `not_found` (see `reason`), not charged.",
    responses={
        **AUTH_ERRORS,
        402: error_doc(
            "The balance is below the price of one find; nothing was looked up or charged. "
            "Also when a concurrent request spent the credits during the lookup: then the "
            "found address is not returned and nothing is charged."
        ),
        403: error_doc(FINDER_DISABLED),
        422: {
            "model": ValidationErrorBody,
            "description": "The body is not JSON, a field is missing or empty, a name has no "
            "usable letters, or `domain` is not a domain name (e.g. an IP address).",
        },
        **COMMON_ERRORS,
    },
)
async def find_email_route(
    body: FindEmailRequest,
    account: FinderAccountDep,
    store: StoreDep,
    engine: EngineDep,
    settings: SettingsDep,
) -> FindEmailResponse:
    cost = price("find", 1, settings)
    have = await to_thread.run_sync(lambda: balance(store.engine, account.id).total)
    if have < cost:
        raise ApiError(
            402,
            f"Not enough credits: a found address costs {cost}, the balance is {have}; "
            "nothing was looked up or charged.",
        )
    try:
        with urgent():
            result = await find_email_within(
                body.timeout or settings.verify_timeout,
                engine,
                body.first_name,
                body.last_name,
                body.domain,
                max_probes=settings.finder_max_probes,
                patterns=StoredPatterns(store, account.id, settings),
            )
    except FinderInputError as exc:  # the model validated already; kept for safety
        where = exc.field or "body"
        raise RequestValidationError(
            [{"type": "finder_input", "loc": ("body", where), "msg": exc.detail}]
        ) from exc
    if not result.found:
        return FindEmailResponse.of(result, credits_used=0)
    async with charged(store, account.id, cost, reason=f"email finder: {result.email}"):
        return FindEmailResponse.of(result, credits_used=cost)


# --- GET /api/domain-pattern ------------------------------------------------------------


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


@router.get(
    "/api/domain-pattern",
    response_model=DomainPatternResponse,
    summary="A domain's learned email pattern",
    description="The local-part pattern (e.g. `first.last`, `last.f`) that verified finds "
    "at the domain used, with a confidence that grows with the number of finds. The finder "
    "tries this pattern first at the domain. Free of charge (no credits), no SMTP or DNS "
    "traffic; pattern names and counts only, never an address. A domain without finds "
    "answers 200 with `pattern` null and `confidence` 0.",
    responses={
        **AUTH_ERRORS,
        403: error_doc(FINDER_DISABLED),
        422: {
            "model": ValidationErrorBody,
            "description": "`domain` is missing or not a domain name (e.g. an IP address).",
        },
        **COMMON_ERRORS,
    },
)
async def domain_pattern_route(
    account: FinderAccountDep,
    store: StoreDep,
    settings: SettingsDep,
    domain: Annotated[
        str,
        Query(
            min_length=1,
            max_length=DOMAIN_MAX_LENGTH,
            description="Company domain, e.g. `example.com` (a URL or `www.` is trimmed).",
            examples=["example.com"],
        ),
    ],
) -> DomainPatternResponse:
    try:
        ascii_domain = normalise_finder_domain(domain)
    except FinderInputError as exc:
        raise RequestValidationError(
            [{"type": "finder_input", "loc": ("query", "domain"), "msg": exc.detail}]
        ) from exc
    learned = await StoredPatterns(store, account.id, settings).load(ascii_domain)
    return DomainPatternResponse(
        domain=ascii_domain,
        pattern=learned.pattern,
        confidence=learned.confidence,
        finds=learned.finds,
        total_finds=learned.total,
        scope=settings.finder_pattern_scope,
        patterns=[
            LearnedPattern(pattern=p, finds=learned.counts[p], confidence=learned.confidence_of(p))
            for p in learned.ranked
        ],
    )
