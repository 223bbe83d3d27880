"""Every deployment's form in the Prefect UI, in a real browser, as a data team uses it
(docs/prefect-flows.md): **Run → Custom run**, only the required fields filled, "Validate
parameters" left on, **Submit** — and the run, taken by a worker started as the docs say,
ends Completed having done its work.

The set-up is docs/prefect-ui.md's "Outside the demo": a Prefect server with its UI (here
``runners/prefect_ui.py``'s, on a PostgreSQL database of its own where there is one),
``verimail deploy`` and ``verimail worker`` as written, the store on PostgreSQL shared with
the worker. The browser is Debian's chromium (``test_dashboard_browser.py``'s fixture).

Issue 43.1: bulk-verify's and reverify-stored's forms were refused by the UI's validation
("None is not of type 'string'") with their optional fields left empty.
"""

from __future__ import annotations

import contextlib
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from api_helpers import api_world, env_for_testbed
from test_dashboard_browser import chromium  # noqa: F401  (the module-scoped browser)

from verimail.jobs.context import forget, store_for
from verimail.jobs.create import create_finder_job
from verimail.runners.prefect_ui import PrefectUIServer
from verimail.runners.testing import (
    VERIMAIL,
    free_port,
    kill_tree,
    prefect_database,
    warm_worker,
    worker_env,
)
from verimail.schemas.flows import FLOWS
from verimail.store import accounts
from verimail.store import jobs as job_store
from verimail.store.testing import postgres_problem, postgres_test_url, temporary_database_url

pytestmark = [pytest.mark.usefixtures("prefect_harness"), pytest.mark.prefect]

NO_PARAMETERS = "purge-expired-jobs"  # (retention reads its one setting from the worker)

POOL = "verimail"  # (the UI server is this test's own: the documented pool name)
RUN_TIMEOUT = 180.0
FINAL = {"COMPLETED", "FAILED", "CRASHED", "CANCELLED"}
LEADS = "name,work email\nAlice,alice@acme.test\nNobody,nobody@acme.test\n"
PEOPLE = "first_name,last_name,domain\nBob,Builder,acme.test\n"


@contextlib.contextmanager
def _prefect_ui(data: Path) -> Iterator[PrefectUIServer]:
    """A Prefect server with its UI, on a PostgreSQL database of its own when PostgreSQL
    answers (its SQLite default otherwise); stopped at the end."""
    with contextlib.ExitStack() as stack:
        patch = stack.enter_context(pytest.MonkeyPatch.context())
        if not postgres_problem(postgres_test_url()):
            url = stack.enter_context(prefect_database(postgres_test_url()))
            patch.setenv("PREFECT_API_DATABASE_CONNECTION_URL", url)
        server = PrefectUIServer(free_port(), data)
        server.start()
        try:
            yield server
        finally:
            server.stop()


def _submit(
    page: Any, base: str, deployment_id: str, fields: dict[str, str], *, parameters: bool = True
) -> str:
    """Open the deployment's Custom run form, fill ``fields`` (by their titles), leave the
    rest as the form shows it, submit with "Validate parameters" on (a flow without
    ``parameters`` has no such switch); the run's id."""
    page.goto(f"{base}/deployments/deployment/{deployment_id}/run")
    submit = page.get_by_role("button", name="Submit")
    submit.wait_for()
    if parameters:
        assert page.get_by_label("Validate parameters").is_checked()
    for title, value in fields.items():
        field = page.locator(
            f"xpath=//*[starts-with(normalize-space(text()), '{title}')]"
            "/ancestor::*[.//textarea or .//input][1]"
        )
        field.locator("textarea, input").first.fill(value)
    with page.expect_response(lambda r: r.url.endswith("/create_flow_run")) as created:
        submit.click()
    answer = created.value
    assert answer.status == 201, (fields, answer.text(), page.inner_text("body")[-2000:])
    return str(answer.json()["id"])


def _final(api: str, run_id: str, log: Path) -> dict[str, Any]:
    """The flow run once it is in a final state."""
    deadline = time.monotonic() + RUN_TIMEOUT
    with httpx.Client(timeout=10) as client:
        while True:
            run = client.get(f"{api}/flow_runs/{run_id}").json()
            if run["state"]["type"] in FINAL:
                return run
            assert time.monotonic() < deadline, (run["state"], log.read_text()[-3000:])
            time.sleep(0.3)  # (polling Prefect: nothing to await but its answer)


def _logged(api: str, run_id: str, words: str) -> list[str]:
    """The run's log lines, once one holds ``words`` (the worker sends them in batches)."""
    deadline = time.monotonic() + 60
    with httpx.Client(timeout=10) as client:
        while True:
            body = {"logs": {"flow_run_id": {"any_": [run_id]}}}
            lines = [r["message"] for r in client.post(f"{api}/logs/filter", json=body).json()]
            if any(words in line for line in lines) or time.monotonic() > deadline:
                return lines
            time.sleep(0.3)  # (polling Prefect: nothing to await but its answer)


def test_every_form_submits_with_its_required_fields_and_its_run_works(
    chromium: Any,  # noqa: F811
    testbed_factory,
    testbed_settings,
    tmp_path: Path,
) -> None:
    tb = testbed_factory(api_world())
    with temporary_database_url("postgres", tmp_path) as url:
        settings = testbed_settings(tb, tmp_path, database_url=url)
        store = store_for(settings)
        account = accounts.create_account(
            store.engine, settings, plan="enterprise", email="data-team@example.com"
        )
        inbox = Path(settings.data_dir) / "inbox"
        inbox.mkdir(parents=True, exist_ok=True)
        (inbox / "leads.csv").write_text(LEADS)
        (inbox / "people.csv").write_text(PEOPLE)
        finder = create_finder_job(
            store, settings, account.id, 1, upload=inbox / "people.csv", options={}
        )
        with _prefect_ui(tmp_path / "prefect") as server:
            env = worker_env(
                env_for_testbed(tb),
                database_url=url,
                data_dir=Path(settings.data_dir),
                PREFECT_API_URL=server.api_url,
            )
            env.pop("VERIMAIL_PREFECT_WORK_POOL", None)
            env.pop("PREFECT_LOGGING_LEVEL", None)  # (as documented: the runs' INFO lines sent)
            deployed = subprocess.run(
                [VERIMAIL, "deploy"], env=env, capture_output=True, text=True, timeout=300
            )
            assert deployed.returncode == 0, deployed.stderr
            log = tmp_path / "worker.log"
            with warm_worker(None, env, log, limit=None, poll=None) as worker:
                try:
                    runs = _every_form(chromium, server, account.id, finder.id, log)
                finally:
                    kill_tree(worker.pid)
            bulk = [
                j for j in job_store.list_jobs(store.engine, account.id) if j.kind != "finder_csv"
            ]
            finder_done = job_store.get_job_any(store.engine, finder.id)
        forget(settings)
    assert [j.status for j in bulk] == ["completed"], bulk
    assert (bulk[0].valid_count, bulk[0].invalid_count) == (1, 1)
    assert runs["bulk-verify"]["name"] == f"bulk job {bulk[0].id} · leads.csv"
    assert finder_done is not None and finder_done.status == "completed", finder_done
    assert finder_done.processed_emails == 1
    assert runs["reverify-stored"]["name"] == "reverify addresses older than 30 days"


def _every_form(
    chromium: Any,  # noqa: F811
    server: PrefectUIServer,
    account_id: int,
    finder_job: int,
    log: Path,
) -> dict[str, dict[str, Any]]:
    """Each deployment's form submitted with only its required fields; each run, Completed."""
    api = server.api_url
    deployments = {
        d["name"]: d["id"] for d in httpx.post(f"{api}/deployments/filter", json={}).json()
    }
    assert set(deployments) == {entry.name for entry in FLOWS}
    context = chromium.new_context(viewport={"width": 1280, "height": 1200})
    context.set_default_timeout(30_000)
    page = context.new_page()
    runs: dict[str, dict[str, Any]] = {}
    try:
        bulk = _submit(
            page,
            server.url,
            deployments["bulk-verify"],
            {"Account": str(account_id), "CSV file": "inbox/leads.csv"},
        )
        runs["bulk-verify"] = _final(api, bulk, log)
        job_id = runs["bulk-verify"]["name"].split()[2]
        forms = {
            "find-emails": {"job_id": str(finder_job)},
            # (by hand, for a job that was never sharded: it has nothing to do, and says so)
            "verify-shard": {"job_id": job_id, "shard": "0", "attempt": "1"},
            "reverify-stored": {},
            "purge-expired-jobs": {},
        }
        for name, fields in forms.items():
            submitted = _submit(
                page, server.url, deployments[name], fields, parameters=name != NO_PARAMETERS
            )
            runs[name] = _final(api, submitted, log)
        # (the finder job again, now ended: nothing to do, and it says so)
        again = _submit(page, server.url, deployments["find-emails"], forms["find-emails"])
        runs["find-emails again"] = _final(api, again, log)
    finally:
        context.close()
    for name, run in runs.items():
        assert run["state"]["type"] == "COMPLETED", (name, run["state"], log.read_text()[-3000:])
    for name, why in (
        ("verify-shard", f"job {job_id} shard 0: nothing to do"),
        ("find-emails again", f"finder job {finder_job}: nothing to do: it has ended"),
    ):
        said = _logged(api, runs[name]["id"], why)
        assert any(why in line for line in said), (name, said)
    return runs
