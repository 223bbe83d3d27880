"""The published contract: endpoints, the Bearer scheme, documented errors, described fields."""

from __future__ import annotations

from pathlib import Path

from api_helpers import api_world, running_app

ERROR_REF = "#/components/schemas/ErrorBody"


def _schema_ref(response: dict) -> str:
    return response["content"]["application/json"]["schema"]["$ref"]


async def test_openapi_lists_endpoints_security_and_errors(
    testbed_factory, testbed_settings, tmp_path: Path
) -> None:
    tb = testbed_factory(api_world())
    async with running_app(testbed_settings(tb, tmp_path)) as api:
        response = await api.client.get("/openapi.json")
        assert response.status_code == 200
        spec = response.json()
        docs = await api.client.get("/docs")
        assert docs.status_code == 200 and "swagger" in docs.text.lower()

    assert spec["openapi"].startswith("3.")
    assert spec["info"]["title"] == "verimail" and spec["info"]["version"] == "1.0.0"
    paths = spec["paths"]
    assert set(paths) >= {"/api/health", "/api/verify/single", "/api/verify/batch"}

    schemes = spec["components"]["securitySchemes"]
    assert schemes["HTTPBearer"] == {**schemes["HTTPBearer"], "type": "http", "scheme": "bearer"}

    health = paths["/api/health"]["get"]
    assert "security" not in health
    assert _schema_ref(health["responses"]["200"]).endswith("/HealthResult")
    assert _schema_ref(health["responses"]["503"]).endswith("/HealthResult")

    for path in ("/api/verify/single", "/api/verify/batch"):
        operation = paths[path]["post"]
        assert operation["security"] == [{"HTTPBearer": []}]
        responses = operation["responses"]
        for status in ("401", "402", "429", "500", "503"):
            assert _schema_ref(responses[status]) == ERROR_REF, (path, status)
            assert responses[status]["description"]
        assert _schema_ref(responses["422"]).endswith("/ValidationErrorBody")
        assert "Retry-After" in responses["429"]["headers"]
        assert "WWW-Authenticate" in responses["401"]["headers"]
    assert _schema_ref(paths["/api/verify/single"]["post"]["responses"]["200"]).endswith(
        "/VerifyResult"
    )
    assert _schema_ref(paths["/api/verify/batch"]["post"]["responses"]["200"]).endswith(
        "/BatchResponse"
    )

    schemas = spec["components"]["schemas"]
    assert schemas["ErrorBody"]["required"] == ["detail"]
    undescribed = [
        f"{name}.{field}"
        for name, schema in schemas.items()
        for field, prop in schema.get("properties", {}).items()
        if not prop.get("description")
    ]
    assert not undescribed, undescribed
    spec_fields = {
        "email", "safe_to_send", "status", "confidence_score", "reason", "domain",
        "is_disposable", "is_role_based", "is_free", "is_catch_all", "mx_records",
        "smtp_response", "verification_time_ms", "api_version",
    }  # fmt: skip
    assert spec_fields <= set(schemas["VerifyResult"]["properties"])
    assert set(schemas["HealthResult"]["required"]) == {
        "status", "version", "uptime_seconds", "database_connected", "verifier_ready",
        "verification_provider", "timestamp",
    }  # fmt: skip
