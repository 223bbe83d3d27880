"""A data team starts ``bulk-verify`` from the Prefect UI: the deployment's form, a flow run
created from it with the form's parameters (what the UI's "Run" button does), the job it
makes, the run's name and the summary artifact; and a wrong input ending the run with one
sentence instead of a traceback.

The created flow run is executed in this process by Prefect's flow engine, as a worker's
flow-run process would execute it (the worker itself is covered by test_deployment_mode).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from verimail.config import using_settings
from verimail.flows.bulk import bulk_verify
from verimail.flows.summary import artifact_key, installation_id
from verimail.jobs.context import forget, store_for
from verimail.store import accounts
from verimail.store import jobs as job_store
from verimail.store.billing.pools import balance
from verimail.testbed.world import DomainSpec, HostBehaviour, HostSpec, World

pytestmark = [pytest.mark.usefixtures("prefect_harness"), pytest.mark.prefect]

LEADS = "name,work email\nAlice,alice@acme.test\nNobody,nobody@acme.test\nAny,x@catchall.test\n"


def _world(mailboxes: frozenset[str] = frozenset({"alice"})) -> World:
    return World.of(
        [
            HostSpec("mx.acme.test", HostBehaviour(mailboxes=set(mailboxes))),
            HostSpec("mx.catchall.test", HostBehaviour(accept_all=True)),
        ],
        [
            DomainSpec("acme.test", mx=[(10, "mx.acme.test")]),
            DomainSpec("catchall.test", mx=[(10, "mx.catchall.test")]),
        ],
    )


@pytest.fixture
def tb(testbed_factory):
    return testbed_factory(_world())


@pytest.fixture
def setup(tb, testbed_settings, tmp_path):
    settings = testbed_settings(tb, tmp_path, public_url="https://verify.example.com")
    store = store_for(settings)
    account = accounts.create_account(
        store.engine, settings, plan="enterprise", email="data-team@example.com"
    )
    inbox = Path(settings.data_dir) / "inbox"
    inbox.mkdir(parents=True)
    (inbox / "leads.csv").write_text(LEADS)
    yield settings, store, account
    forget(settings)


async def _deployment_id() -> Any:
    """bulk-verify registered as ``verimail deploy`` registers it."""
    from prefect.client.orchestration import get_client
    from prefect.deployments.runner import EntrypointType

    deployment = await bulk_verify.ato_deployment(
        name="bulk-verify-form-test", entrypoint_type=EntrypointType.MODULE_PATH
    )
    deployment_id = await deployment.apply()
    async with get_client() as client:
        stored = await client.read_deployment(deployment_id)
    return stored


async def _run_from_form(settings, parameters: dict[str, Any]) -> tuple[Any, Any]:
    """Create a flow run of the deployment with the form's parameters, run it, read it back."""
    from prefect.client.orchestration import get_client
    from prefect.flow_engine import run_flow_async

    deployment = await _deployment_id()
    async with get_client() as client:
        created = await client.create_flow_run_from_deployment(deployment.id, parameters=parameters)
        with using_settings(settings):
            await run_flow_async(
                bulk_verify, flow_run=created, parameters=created.parameters, return_type="state"
            )
        return deployment, await client.read_flow_run(created.id)


def test_the_form_shows_only_described_inputs(setup):
    import asyncio

    deployment = asyncio.run(_deployment_id())
    schema = deployment.parameter_openapi_schema
    assert set(schema["properties"]) == {"verify"}  # job_id, attempt, ... are hidden
    form = schema["definitions"]["BulkVerifyForm"]
    assert form["required"] == ["account", "file"]
    for field in ("account", "file", "email_column", "webhook_url", "retry_unknowns"):
        assert form["properties"][field]["description"], field
    assert form["properties"]["retry_unknowns"]["default"] is True


def _null_types(node: Any, where: str = "") -> list[str]:
    """Where a JSON schema allows null (the UI draws "Property is type None" for it)."""
    found = []
    if isinstance(node, dict):
        if node.get("type") == "null":
            found.append(where)
        for key, value in node.items():
            found += _null_types(value, f"{where}/{key}")
    elif isinstance(node, list):
        for i, value in enumerate(node):
            found += _null_types(value, f"{where}/{i}")
    return found


def test_every_deployments_form_is_described_field_by_field_and_has_no_null_types():
    """Issue 36.2: the find-emails form was one undescribed ``job_id``, and reverify-stored
    showed "Property is type None" toggles. The schemas are the deployments' (what
    ``register_deployments`` applies: ``Flow.parameters``)."""
    from verimail.flows.finder import find_emails
    from verimail.flows.reverify import reverify_stored
    from verimail.flows.shard import verify_shard

    for flow in (bulk_verify, find_emails, verify_shard, reverify_stored):
        schema = flow.parameters.model_dump_for_openapi()
        assert schema["properties"], flow.name
        for name, field in schema["properties"].items():
            assert field.get("description"), (flow.name, name)
        for name, model in schema.get("definitions", {}).items():
            for field_name, field in model["properties"].items():
                assert field.get("description"), (flow.name, name, field_name)
        assert _null_types(schema) == [], (flow.name, _null_types(schema))


def test_the_form_can_opt_a_job_out_of_deferred_retries(setup):
    """ "Retry unknowns" off: the job is made as the API makes one with retry_unknowns=false."""
    from verimail.jobs.forms import create_job_for_form
    from verimail.jobs.retries import enabled
    from verimail.schemas.forms import BulkVerifyForm

    settings, store, account = setup
    ids = [
        create_job_for_form(
            store,
            settings,
            BulkVerifyForm(account=str(account.id), file="inbox/leads.csv", retry_unknowns=wanted),
        )
        for wanted in (False, True)
    ]
    jobs = [job_store.get_job_any(store.engine, job_id) for job_id in ids]
    assert [enabled(settings, job) for job in jobs] == [False, True]


async def test_a_run_started_from_the_form_makes_a_job_and_a_summary(setup):
    from prefect.artifacts import Artifact

    settings, store, account = setup
    before = balance(store.engine, account.id).total
    form = {"account": "data-team@example.com", "file": "inbox/leads.csv"}
    _, run = await _run_from_form(settings, {"verify": form})

    assert run.state.is_completed(), run.state
    (job,) = job_store.list_jobs(store.engine, account.id)
    assert (job.status, job.valid_count, job.invalid_count) == ("completed", 1, 1)
    assert job.flow_run_id == str(run.id)
    assert balance(store.engine, account.id).total == before - 3
    assert run.name == f"bulk job {job.id} · leads.csv"

    key = artifact_key(settings, f"bulk-job-{job.id}")
    assert installation_id(settings) in key
    artifact = await Artifact.aget(key)
    assert artifact is not None and artifact.type == "table"
    assert str(artifact.flow_run_id) == str(run.id)
    table = {row["item"]: row["value"] for row in json.loads(artifact.data)}
    assert table["status"] == "completed"
    assert (table["valid"], table["invalid"], table["unknown"]) == ("1", "1", "0")
    assert table["unknown rate"] == "0.0%"
    assert table["credits reserved"] == "3"
    assert int(table["credits used"]) + int(table["credits refunded"]) == 3
    assert table["duration"].endswith(" s")
    assert table["results path"] == job.result_path
    assert table["API download URL"] == (f"https://verify.example.com/api/bulk/{job.id}/download")


@pytest.mark.parametrize(
    ("form", "expected"),
    [
        ({"account": "data-team@example.com", "file": "inbox/missing.csv"}, "There is no file"),
        ({"account": "data-team@example.com", "file": "../../etc/passwd"}, "outside the data"),
        ({"account": "nobody@example.com", "file": "inbox/leads.csv"}, "There is no account"),
    ],
)
async def test_a_wrong_input_fails_the_run_with_one_sentence(setup, form, expected):
    settings, store, account = setup
    before = balance(store.engine, account.id).total
    _, run = await _run_from_form(settings, {"verify": form})

    assert run.state.is_failed(), run.state
    message = run.state.message
    assert expected in message, message
    assert "Traceback" not in message and "\n" not in message
    assert message.endswith(".") and message.count(". ") == 0, message  # one sentence
    assert job_store.list_jobs(store.engine, account.id) == []  # nothing made or charged
    assert balance(store.engine, account.id).total == before


async def test_reverify_names_its_run_and_leaves_a_table_of_transitions(setup, tb):
    """reverify-stored started as the UI does (its described parameters): the run says what
    it re-verifies and its artifact counts the status changes."""
    from prefect.artifacts import Artifact
    from prefect.client.orchestration import get_client
    from prefect.flow_engine import run_flow_async

    from verimail.flows.reverify import reverify_stored

    settings, store, account = setup
    _, first = await _run_from_form(
        settings, {"verify": {"account": str(account.id), "file": "inbox/leads.csv"}}
    )
    assert first.state.is_completed(), first.state
    (job,) = job_store.list_jobs(store.engine, account.id)
    tb.replace_world(_world(frozenset({"nobody"})))  # Alice left, Nobody joined

    deployment = await reverify_stored.ato_deployment(name="reverify-form-test")
    deployment_id = await deployment.apply()
    async with get_client() as client:
        schema = (await client.read_deployment(deployment_id)).parameter_openapi_schema
        assert set(schema["properties"]) == {"reverify"}
        form = schema["definitions"]["ReverifyForm"]["properties"]
        assert set(form) == {"job_id", "file_path", "older_than_days", "retry_unknowns"}
        assert all(field.get("description") for field in form.values())
        created = await client.create_flow_run_from_deployment(
            deployment_id, parameters={"job_id": job.id}
        )
        with using_settings(settings):
            await run_flow_async(reverify_stored, flow_run=created, parameters=created.parameters)
        run = await client.read_flow_run(created.id)
    assert run.state.is_completed(), run.state
    assert run.name == f"reverify job {job.id}"
    artifact = await Artifact.aget(artifact_key(settings, f"reverify-job-{job.id}"))
    assert artifact is not None and str(artifact.flow_run_id) == str(run.id)
    rows = {(r["from"], r["to"]): r["addresses"] for r in json.loads(artifact.data)}
    assert rows == {("valid", "invalid"): 1, ("invalid", "valid"): 1}


def test_every_form_validates_with_its_optional_fields_left_empty():
    """Issue 43.1: what the Prefect UI sends for a form left as it shows it (each field's
    default, the empty ones left out — or null), checked by Prefect's own validation (the
    UI's "Validate parameters" and the server's), is valid; an optional field has no
    ``default`` in the schema (the UI sent ``default: null`` and its validation refused it:
    "None is not of type 'string'")."""
    from prefect.utilities.schema_tools.validation import validate

    from verimail.flows.reverify import reverify_stored

    filled = {
        "bulk-verify": {"verify": {"account": "12", "file": "inbox/leads.csv"}},
        "reverify-stored": {"reverify": {}},
    }
    for flow in (bulk_verify, reverify_stored):
        schema = flow.parameters.model_dump_for_openapi()
        (name,) = schema["properties"]
        (model,) = schema["definitions"].values()
        required = set(model.get("required", []))
        for field, spec in model["properties"].items():
            if field not in required:
                assert spec.get("default", ...) is not None, (flow.name, field, spec)
        shown = {k: v["default"] for k, v in model["properties"].items() if "default" in v}
        values = {name: {**shown, **filled[flow.name][name]}}
        assert validate(values, schema) == [], (flow.name, values)
        nulls = {
            name: {
                **values[name],
                **{
                    f: None
                    for f in model["properties"]
                    if f not in required and "default" not in model["properties"][f]
                },
            }
        }
        assert validate(nulls, schema) == [], (flow.name, nulls)
