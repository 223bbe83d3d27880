"""``GET /api/health``: every SPEC §2.8 field, no authentication, 503 when the database is down."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from pathlib import Path

from api_helpers import api_world, assert_error_body, free_port, running_app

from verimail.config import Settings

FIELDS = {
    "status": str,
    "version": str,
    "uptime_seconds": float,
    "database_connected": bool,
    "verifier_ready": bool,
    "verification_provider": str,
    "timestamp": str,
    "smtp_egress": (dict, type(None)),  # (the background egress checks; off in the suite)
}


def _check_shape(body: dict) -> None:
    assert set(body) == set(FIELDS)
    for field, kind in FIELDS.items():
        assert isinstance(body[field], kind), (field, body[field])
    assert body["version"] == "1.0.0"
    assert body["verification_provider"] == "verimail"
    assert body["uptime_seconds"] >= 0
    stamp = datetime.fromisoformat(body["timestamp"].replace("Z", "+00:00"))
    assert stamp.utcoffset() == timedelta(0)
    assert abs(datetime.now(UTC) - stamp) < timedelta(seconds=30)


async def test_healthy_without_authentication(
    testbed_factory, testbed_settings, tmp_path: Path
) -> None:
    tb = testbed_factory(api_world())
    async with running_app(testbed_settings(tb, tmp_path)) as api:
        first = await api.client.get("/api/health")
        assert first.status_code == 200, first.text
        body = first.json()
        _check_shape(body)
        assert body["status"] == "healthy"
        assert body["database_connected"] is True and body["verifier_ready"] is True
        # A key is not needed, and a wrong one does not matter either.
        second = await api.client.get("/api/health", headers={"Authorization": "Bearer nope"})
        assert second.status_code == 200
        assert second.json()["uptime_seconds"] >= body["uptime_seconds"]
        # Health checks do no DNS traffic.
        assert not tb.dns_queries


async def test_unreachable_database_is_503_unhealthy(tmp_path: Path) -> None:
    """PostgreSQL URL on a loopback port nobody listens on: the app still starts."""
    url = f"postgresql+psycopg://postgres@127.0.0.1:{free_port()}/verimail"
    settings = Settings(data_dir=tmp_path, database_url=url, dns_nameservers=["127.0.0.1:53"])
    async with running_app(settings) as api:
        response = await api.client.get("/api/health")
        assert response.status_code == 503
        body = response.json()
        _check_shape(body)
        assert body["status"] == "unhealthy"
        assert body["database_connected"] is False
        assert body["verifier_ready"] is True

        # Endpoints that need the database say so plainly, without charging anything.
        verify = await api.client.post(
            "/api/verify/single",
            json={"email": "alice@acme.test"},
            headers={"Authorization": "Bearer vm_" + "k" * 43},
        )
        assert "database is unavailable" in assert_error_body(verify, 503)
        assert int(verify.headers["retry-after"]) >= 1
