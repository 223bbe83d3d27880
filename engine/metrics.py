"""Counters the verification engine and the flows keep for operators (Prometheus).

The engine may import this module and nothing else of the metrics: it only counts, in
memory, in this process. The API's ``/metrics`` (``api/metrics.py``) exposes these next to
its own HTTP metrics and the job and credit figures it reads from the database.

prometheus_client is imported here, in the engine's layer, on purpose: its counters are
small thread-safe in-memory objects (no server, no I/O; the library is already installed as
a dependency of Prefect), and a second hand-written counter type would only have to be
translated into them later. They live in their own registry, so that any number of apps in
one process (tests, the demo) can expose them without registering them twice.
"""

from __future__ import annotations

from datetime import UTC, datetime
from typing import TYPE_CHECKING

from prometheus_client import CollectorRegistry, Counter, Histogram

if TYPE_CHECKING:
    from verimail.engine.smtp.findings import Finding

ENGINE_REGISTRY = CollectorRegistry(auto_describe=True)

VERIFICATIONS = Counter(
    "verimail_verifications",
    "Addresses verified (results produced), by status.",
    ["status"],
    registry=ENGINE_REGISTRY,
)
SMTP_SESSIONS_OPENED = Counter(
    "verimail_smtp_sessions_opened",
    "SMTP sessions opened to mail hosts (connected and greeted).",
    registry=ENGINE_REGISTRY,
)
SMTP_SESSIONS_REFUSED = Counter(
    "verimail_smtp_sessions_refused",
    "Attempts to open an SMTP session that gave no session, by reason (blocked, "
    "temp_failure, timeout, connection_failed, protocol_error, ...).",
    ["reason"],
    registry=ENGINE_REGISTRY,
)
EGRESS_BLOCKED = Counter(
    "verimail_egress_blocked",
    "Results unknown/egress_blocked (a mail server refused our sending IP), by egress.",
    ["egress"],
    registry=ENGINE_REGISTRY,
)
DNS_QUERIES = Counter(
    "verimail_dns_queries",
    "DNS queries sent (cache hits are not queries), by record type and outcome.",
    ["type", "outcome"],
    registry=ENGINE_REGISTRY,
)
JOB_QUEUE_WAIT = Histogram(
    "verimail_job_queue_wait_seconds",
    "Seconds from a job's creation to the start of its first run, by kind.",
    ["kind"],
    buckets=(0.5, 1, 2, 5, 10, 30, 60, 120, 300, 600, 1800, 3600),
    registry=ENGINE_REGISTRY,
)


def verified(status: str, sub_status: str, finding: Finding | None) -> None:
    """One result of ``status``; an ``egress_blocked`` one is counted for the egress that
    SMTP ``finding`` came through."""
    VERIFICATIONS.labels(status=status).inc()
    if sub_status == "egress_blocked" and finding is not None:
        EGRESS_BLOCKED.labels(egress=finding.egress).inc()


def observe_queue_wait(kind: str, created_at: datetime) -> None:
    """A job of ``kind`` created at ``created_at`` (aware) starts its first run now."""
    waited = (datetime.now(UTC) - created_at).total_seconds()
    JOB_QUEUE_WAIT.labels(kind=kind).observe(max(waited, 0.0))
