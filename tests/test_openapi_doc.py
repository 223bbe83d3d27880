"""The OpenAPI document and the CLI help are written for users: every operation has a
summary, a description and examples for each of its answers (results of each kind, jobs in
each state, every error), every example matches its schema, and no text leaks developer
notes (source paths, "SPEC §" references)."""

from __future__ import annotations

import re
from collections.abc import Iterator
from typing import Any

import jsonschema
import pytest
import typer

from verimail import cli
from verimail.api.app import create_app
from verimail.api.openapi_doc import complete_document
from verimail.config import Settings

LEAKS = re.compile(
    r"SPEC|§|\b\w+\.py\b|\blive in\b|(?<![#/])\b(?:schemas|tasks|store|flows)/\w+",
)
BINARY = {"application/vnd.apache.parquet", "application/octet-stream"}


@pytest.fixture(scope="module")
def document() -> dict[str, Any]:
    return create_app(Settings()).openapi()


def _operations(document: dict[str, Any]) -> Iterator[tuple[str, str, dict[str, Any]]]:
    for path, operations in document["paths"].items():
        for method, operation in operations.items():
            yield method, path, operation


def _strings(node: Any, where: str = "") -> Iterator[tuple[str, str]]:
    if isinstance(node, str):
        yield where, node
    elif isinstance(node, dict):
        for key, value in node.items():
            yield from _strings(value, f"{where}/{key}")
    elif isinstance(node, list):
        for i, value in enumerate(node):
            yield from _strings(value, f"{where}/{i}")


def _examples(content: dict[str, Any]) -> dict[str, Any]:
    if "example" in content:
        return {"example": content["example"]}
    return {name: ex["value"] for name, ex in content.get("examples", {}).items()}


def test_every_operation_has_a_summary_a_description_and_examples(
    document: dict[str, Any],
) -> None:
    missing = []
    for method, path, operation in _operations(document):
        where = f"{method.upper()} {path}"
        if not operation.get("summary"):
            missing.append(f"{where}: no summary")
        if not operation.get("description"):
            missing.append(f"{where}: no description")
        for status, response in operation["responses"].items():
            if not response.get("description"):
                missing.append(f"{where} {status}: no description")
            for media_type, content in response.get("content", {}).items():
                if media_type not in BINARY and not _examples(content):
                    missing.append(f"{where} {status} {media_type}: no example")
    assert not missing, "\n".join(missing)


def test_results_of_each_kind_and_jobs_in_each_state_are_shown(document: dict[str, Any]) -> None:
    def statuses(method: str, path: str, field: str = "status") -> set[str]:
        content = document["paths"][path][method]["responses"]["200"]["content"]
        return {value[field] for value in _examples(content["application/json"]).values()}

    assert {"valid", "invalid", "catchall", "unknown"} <= statuses("post", "/api/verify/single")
    batch = document["paths"]["/api/verify/batch"]["post"]["responses"]["200"]["content"]
    [batch_example] = _examples(batch["application/json"]).values()
    assert {r["status"] for r in batch_example["results"]} >= {
        "valid",
        "invalid",
        "catchall",
        "unknown",
    }
    states = {"pending", "processing", "completed", "failed"}
    for path in ("/api/bulk/{job_id}", "/api/verify/bulk/{job_id}", "/api/find-email/csv/{job_id}"):
        assert statuses("get", path) == states, path
    assert statuses("post", "/api/find-email") == {"found", "not_found", "catch_all"}


def test_every_json_example_matches_its_schema(document: dict[str, Any]) -> None:
    components = {"components": document["components"]}
    checked = 0
    for method, path, operation in _operations(document):
        for status, response in operation["responses"].items():
            content = response.get("content", {}).get("application/json")
            if not content or "schema" not in content:
                continue
            schema = {**content["schema"], **components}
            for name, value in _examples(content).items():
                try:
                    jsonschema.validate(value, schema, cls=jsonschema.Draft202012Validator)
                except jsonschema.ValidationError as exc:
                    pytest.fail(f"{method.upper()} {path} {status} example {name}: {exc.message}")
                checked += 1
    assert checked > 50


def test_requests_with_a_body_document_the_edge_refusals(document: dict[str, Any]) -> None:
    for method, path, operation in _operations(document):
        if "requestBody" in operation:
            assert {"408", "413"} <= set(operation["responses"]), f"{method} {path}"


def test_examples_declared_on_a_route_are_kept() -> None:
    mine = {"example": {"detail": "mine"}}
    document = {"paths": {"/x": {"get": {"responses": {"404": {"content": {"j": dict(mine)}}}}}}}
    completed = complete_document(document)
    assert completed["paths"]["/x"]["get"]["responses"]["404"]["content"]["j"] == mine


def test_an_operation_without_examples_of_its_own_gets_its_models_example() -> None:
    """(So an operation added later is documented as soon as its model has an example.)"""
    ok = {"content": {"application/json": {"schema": {"$ref": "#/components/schemas/Thing"}}}}
    document = {
        "paths": {"/api/thing": {"get": {"responses": {"200": ok}}}},
        "components": {"schemas": {"Thing": {"type": "object", "example": {"id": 1}}}},
    }
    completed = complete_document(document)
    content = completed["paths"]["/api/thing"]["get"]["responses"]["200"]["content"]
    assert content["application/json"]["example"] == {"id": 1}


def test_the_openapi_document_has_no_developer_notes(document: dict[str, Any]) -> None:
    leaks = [(where, text) for where, text in _strings(document) if LEAKS.search(text)]
    assert not leaks, leaks


def _cli_texts(command: Any, name: str = "verimail") -> Iterator[tuple[str, str]]:
    """Every help text of ``command`` and its subcommands (Typer's own click objects)."""
    for text in (command.help, command.short_help, command.epilog):
        if text:
            yield name, text
    for param in command.params:
        help_text = getattr(param, "help", None)
        if help_text:
            yield f"{name} {param.name}", help_text
    for sub_name, sub in getattr(command, "commands", {}).items():
        yield from _cli_texts(sub, f"{name} {sub_name}")


def test_the_cli_help_has_no_developer_notes() -> None:
    if "serve" not in {command.name for command in cli.app.registered_commands}:
        cli._register()  # (what main() does before running: the lazily attached commands)
    root = typer.main.get_command(cli.app)
    texts = list(_cli_texts(root))
    assert len(texts) > 30  # the walk reached the subcommands and their options
    leaks = [(where, text) for where, text in texts if LEAKS.search(text)]
    assert not leaks, leaks


def test_the_leak_pattern_catches_what_it_is_for() -> None:
    for text in ("see SPEC §2.2", "fields live in schemas/results.py", "tasks/engine does it"):
        assert LEAKS.search(text), text
    for text in ("Verify one address.", "The upload (a .csv file).", "up to 4 MiB"):
        assert not LEAKS.search(text), text


def test_the_bulk_upload_names_every_header_the_reader_knows(document: dict[str, Any]) -> None:
    """The description is made from the reader's own list: a copy of it once named 7 of 11."""
    from verimail.files.csv_columns import EMAIL_HEADERS, header_key

    described = document["paths"]["/api/bulk"]["post"]["description"]
    for name in EMAIL_HEADERS:
        assert f"`{name}`" in described, name
    # What the description promises about spelling is what the reader does.
    assert header_key("Email Address") == "emailaddress"
    assert header_key(" Work-E.mail ") == "workemail"
