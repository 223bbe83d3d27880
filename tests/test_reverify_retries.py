"""Deferred retries of an operator's ``reverify-stored`` run (issue 22), against the
testbed's postgrey rule: the run parks the greylisted addresses beside its change report
and plans a follow-up run in Prefect; the follow-up (run by the local runner's sweep, or
taken from the deployment) asks them again, writes their results to the history and
replaces their rows in the report, within the configured passes and wait."""

from __future__ import annotations

import asyncio
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import polars as pl
import pytest
from api_helpers import STALE_AFTER, host_per_domain, running_app

from verimail.config import Settings, using_settings
from verimail.files.history import query
from verimail.flows.planner import RETRY_RUN_TAG as RUN_TAG
from verimail.flows.reverify import reverify_stored
from verimail.jobs.context import forget
from verimail.testbed.server import Testbed
from verimail.testbed.world import HostBehaviour, World

pytestmark = pytest.mark.usefixtures("prefect_harness")

GREY_DELAY = 1.5  # postgrey's delay here; the first retry pass waits 2 s
LIST = "inbox/list.csv"
EMAILS = ["alice@ok.test", "alice@grey.test", "bob@grey.test", "carl@grey.test"]
GREY = "mx.grey.test"
GREYLISTED = [email for email in EMAILS if email.endswith("@grey.test")]
OK = frozenset({"alice"})


def _world(grey: set[str], greylist_delay: float | None = None, ok: frozenset = OK) -> World:
    return host_per_domain(
        {
            "ok.test": HostBehaviour(mailboxes=set(ok)),
            "grey.test": HostBehaviour(mailboxes=grey, greylist_delay=greylist_delay),
        }
    )


@pytest.fixture
def tb(testbed_factory) -> Testbed:
    return testbed_factory(_world({"alice", "bob"}))


def _settings(tb: Testbed, tmp_path: Path, testbed_settings: Any, **overrides: Any) -> Settings:
    (tmp_path / "inbox").mkdir()
    (tmp_path / LIST).write_text("email\n" + "\n".join(EMAILS) + "\n")
    values = {
        "smtp_greylist_retries": 0,  # (only the deferred passes retry)
        "job_retry_delay": 2.0,
        "job_retry_passes": 2,
        "job_retry_max_wait": 10.0,
        "job_stale_after": STALE_AFTER,  # the reaper sweeps every 2 s
        **overrides,
    }
    return testbed_settings(tb, tmp_path, **values)


@pytest.fixture
def settings(tb, testbed_settings, tmp_path):
    settings = _settings(tb, tmp_path, testbed_settings)
    yield settings
    forget(settings)


async def _first_run(settings: Settings, tb: Testbed, **parameters: Any) -> dict[str, Any]:
    """Verify the list once (it enters the history: the Alices and Bob valid, Carl
    invalid), then, after Alice left ok.test, Bob left grey.test, Carl joined it and it
    began to greylist, re-verify it."""
    with using_settings(settings):
        seed = await reverify_stored(file_path=LIST)
        assert seed["retry_waiting"] == 0 and seed["next_retry_at"] is None, seed
        tb.replace_world(_world({"alice", "carl"}, greylist_delay=GREY_DELAY, ok=frozenset()))
        return await reverify_stored(file_path=LIST, **parameters)


def _report(path: str | Path) -> dict[str, tuple[str, str]]:
    rows = pl.read_csv(path).iter_rows(named=True)
    return {row["email"]: (row["previous_status"], row["status"]) for row in rows}


ALICE_LEFT = {"alice@ok.test": ("valid", "invalid")}  # (settled at once, never retried)
ALL_UNKNOWN = {
    **ALICE_LEFT,
    "alice@grey.test": ("valid", "unknown"),
    "bob@grey.test": ("valid", "unknown"),
    "carl@grey.test": ("invalid", "unknown"),
}


def _parked_files(report: Path) -> list[Path]:
    stem = report.name.removesuffix(".csv")
    return [p for p in report.parent.iterdir() if p.name.startswith(f"{stem}.retry")]


async def _retry_runs(report: Path) -> list[Any]:
    """The follow-up runs planned for ``report``, oldest first."""
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.filters import FlowRunFilter, FlowRunFilterTags
    from prefect.client.schemas.sorting import FlowRunSort

    async with get_client() as client:
        runs = await client.read_flow_runs(
            flow_run_filter=FlowRunFilter(tags=FlowRunFilterTags(all_=[RUN_TAG])),
            sort=FlowRunSort.EXPECTED_START_TIME_ASC,
            limit=200,
        )
    return [run for run in runs if run.parameters.get("retry_of") == report.name]


async def _until(predicate: Any, what: str, timeout: float = 60.0) -> None:
    deadline = time.monotonic() + timeout
    while not await predicate():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        await asyncio.sleep(0.1)


async def test_parked_addresses_get_their_true_verdicts_in_the_report_and_history(settings, tb):
    async with running_app(settings):  # (its reaper's sweep runs due follow-ups)
        before = tb.host_stats(GREY).rcpts
        first = await _first_run(settings, tb)
        report = Path(first["report"])
        # The first run ends at once: its report as the pass left it, three addresses parked.
        assert (first["retry_pass"], first["retry_waiting"]) == (0, 3), first
        assert _report(report) == ALL_UNKNOWN
        assert first["transitions"] == {
            "valid->unknown": 2,
            "invalid->unknown": 1,
            "valid->invalid": 1,
        }
        (planned,) = await _retry_runs(report)
        assert planned.state.is_scheduled()
        assert planned.parameters == {"retry_of": report.name, "retry_pass": 1}
        assert planned.expected_start_time == datetime.fromisoformat(first["next_retry_at"])
        assert planned.deployment_id is None  # (the local runner's)
        assert [p.name for p in _parked_files(report)] == [
            report.name.replace(".csv", ".retry.json")
        ]

        async def ran() -> bool:
            (run,) = await _retry_runs(report)
            return run.state.is_final()

        await _until(ran, "the retry pass")
        (run,) = await _retry_runs(report)
        assert run.state.is_completed(), run.state
        assert datetime.now(UTC) >= planned.expected_start_time
    # The report ends with their final verdicts (Alice of grey.test did not change after
    # all), beside the row the first run settled.
    assert _report(report) == {
        **ALICE_LEFT,
        "bob@grey.test": ("valid", "invalid"),
        "carl@grey.test": ("invalid", "valid"),
    }
    assert _parked_files(report) == []
    latest = query(settings.data_dir, "SELECT email, status FROM latest ORDER BY email")
    assert latest.rows() == [
        ("alice@grey.test", "valid"),
        ("alice@ok.test", "invalid"),
        ("bob@grey.test", "invalid"),
        ("carl@grey.test", "valid"),
    ]
    assert query(settings.data_dir, "SELECT count(*) FROM history").item() == 4 + 4 + 3
    # Each greylisted address was asked once by the run and once by its retry pass (and
    # once before, by the run that put the list in the history).
    asked = tb.host_stats(GREY).rcpts[len(before) :]
    assert all(asked.count(email) == 3 for email in GREYLISTED), asked


@pytest.mark.parametrize(
    "opt_out", [{"retry_unknowns": False}, {"job_retry_passes": 0}], ids=["flow", "setting"]
)
async def test_opting_out_leaves_the_report_final_after_one_run(
    tb, testbed_settings, tmp_path, opt_out
):
    parameters = {k: v for k, v in opt_out.items() if k == "retry_unknowns"}
    overrides = {k: v for k, v in opt_out.items() if k != "retry_unknowns"}
    settings = _settings(tb, tmp_path, testbed_settings, **overrides)
    try:
        first = await _first_run(settings, tb, **parameters)
    finally:
        forget(settings)
    report = Path(first["report"])
    assert (first["retry_waiting"], first["next_retry_at"]) == (0, None), first
    assert _report(report) == ALL_UNKNOWN
    assert _parked_files(report) == [] and await _retry_runs(report) == []


@pytest.mark.parametrize(
    ("passes", "max_wait", "made"),
    [(1, 10.0, 1), (5, 1.5, 2)],  # delays 0.5 s, then 1 s, then 2 s (past 1.5 s in all)
    ids=["passes", "max-wait"],
)
async def test_passes_and_the_most_wait_bound_the_follow_ups(
    tb, testbed_settings, tmp_path, passes, max_wait, made
):
    settings = _settings(
        tb,
        tmp_path,
        testbed_settings,
        job_retry_delay=0.5,
        job_retry_passes=passes,
        job_retry_max_wait=max_wait,
    )
    try:
        async with running_app(settings):
            before = tb.host_stats(GREY).rcpts
            with using_settings(settings):
                await reverify_stored(file_path=LIST)
                tb.replace_world(_world({"alice", "carl"}, 60.0, ok=frozenset()))  # never clears
                first = await reverify_stored(file_path=LIST)
            report = Path(first["report"])
            assert first["retry_waiting"] == 3, first

            async def ended() -> bool:
                # (the last pass releases its file just before its run ends: wait for both)
                if _parked_files(report):
                    return False
                runs = await _retry_runs(report)
                return all(run.state.is_final() for run in runs)

            await _until(ended, "the last retry pass")
            runs = await _retry_runs(report)
    finally:
        forget(settings)
    assert [run.parameters["retry_pass"] for run in runs] == list(range(1, made + 1))
    assert all(run.state.is_completed() for run in runs), [run.state for run in runs]
    assert _report(report) == ALL_UNKNOWN  # (still put off: the report says so)
    asked = tb.host_stats(GREY).rcpts[len(before) :]
    assert all(asked.count(email) == 2 + made for email in GREYLISTED), asked


async def test_a_follow_up_cancelled_in_prefect_is_forgotten(settings, tb):
    """The operator cancels the planned retry pass in the Prefect UI: once it is overdue
    the sweep removes the parked pass, the report stays as the first run left it."""
    from prefect.client.orchestration import get_client
    from prefect.states import Cancelled

    async with running_app(settings):
        first = await _first_run(settings, tb)
        report = Path(first["report"])
        (planned,) = await _retry_runs(report)
        async with get_client() as client:
            await client.set_flow_run_state(planned.id, Cancelled(), force=True)

        async def forgotten() -> bool:
            return not _parked_files(report)

        await _until(forgotten, "the sweep to forget the cancelled pass")
    assert _report(report) == ALL_UNKNOWN
    (run,) = await _retry_runs(report)
    assert run.state.is_cancelled()


async def test_with_workers_the_follow_up_is_a_run_of_the_deployment(
    tb, testbed_settings, tmp_path
):
    """A run a worker took from the ``reverify-stored`` deployment plans its retry pass as a
    Scheduled run of that deployment (whatever the worker's ``runner`` setting), for a
    worker to take when due; taken then, it settles the parked addresses."""
    import os

    from prefect.client.orchestration import get_client
    from prefect.flow_engine import run_flow_async

    from verimail.runners.deploy import register_deployments

    settings = _settings(tb, tmp_path, testbed_settings)  # (runner: local, as a worker's)
    await asyncio.to_thread(register_deployments, f"verimail-test-{os.getpid()}", schedule=False)
    try:
        with using_settings(settings):
            await reverify_stored(file_path=LIST)
        tb.replace_world(_world({"alice", "carl"}, greylist_delay=GREY_DELAY, ok=frozenset()))
        async with get_client() as client:
            deployment = await client.read_deployment_by_name("reverify-stored/reverify-stored")
            taken = await client.create_flow_run_from_deployment(
                deployment.id, parameters={"file_path": LIST}
            )
            with using_settings(settings):
                first = await run_flow_async(
                    reverify_stored, flow_run=taken, parameters=taken.parameters
                )
            report = Path(first["report"])
            assert first["retry_waiting"] == 3, first
            (planned,) = await _retry_runs(report)
            assert planned.deployment_id == deployment.id and planned.state.is_scheduled()

            async def due() -> bool:
                return datetime.now(UTC) >= planned.expected_start_time

            await _until(due, "the retry pass's time")
            with using_settings(settings):
                again = await run_flow_async(
                    reverify_stored, flow_run=planned, parameters=planned.parameters
                )
            assert (await client.read_flow_run(planned.id)).state.is_completed()
    finally:
        forget(settings)
    assert again["retry_pass"] == 1 and again["addresses"] == 3, again
    assert (again["retry_waiting"], again["next_retry_at"]) == (0, None)
    assert again["transitions"] == {"valid->invalid": 2, "invalid->valid": 1}
    assert again["report"] == first["report"]
    assert _report(report) == {
        **ALICE_LEFT,
        "bob@grey.test": ("valid", "invalid"),
        "carl@grey.test": ("invalid", "valid"),
    }
    assert _parked_files(report) == []
