"""The published OpenAPI document: FastAPI's, completed with examples and the edge refusals.

FastAPI builds the schema from the routes and models; this module adds what a reader of
``/docs`` needs and the routes cannot say one by one:

- response examples for every status of every operation: results (valid, invalid,
  catch-all, unknown), jobs in each state, and an error body for each refusal;
- the refusals every operation with a body can answer before its route runs (413 body too
  large, 408 body too slow, see :mod:`verimail.api.body_limit`).

The examples themselves are data: the answers in :mod:`verimail.api.openapi_examples` (and
:mod:`verimail.api.openapi_list_examples`), the
refusals in :mod:`verimail.api.openapi_errors`. Examples already declared on a route are
kept. Nothing here changes what the server does.
"""

from __future__ import annotations

import copy
from typing import Any

from fastapi import FastAPI
from fastapi.openapi.utils import get_openapi

from verimail.api.openapi_errors import BODY_REFUSALS, error_example
from verimail.api.openapi_examples import SUCCESS, UNHEALTHY, one_example
from verimail.api.openapi_list_examples import SUCCESS as LIST_SUCCESS

ANSWERS = {**SUCCESS, **LIST_SUCCESS}


def _add_body_refusals(method: str, operation: dict[str, Any]) -> None:
    """413/408: answered by the body limit before any route with a body runs."""
    if "requestBody" not in operation:
        return
    responses = operation["responses"]
    error_ref = {"$ref": "#/components/schemas/ErrorBody"}
    for status, description in BODY_REFUSALS.items():
        if status not in responses:
            responses[status] = {
                "description": description,
                "content": {"application/json": {"schema": error_ref}},
            }
    operation["responses"] = dict(sorted(responses.items()))


def _schema_example(document: dict[str, Any], schema: Any) -> dict[str, Any] | None:
    """The example a response's model declares (``json_schema_extra``), for operations this
    module has no example of its own for."""
    if not isinstance(schema, dict):
        return None
    ref = schema.get("$ref", "")
    if ref.startswith("#/components/schemas/"):
        schema = document.get("components", {}).get("schemas", {}).get(ref.rsplit("/", 1)[1], {})
    if "example" in schema:
        return {"example": schema["example"]}
    if schema.get("examples"):
        return {"example": schema["examples"][0]}
    return None


def complete_document(document: dict[str, Any]) -> dict[str, Any]:
    """``document`` with examples on every response and the edge refusals documented."""
    for path, operations in document.get("paths", {}).items():
        for method, operation in operations.items():
            _add_body_refusals(method, operation)
            for status, response in operation.get("responses", {}).items():
                for media_type, content in response.get("content", {}).items():
                    if "example" in content or "examples" in content:
                        continue
                    if status.startswith("2"):
                        found = ANSWERS.get((method, path), {}).get(media_type)
                        found = found or _schema_example(document, content.get("schema"))
                    elif status == "503" and path == "/api/health":
                        found = one_example("Unhealthy: the database did not answer", UNHEALTHY)
                    else:
                        found = error_example(method, path, status)
                    if found:
                        content.update(copy.deepcopy(found))
    return document


def install_openapi(app: FastAPI) -> None:
    """Serve the completed document at ``app.openapi_url`` (built once, on first request)."""

    def openapi() -> dict[str, Any]:
        if app.openapi_schema is None:
            app.openapi_schema = complete_document(
                get_openapi(
                    title=app.title,
                    version=app.version,
                    description=app.description,
                    routes=app.routes,
                    tags=app.openapi_tags,
                    servers=app.servers,
                )
            )
        return app.openapi_schema

    app.openapi = openapi  # type: ignore[method-assign]
