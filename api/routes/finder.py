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

from typing import Annotated

from anyio import to_thread
from fastapi import APIRouter, Depends, Query, Request
from fastapi.exceptions import RequestValidationError
from pydantic import ValidationInfo, field_validator
from pydantic_core import PydanticCustomError

from verimail.api.billing import charged
from verimail.api.deps import AccountDep, EngineDep, StoreDep
from verimail.api.errors import (
    AUTH_ERRORS,
    COMMON_ERRORS,
    ApiError,
    error_doc,
)
from verimail.config import Settings
from verimail.engine import (
    FinderInputError,
    NameField,
    check_name_part,
    find_email_within,
    normalise_finder_domain,
    urgent,
)
from verimail.jobs.learned_patterns import StoredPatterns
from verimail.schemas.errors import ValidationErrorBody
from verimail.schemas.finder import DomainPatternResponse, FindEmailResponse, LearnedPattern
from verimail.schemas.finder import FindEmailRequest as FindEmailContract
from verimail.schemas.limits import DOMAIN_MAX_LENGTH, DOMAIN_PATTERN
from verimail.store.accounts import Account
from verimail.store.billing import quote, short_balance

router = APIRouter(tags=["email finder"])

FINDER_DISABLED = "The Email Finder is not enabled for this account."


def _input_error(exc: FinderInputError) -> PydanticCustomError:
    return PydanticCustomError("finder_input", "{detail}", {"detail": exc.detail})


class FindEmailRequest(FindEmailContract):
    # The contract's body (schemas/finder.py), with the checks that need the engine's name
    # and domain rules. The same name and description: the OpenAPI document shows this class.
    __doc__ = FindEmailContract.__doc__

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
    cost = quote("find", 1, settings)
    have = await to_thread.run_sync(short_balance, store.engine, account.id, cost)
    if have is not None:
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
            description="Company domain, e.g. `example.com` (a URL or `www.` is trimmed; "
            "IP addresses and single-label names are refused).",
            examples=["example.com"],
            json_schema_extra={"pattern": DOMAIN_PATTERN},
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
