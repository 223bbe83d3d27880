"""Words a person reads instead of the store's names: job kinds, statuses, sub-statuses,
ledger kinds and references (``bulk_csv`` → "CSV upload", ``request:ef9f…`` → "request").

Registered as Jinja filters by :mod:`verimail.api.dashboard.web`; the API keeps its names.
"""

from __future__ import annotations

import re

from markupsafe import Markup, escape

KINDS = {
    "bulk_csv": "CSV upload",
    "bulk_json": "API list",
    "finder_csv": "Email Finder CSV",
    "reverify": "Re-verification",
}

STATUSES = {
    "valid": "Valid",
    "likely_valid": "Likely valid",
    "catchall": "Catch-all",
    "risky": "Risky",
    "unknown": "Unknown",
    "disposable": "Disposable",
    "invalid": "Invalid",
    # jobs
    "pending": "Waiting to start",
    "processing": "Verifying",
    "completed": "Completed",
    "failed": "Failed",
    # finder
    "found": "Found",
    "not_found": "Not found",
    "catch_all": "Catch-all (a guess)",
    "invalid_input": "Invalid input",
}

SUB_STATUSES = {
    "ok": "OK",
    "role_based": "Role address",
    "invalid_syntax": "Not an address",
    "nxdomain": "Domain does not exist",
    "no_mx": "No mail server",
    "null_mx": "Domain takes no mail",
    "mailbox_not_found": "Mailbox not found",
    "mailbox_full": "Mailbox full",
    "disposable": "Throwaway service",
    "possible_typo": "Probable typo",
    "catch_all": "Catch-all domain",
    "greylisted": "Greylisted",
    "blocked": "Server refused us",
    "egress_blocked": "Server refused our IP",
    "temp_failure": "Temporary failure",
    "timeout": "Timed out",
    "connection_failed": "Could not connect",
    "private_address": "Private network",
    "dns_error": "DNS failure",
    "rejected": "Rejected",
    "protocol_error": "Not SMTP",
    "not_checked": "Not checked",
}

LEDGER_KINDS = {
    "signup": "Sign-up credits",
    "grant": "Grant",
    "charge": "Charge",
    "reserve": "Reserved for a job",
    "refund": "Refund",
    "allowance": "Plan allowance",
}

PHASES = {
    "verifying": "Verifying",
    "waiting_to_retry": "Waiting to retry greylisted addresses",
    "retrying": "Retrying greylisted addresses",
}

_JOB_REF = re.compile(r"^job:(\d+)(?::row:(\d+))?$")
_KIND_IN_TEXT = re.compile(r"\b(" + "|".join(map(re.escape, KINDS)) + r")\b")


def _fallback(name: str) -> str:
    return name.replace("_", " ").capitalize()


def kind_label(kind: str | None) -> str:
    return KINDS.get(kind or "", _fallback(kind or ""))


def status_label(status: str | None) -> str:
    return STATUSES.get(status or "", _fallback(status or "")) if status else "—"


def sub_status_label(sub_status: str | None) -> str:
    return SUB_STATUSES.get(sub_status or "", _fallback(sub_status or "")) if sub_status else "—"


def ledger_kind_label(kind: str) -> str:
    return LEDGER_KINDS.get(kind, _fallback(kind))


def phase_label(phase: str | None) -> str:
    return PHASES.get(phase or "", _fallback(phase or ""))


def reason_label(reason: str) -> str:
    """A ledger reason with job kinds in words ("bulk_csv job 7" → "CSV upload job 7")."""
    return _KIND_IN_TEXT.sub(lambda m: KINDS[m.group(1)], reason)


def reference_label(reference: str | None, prefix: str = "/dashboard") -> Markup:
    """A ledger reference a person can follow: a link to its job, the allowance period, or
    "one request" for a single or batch call (its id means nothing to anyone)."""
    if not reference:
        return Markup("")
    if match := _JOB_REF.match(reference):
        job_id, row = match.groups()
        link = Markup('<a href="{}/jobs/{}">Job #{}</a>').format(prefix, job_id, job_id)
        return link + (Markup(", row {}").format(int(row) + 1) if row is not None else "")
    if reference.startswith("request:"):
        return Markup("one request")
    if reference.startswith("period:"):
        return Markup("allowance from {}").format(reference.removeprefix("period:"))
    return escape(reference)
