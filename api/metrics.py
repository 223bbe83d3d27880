"""``GET /metrics``: Prometheus metrics for operators. Off unless ``VERIMAIL_METRICS_TOKEN``
is set; then it answers only requests bearing that token (``Authorization: Bearer …``).

Off by default because the figures (jobs, credits, request paths) describe the business and
its customers' activity, and the API is often reachable from the internet; a token rather
than a separate port keeps one thing to run, and Prometheus sends one with
``authorization: {credentials: …}``.

What is exposed (see docs/metrics.md):
- HTTP requests: counts and latency by route template, method and status
  (prometheus-fastapi-instrumentator);
- the engine's and flows' counters of this process (``verimail.engine.metrics``):
  verifications by status, SMTP sessions opened and refused by reason, DNS queries, job
  queue wait;
- jobs by kind and state, credits charged and refunded: read from the database at each
  scrape, so they are the installation's figures whichever process answers;
- whether port 25 answers through each egress, as the background checks last found.
"""

from __future__ import annotations

import logging
import secrets
from collections.abc import Iterator

from anyio import to_thread
from fastapi import FastAPI, Request, Response
from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector
from prometheus_fastapi_instrumentator import Instrumentator

from verimail.api.errors import ApiError
from verimail.config import Settings
from verimail.engine import ENGINE_REGISTRY
from verimail.store.billing import credit_totals
from verimail.store.stats import jobs_by_state
from verimail.store.tables import JOB_KINDS, JOB_STATUSES

log = logging.getLogger(__name__)

METRICS_PATH = "/metrics"


class _EngineMetrics(Collector):
    """The process-wide engine registry, passed through into an app's registry."""

    def collect(self) -> Iterator[Metric]:
        yield from ENGINE_REGISTRY.collect()


class _StoreMetrics(Collector):
    """Jobs by state and credit totals, read from the app's database at each scrape."""

    def __init__(self, app: FastAPI) -> None:
        self.app = app

    def collect(self) -> Iterator[Metric]:
        store = getattr(self.app.state, "store", None)
        if store is None:  # (registration asks before the app has started)
            return
        try:
            counts = jobs_by_state(store.engine)
            credits = credit_totals(store.engine)
        except Exception as exc:  # database down: the other metrics still answer
            log.warning("metrics: the database could not be read: %s", exc)
            return
        jobs = GaugeMetricFamily(
            "verimail_jobs", "Jobs by kind and state (all accounts).", labels=["kind", "status"]
        )
        for kind in JOB_KINDS:
            for status in JOB_STATUSES:
                jobs.add_metric([kind, status], counts.get((kind, status), 0))
        yield jobs
        yield CounterMetricFamily(
            "verimail_credits_charged",
            "Credits taken from accounts: charges and job reservations (all accounts).",
            value=credits["charged"],
        )
        yield CounterMetricFamily(
            "verimail_credits_refunded",
            "Credits given back to accounts (unused reservations, failed jobs).",
            value=credits["refunded"],
        )


class _EgressMetrics(Collector):
    """The background SMTP egress checks' last round (``verimail doctor``'s facts): 1 when
    port 25 of the probe domain's mail server greeted us through the egress, 0 when not."""

    def __init__(self, app: FastAPI) -> None:
        self.app = app

    def collect(self) -> Iterator[Metric]:
        monitor = getattr(self.app.state, "egress_monitor", None)
        if monitor is None or monitor.checked_at is None:
            return
        gauge = GaugeMetricFamily(
            "verimail_smtp_egress_ok",
            "1 when port 25 of VERIMAIL_DOCTOR_DOMAIN's mail server greeted us through the "
            "egress at the last background check, 0 when not.",
            labels=["egress"],
        )
        for check in monitor.checks:
            gauge.add_metric([check.egress or ""], 1.0 if check.ok else 0.0)
        yield gauge


def install_metrics(app: FastAPI, settings: Settings) -> None:
    """Instrument ``app`` and serve ``/metrics``, when a metrics token is configured."""
    if settings.metrics_token is None:
        return
    token = settings.metrics_token.get_secret_value().encode()
    registry = CollectorRegistry(auto_describe=True)
    Instrumentator(
        should_group_status_codes=False,
        excluded_handlers=[METRICS_PATH],
        registry=registry,
    ).instrument(app)
    registry.register(_EngineMetrics())
    registry.register(_StoreMetrics(app))
    registry.register(_EgressMetrics(app))

    @app.get(METRICS_PATH, include_in_schema=False)
    async def metrics(request: Request) -> Response:
        scheme, _, given = request.headers.get("authorization", "").partition(" ")
        if scheme.lower() != "bearer" or not secrets.compare_digest(given.encode(), token):
            raise ApiError(
                401,
                "The metrics need the metrics token: send Authorization: Bearer <token>.",
                {"WWW-Authenticate": "Bearer"},
            )
        body = await to_thread.run_sync(generate_latest, registry)
        return Response(body, media_type=CONTENT_TYPE_LATEST)
