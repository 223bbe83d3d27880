"""The OpenAPI document states every bound the routes enforce (issue 35): the walk goes over
every input of every operation in ``/openapi.json`` — query parameters, JSON bodies, the
upload forms' text fields — and checks that each is bounded in the document, and that the
app refuses a value one past that bound with a 422 naming the field. A bound a route
enforced that the document did not state (the upload forms' field length, the finder's
domain needing a dot, a webhook URL's length) fails the first test; a bound the document
states that the route does not hold fails the second.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from api_helpers import api_world, assert_error_body, running_app

from verimail.api.app import create_app
from verimail.config import Settings

DOCUMENT = create_app(Settings()).openapi()
BOUNDS = ("maxLength", "maximum", "maxItems", "enum", "const")
UNBOUNDED = {
    # (where, name): why no bound is stated
    ("path", "job_id"): "an id: one that does not exist (however large) is 404",
    ("body", "file"): "the upload itself: bounded by the upload limit (413), not the schema",
    ("body", "first_run_at"): "a date-time (format), checked to be to come and within a year",
    ("query", "created_from"): "a date-time (format); a window of the jobs list",
    ("query", "created_to"): "a date-time (format); a window of the jobs list",
    ("query", "from"): "a date (format); the usage range is checked (at most 366 days)",
    ("query", "to"): "a date (format), likewise",
}
BASE_JSON = {
    ("post", "/api/verify/single"): {"email": "alice@acme.test"},
    ("post", "/api/verify/batch"): {"emails": ["alice@acme.test"]},
    ("post", "/api/find-email"): {
        "first_name": "John",
        "last_name": "Smith",
        "domain": "acme.test",
    },
    ("post", "/api/verify/bulk"): {"emails": ["alice@acme.test"]},
    ("post", "/api/bulk/{job_id}/reverify"): {},
    ("put", "/api/bulk/{job_id}/reverify-schedule"): {"every_days": 7},
}
BASE_QUERY = {
    ("get", "/api/domain-pattern"): {"domain": "acme.test"},
    ("get", "/api/bulk"): {},
    ("get", "/api/find-email/csv"): {},
    ("get", "/api/account/ledger"): {},
}


def _schema(node: dict[str, Any]) -> dict[str, Any]:
    while "$ref" in node:
        node = DOCUMENT["components"]["schemas"][node["$ref"].rsplit("/", 1)[1]]
    return node


def _alternatives(node: dict[str, Any]) -> list[dict[str, Any]]:
    """The non-null alternatives of ``node`` (``X | None`` is an anyOf)."""
    node = _schema(node)
    options = node.get("anyOf") or node.get("oneOf") or [node]
    return [_schema(o) for o in options if o.get("type") != "null"]


def _inputs() -> Iterator[tuple[str, str, str, str, str, dict[str, Any]]]:
    """(method, path, where, name, content type, schema) of every input of every operation."""
    for path, operations in DOCUMENT["paths"].items():
        for method, operation in operations.items():
            for parameter in operation.get("parameters", []):
                if parameter["in"] != "header":
                    yield method, path, parameter["in"], parameter["name"], "", parameter["schema"]
            for kind, content in (operation.get("requestBody") or {}).get("content", {}).items():
                for option in _alternatives(content["schema"]):
                    for name, field in option.get("properties", {}).items():
                        yield method, path, "body", name, kind, field


def _bounded(node: dict[str, Any]) -> bool:
    for option in _alternatives(node):
        if option.get("type") in ("object", "boolean"):
            continue
        if not any(key in option for key in BOUNDS) and option.get("format") != "binary":
            return False
        if option.get("type") == "array" and not _bounded(option["items"]):
            return False
    return True


def test_every_input_of_every_operation_is_bounded_in_the_document() -> None:
    unbounded = [
        (method, path, where, name)
        for method, path, where, name, _kind, schema in _inputs()
        if (where, name) not in UNBOUNDED and not _bounded(schema)
    ]
    assert unbounded == []


def test_every_operation_with_bounded_inputs_is_walked() -> None:
    """A new operation with a JSON body or bounded query needs its valid base request here."""
    for method, path, where, _name, kind, schema in _inputs():
        if kind == "application/json":
            assert (method, path) in BASE_JSON, (method, path)
        elif where == "query" and any("maxLength" in o for o in _alternatives(schema)):
            assert (method, path) in BASE_QUERY, (method, path)


def _past_the_bound(schema: dict[str, Any], valid: Any) -> Any | None:
    """A value one past the document's bound of ``schema`` (None: no such bound)."""
    for option in _alternatives(schema):
        if "maxLength" in option:
            return "a" * (option["maxLength"] + 1)
        if "maximum" in option:
            return option["maximum"] + 1
        if "maxItems" in option:
            return list(valid) * (option["maxItems"] + 1)
    return None


def _walk() -> Iterator[tuple[str, str, str, str, Any]]:
    for method, path, where, name, kind, schema in _inputs():
        if kind == "application/json":
            base = BASE_JSON[(method, path)]
        elif where == "query":
            base = BASE_QUERY.get((method, path), {})
        elif kind == "multipart/form-data" and name != "file":
            base = {}
        else:
            continue
        value = _past_the_bound(schema, base.get(name, ["alice@acme.test"]))
        if value is not None:
            yield method, path, kind or where, name, {**base, name: value}


@pytest.fixture(scope="module")
def settings(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Settings]:
    from conftest import make_testbed_settings

    from verimail.testbed.server import Testbed

    tb = Testbed(api_world()).start()
    try:
        yield make_testbed_settings(tb, tmp_path_factory.mktemp("bounds"))
    finally:
        tb.stop()


@pytest.mark.parametrize(
    ("method", "path", "kind", "name", "request_data"),
    list(_walk()),
    ids=lambda v: v if isinstance(v, str) else "",
)
async def test_one_past_the_documented_bound_is_refused(
    settings: Settings, method: str, path: str, kind: str, name: str, request_data: Any
) -> None:
    async with running_app(settings) as app:
        customer = app.customer(credits=5)
        url = path.replace("{job_id}", "1")
        if kind == "application/json":
            response = await app.client.request(
                method, url, headers=customer.headers, json=request_data
            )
        elif kind == "query":
            response = await app.client.request(
                method, url, headers=customer.headers, params=request_data
            )
        else:
            response = await app.client.request(
                method,
                url,
                headers=customer.headers,
                files={"file": ("list.csv", b"email\nalice@acme.test\n", "text/csv")},
                data=request_data,
            )
        assert name in assert_error_body(response, 422)


@pytest.mark.parametrize("query", [{"domain": "localhost"}, {"domain": "acme."}])
async def test_a_domain_against_the_documented_pattern_is_refused(
    settings: Settings, query: dict[str, str]
) -> None:
    async with running_app(settings) as app:
        customer = app.customer(credits=5)
        pattern = await app.client.get(
            "/api/domain-pattern", headers=customer.headers, params=query
        )
        find = await app.client.post(
            "/api/find-email",
            headers=customer.headers,
            json={"first_name": "John", "last_name": "Smith", **query},
        )
        for response in (pattern, find):
            assert "domain" in assert_error_body(response, 422)
