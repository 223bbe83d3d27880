"""The run planner (issue 42): one place makes every Prefect flow run, one table registers
every flow, and a job's runs are named for what they do and made once.

- Every call that makes a flow run (``run_deployment``, ``create_flow_run``,
  ``create_flow_run_from_deployment``, ``run_flow``, or a flow object called) stands in
  ``flows/planner.py`` and nowhere else in the package.
- Every ``@flow`` of ``flows/`` is in the registry (``schemas/flows.py``), and
  ``prefect.yaml`` holds exactly the registry's deployments.
- A sharded job with a deferred retry pass, run by a warm worker from the pool: its runs in
  Prefect are "bulk job N · <file>", one "· shard k of K" per shard, one "· merge", one
  "· retry pass 1 of P" — no name twice — and the job's summary artifact is on the first.
- The same request handed to the pool twice is one run; the local runner runs a key once.
"""

from __future__ import annotations

import ast
import asyncio
import os
import time
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
import yaml
from api_helpers import PATIENCE, env_for_testbed, poll_job, running_app

from verimail.flows import planner
from verimail.runners.testing import warm_worker, worker_env
from verimail.schemas.flows import BY_KEY, FLOWS
from verimail.store import jobs as job_store
from verimail.store.testing import temporary_database_url
from verimail.testbed.world import DomainSpec, HostBehaviour, HostSpec, World

ROOT = Path(__file__).resolve().parent.parent
RUN_MAKERS = {
    "run_deployment",
    "arun_deployment",
    "create_flow_run",
    "create_flow_run_from_deployment",
    "run_flow",
}
FLOW_OBJECTS = {entry.attr for entry in FLOWS}


def _package_files() -> list[Path]:
    skip = {"tests", "bench", ".venv", ".git"}
    return [
        path
        for path in ROOT.rglob("*.py")
        if not skip & set(path.relative_to(ROOT).parts[:1]) and ".venv" not in path.parts
    ]


def _run_makers(path: Path) -> list[str]:
    """``file:line name`` of each call in ``path`` that makes or runs a flow run."""
    found = []
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if not isinstance(node, ast.Call):
            continue
        func = node.func
        name = func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", None)
        if name in RUN_MAKERS or name in FLOW_OBJECTS:
            found.append(f"{path.relative_to(ROOT)}:{node.lineno} {name}")
    return found


def test_one_place_makes_every_flow_run():
    makers = [line for path in _package_files() for line in _run_makers(path)]
    places = {line.split(":")[0] for line in makers}
    assert places == {"flows/planner.py"}, "\n".join(makers)


def test_every_flow_is_registered_and_prefect_yaml_is_the_registry():
    defined = set()
    for path in (ROOT / "flows").glob("*.py"):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.AsyncFunctionDef | ast.FunctionDef):
                for deco in node.decorator_list:
                    if isinstance(deco, ast.Call) and getattr(deco.func, "id", "") == "flow":
                        name = next(k.value.value for k in deco.keywords if k.arg == "name")
                        defined.add((f"flows.{path.stem}", node.name, name))
    assert defined == {(e.module, e.attr, e.name) for e in FLOWS}
    declared = yaml.safe_load((ROOT / "prefect.yaml").read_text(encoding="utf-8"))
    expected = [
        {
            "name": entry.name,
            "entrypoint": entry.file_entrypoint,
            "description": entry.description,
            "work_pool": {"name": "verimail"},
            **(
                {"schedules": [{"cron": entry.cron, "timezone": "UTC", "active": True}]}
                if entry.cron
                else {}
            ),
        }
        for entry in FLOWS
    ]
    assert declared["deployments"] == expected, yaml.safe_dump({"deployments": expected})


GREY = "mx.grey.test"


def _greylisting_world() -> World:
    """Two domains on quick servers and one whose server greylists every first try: a
    sharded job's first pass puts its addresses off, and its retry pass settles them."""
    return World.of(
        [
            HostSpec("mx.quick.test", HostBehaviour(mailboxes={"a", "b"})),
            HostSpec(GREY, HostBehaviour(mailboxes={"g0", "g1"}, greylist_tries=1)),
        ],
        [
            DomainSpec("q0.test", mx=[(10, "mx.quick.test")]),
            DomainSpec("q1.test", mx=[(10, "mx.quick.test")]),
            DomainSpec("grey.test", mx=[(10, GREY)]),
        ],
    )


def _runs_of_job(settings: Any, job_id: int) -> list[Any]:
    """Every flow run of the job (by the tag each of its runs carries: job numbers restart
    in each test's database, and the session's tests share one Prefect server)."""
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.filters import FlowRunFilter, FlowRunFilterTags

    tag = planner.job_tag(settings, job_id)
    with get_client(sync_client=True) as client:
        return client.read_flow_runs(
            flow_run_filter=FlowRunFilter(tags=FlowRunFilterTags(all_=[tag])), limit=200
        )


def _artifact_run(key: str, timeout: float = PATIENCE) -> str | None:
    """The flow run of the artifact ``key``, once it is there (a job's summary is published
    just after the job is completed)."""
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.filters import ArtifactFilter, ArtifactFilterKey

    deadline = time.monotonic() + timeout
    wanted = ArtifactFilter(key=ArtifactFilterKey(any_=[key]))
    with get_client(sync_client=True) as client:
        while not (found := client.read_artifacts(artifact_filter=wanted)):
            if time.monotonic() > deadline:
                return None
            time.sleep(0.2)  # (polling Prefect: nothing to wait on but its answer)
    return str(found[0].flow_run_id)


@pytest.mark.prefect
@pytest.mark.usefixtures("prefect_harness")
async def test_a_sharded_job_with_a_retry_pass_has_runs_named_for_what_they_do(
    testbed_factory, testbed_settings, tmp_path
):
    from verimail.flows.summary import artifact_key
    from verimail.runners.deploy import register_deployments

    tb = testbed_factory(_greylisting_world())
    pool = f"verimail-planner-{os.getpid()}"
    emails = [f"{who}@q{n}.test" for n in range(2) for who in ("a", "b", "zz")]
    emails += ["g0@grey.test", "g1@grey.test", "gone@grey.test"]
    retry = {"job_retry_delay": 1.0, "job_retry_passes": 1, "job_shard_size": 4}
    with temporary_database_url("postgres", tmp_path) as url:
        settings = testbed_settings(
            tb, tmp_path, database_url=url, runner="deployment", prefect_work_pool=pool, **retry
        )
        assert await asyncio.to_thread(register_deployments, pool, schedule=False)
        env = worker_env(
            env_for_testbed(tb),
            database_url=url,
            data_dir=tmp_path,
            **{f"VERIMAIL_{k.upper()}": str(v) for k, v in retry.items()},
        )
        async with running_app(settings) as app:
            customer = app.customer(credits=100)
            with warm_worker(pool, env, tmp_path / "worker.log", limit=4):
                created = await app.client.post(
                    "/api/bulk",
                    headers=customer.headers,
                    files={"file": ("leads.csv", "email\n" + "\n".join(emails) + "\n")},
                )
                assert created.status_code == 200, created.text
                job_id = int(created.json()["job_id"])
                done = await poll_job(app.client, f"/api/bulk/{job_id}", customer.headers)
            log = (tmp_path / "worker.log").read_text(errors="replace")[-3000:]
            assert done["status"] == "completed", (done, log)
            assert done["valid_count"] == 6, done  # (the greylisted two settled by the retry)
            job = job_store.get_job_any(app.store.engine, job_id)
            assert job is not None
            shards = job.options["shards"]["total"]
            assert shards >= 2
        runs = await asyncio.to_thread(_runs_of_job, settings, job_id)
        names = Counter(run.name for run in runs)
        expected = {f"bulk job {job_id} · leads.csv", f"bulk job {job_id} · merge"}
        expected |= {f"bulk job {job_id} · shard {k} of {shards}" for k in range(1, shards + 1)}
        expected.add(f"bulk job {job_id} · retry pass 1 of 1")
        assert set(names) == expected, names
        assert max(names.values()) == 1, names
        first = next(r for r in runs if r.name.endswith("leads.csv"))
        key = artifact_key(settings, f"bulk-job-{job_id}")
        assert await asyncio.to_thread(_artifact_run, key) == str(first.id), log


@pytest.mark.prefect
@pytest.mark.usefixtures("prefect_harness")
async def test_the_same_request_to_the_pool_is_one_run(testbed_settings, testbed_factory, tmp_path):
    from verimail.runners.deploy import register_deployments

    tb = testbed_factory(_greylisting_world())
    pool = f"verimail-planner-once-{os.getpid()}"
    settings = testbed_settings(tb, tmp_path, runner="deployment", prefect_work_pool=pool)
    assert await asyncio.to_thread(register_deployments, pool, schedule=False)
    request = planner.RunRequest(
        "shard", {"job_id": 10**6, "shard": 0, "attempt": 1}, "twice asked", "planner-test-once"
    )
    first = await planner.submit_to_pool(settings, request)
    again = await planner.submit_to_pool(settings, request)
    assert first == again
    other = await planner.submit_to_pool(
        settings, planner.RunRequest("shard", request.parameters, "asked once", "planner-test-2")
    )
    assert other != first


@pytest.mark.prefect
@pytest.mark.usefixtures("prefect_harness")
async def test_the_local_runner_runs_a_job_run_once_however_often_asked(
    testbed_settings, testbed_factory, tmp_path
):
    """The API hands the job to its local runner; the reaper or a timer asking for the same
    run again while it is queued or running adds no second run."""
    tb = testbed_factory(_greylisting_world())
    settings = testbed_settings(tb, tmp_path, job_retry_passes=0, local_runner_workers=1)
    async with running_app(settings) as app:
        customer = app.customer(credits=100)
        created = await app.client.post(
            "/api/bulk",
            headers=customer.headers,
            files={"file": ("once.csv", "email\na@q0.test\nb@q1.test\n")},
        )
        assert created.status_code == 200, created.text
        job_id = int(created.json()["job_id"])
        runner = app.app.state.runner
        for _ in range(3):
            runner.submit("bulk", job_id)
        done = await poll_job(app.client, f"/api/bulk/{job_id}", customer.headers)
        assert done["status"] == "completed", done
        await asyncio.to_thread(runner.wait, 60)
    runs = await asyncio.to_thread(_runs_of_job, settings, job_id)
    assert [run.name for run in runs] == [f"bulk job {job_id} · once.csv"]


def test_registry_names_each_flow_once():
    assert len({e.key for e in FLOWS}) == len({e.name for e in FLOWS}) == len(FLOWS)
    assert BY_KEY["bulk"].deployment == "bulk-verify/bulk-verify"
