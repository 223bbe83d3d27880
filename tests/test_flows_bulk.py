"""The bulk-verify flow on a real Prefect server, real SQLite, real DNS/SMTP testbed."""

from __future__ import annotations

import asyncio
import csv
import gc
import threading
import time
from datetime import timedelta
from pathlib import Path

import polars as pl
import pytest
from api_helpers import PATIENCE
from hardening_helpers import take_for_dead
from prefect.exceptions import TerminationSignal
from sqlalchemy.exc import OperationalError

from verimail.config import using_settings
from verimail.engine.core import EngineStats, Prepared
from verimail.engine.smtp.findings import HostGroup
from verimail.files import bulk_io
from verimail.files.bulk_io import job_dir
from verimail.files.upload_errors import UploadError
from verimail.flows.bulk import bulk_verify
from verimail.flows.failures import ends_the_process
from verimail.flows.summary import artifact_key
from verimail.jobs import heartbeat as heartbeat_module
from verimail.jobs.context import forget, store_for
from verimail.jobs.recovery import recover_stale_jobs
from verimail.runners.local import LocalRunner
from verimail.schemas.results import VerificationResult
from verimail.store import accounts
from verimail.store import jobs as job_store
from verimail.store.billing.movements import grant
from verimail.store.billing.pools import balance
from verimail.store.db import utcnow
from verimail.tasks import job_files, pipeline
from verimail.tasks import verify as verify_tasks
from verimail.tasks.verify import chunk_groups
from verimail.testbed.world import DomainSpec, HostBehaviour, HostSpec, World

pytestmark = pytest.mark.usefixtures("prefect_harness")


def _world() -> World:
    return World.of(
        [
            HostSpec("mx.acme.test", HostBehaviour(mailboxes={"alice", "bob", "carol"})),
            HostSpec("mx.catchall.test", HostBehaviour(accept_all=True)),
        ],
        [
            DomainSpec("acme.test", mx=[(10, "mx.acme.test")]),
            DomainSpec("catchall.test", mx=[(10, "mx.catchall.test")]),
        ],
    )


UPLOAD = (
    "name,Email,note\r\n"
    '"Smith, Alice",alice@acme.test,"says ""hi"""\r\n'
    "Bob,BOB@ACME.TEST,\r\n"
    "Nobody,nobody@acme.test,x\r\n"
    "Jörg,jörg.x@catchall.test,ünïcode\r\n"
    "Empty,,\r\n"
    "Again,alice@acme.test,dup\r\n"
    "Bad,not-an-address,\r\n"
)


@pytest.fixture
def setup(testbed_factory, testbed_settings, tmp_path):
    tb = testbed_factory(_world())
    settings = testbed_settings(tb, tmp_path, job_stale_after=2.0)
    store = store_for(settings)
    account = accounts.create_account(store.engine, settings, plan="enterprise")
    yield tb, settings, store, account
    forget(settings)


def _job_for(settings, store, account, text: str, *, reserve: int):
    directory = job_dir(settings.data_dir, 0).parent / "upload-tmp"
    directory.mkdir(parents=True, exist_ok=True)
    upload = directory / f"upload-{reserve}.csv"
    upload.write_bytes(text.encode("utf-8"))
    return job_store.create_job(
        store.engine, account.id, "bulk_csv", reserve, reserve=reserve, upload_path=str(upload)
    )


def test_bulk_flow_verifies_and_writes_results(setup):
    tb, settings, store, account = setup
    job = _job_for(settings, store, account, UPLOAD, reserve=6)
    with using_settings(settings):
        summary = asyncio.run(bulk_verify(job_id=job.id))
    done = job_store.get_job_any(store.engine, job.id)
    assert done.status == "completed", done.failed_reason
    assert summary["status"] == "completed"
    # 6 address rows: alice x2 + bob valid, nobody + bad invalid, jörg on the catch-all.
    assert done.processed_emails == 6
    assert (done.valid_count, done.invalid_count, done.catch_all_count) == (3, 2, 1)
    assert done.credits_used == 6 and done.credits_refunded == 0
    # Alice was probed once although she is in the file twice; the domain of BOB@ACME.TEST
    # is lower-cased, its local part kept as typed (it may be case-sensitive).
    rcpts = tb.host_stats("mx.acme.test").rcpts
    assert rcpts.count("alice@acme.test") == 1 and "BOB@acme.test" in rcpts
    out = Path(done.result_path).read_bytes().decode("utf-8")
    lines = out.split("\r\n")
    original = UPLOAD.split("\r\n")
    assert lines[0] == original[0] + ",Safe to Send"
    safe = [line.rsplit(",", 1)[1] for line in lines[1:-1]]
    assert safe == ["Yes", "Yes", "No", "No", "No", "Yes", "No"]
    for got, want in zip(lines[1:-1], original[1:-1], strict=True):
        assert got.rsplit(",", 1)[0] == want
    frame = pl.read_parquet(job_dir(settings.data_dir, job.id) / "results.parquet")
    assert frame.height == 7
    history = list((settings.data_dir / "history").rglob("*.parquet"))
    assert [p.name for p in history] == [f"bulk-{job.id}.parquet"]  # (one file per job)


def test_a_run_whose_process_is_stopped_leaves_the_job_to_the_reaper(setup, monkeypatch):
    """A flow-run process whose worker was killed dies on its next log line (Rich turns the
    broken pipe into SystemExit). That failed the job with a refund on its first run, and
    a signal to the process (TerminationSignal) did the same; the job is the reaper's to
    resume. (A TerminationSignal through Prefect's engine re-sends SIGTERM to this very
    process, so only the SystemExit goes through a run here.)"""
    for stop in (TerminationSignal(15), KeyboardInterrupt(), asyncio.CancelledError()):
        assert ends_the_process(stop)
    assert not ends_the_process(OSError()) and not ends_the_process(RuntimeError())
    _, settings, store, account = setup
    job = _job_for(settings, store, account, UPLOAD, reserve=6)

    def stopped(*args, **kwargs):
        raise SystemExit(1)

    monkeypatch.setattr(job_files, "read_job_input", stopped)
    before = balance(store.engine, account.id).total
    with using_settings(settings), pytest.raises(SystemExit):
        asyncio.run(bulk_verify(job_id=job.id))
    left = job_store.get_job_any(store.engine, job.id)
    assert (left.status, left.credits_refunded, left.failed_reason) == ("processing", 0, None)
    assert balance(store.engine, account.id).total == before
    monkeypatch.undo()
    # Its beats stopped with the run: once quiet long enough, the reaper resumes it.
    job_store.heartbeat(store.engine, job.id, now=utcnow() - timedelta(minutes=5))
    recorder = _Recorder()
    assert recover_stale_jobs(settings, recorder) == [(job.id, "resumed")]
    assert recorder.submitted == [("bulk", job.id, 2)]


class _Recorder:
    """A runner that notes what it was asked to run."""

    def __init__(self) -> None:
        self.submitted: list[tuple[str, int, int | None]] = []

    def submit(self, kind: str, job_id: int, attempt: int | None = None, **_: object) -> None:
        self.submitted.append((kind, job_id, attempt))

    def shutdown(self) -> None:
        return None


def test_failed_run_refunds_what_it_did_not_verify(setup):
    _, settings, store, account = setup
    job = _job_for(settings, store, account, UPLOAD, reserve=6)
    Path(job.upload_path).unlink()  # the run cannot read its upload: it fails
    before = balance(store.engine, account.id).total
    with using_settings(settings), pytest.raises(FileNotFoundError):
        asyncio.run(bulk_verify(job_id=job.id))
    failed = job_store.get_job_any(store.engine, job.id)
    assert failed.status == "failed" and failed.failed_reason
    assert failed.credits_refunded == 6
    assert balance(store.engine, account.id).total == before + 6
    # The customer reads why, not the exception: it named the server's upload path.
    assert "internal error (reference " in failed.failed_reason
    assert str(settings.data_dir) not in failed.failed_reason
    assert "FileNotFoundError" not in failed.failed_reason
    # An upload problem is the customer's to fix: that one is told whole.
    emptied = _job_for(settings, store, account, UPLOAD, reserve=6)
    Path(emptied.upload_path).write_bytes(b"")
    with using_settings(settings), pytest.raises(UploadError):
        asyncio.run(bulk_verify(job_id=emptied.id))
    reason = job_store.get_job_any(store.engine, emptied.id).failed_reason
    assert reason == "The job stopped: The file is empty."


def _run_locally(settings, job_id: int) -> None:
    """Run the job's bulk flow on a local runner, to its end."""
    runner = LocalRunner(settings)
    try:
        runner.submit("bulk", job_id)
        runner.wait(timeout=120)
    finally:
        runner.shutdown()


def test_local_runner_runs_job_in_background(setup):
    _, settings, store, account = setup
    job = _job_for(settings, store, account, "email\nalice@acme.test\nzed@acme.test\n", reserve=2)
    _run_locally(settings, job.id)
    done = job_store.get_job_any(store.engine, job.id)
    assert done.status == "completed"
    assert (done.valid_count, done.invalid_count) == (1, 1)


def test_stale_job_is_resumed_then_failed_with_refund(setup):
    _, settings, store, account = setup
    job = _job_for(settings, store, account, "email\nalice@acme.test\n", reserve=1)
    job_store.mark_processing(store.engine, job.id)
    job_store.update_progress(store.engine, job.id, 0)

    class Recorder:
        def __init__(self) -> None:
            self.submitted: list[int] = []

        def submit(self, kind: str, job_id: int, attempt: int | None = None, **_: object) -> None:
            self.submitted.append(job_id)

        def shutdown(self) -> None:
            return None

    # Not stale yet: nothing happens.
    assert recover_stale_jobs(settings, Recorder()) == []
    # Its runner went quiet five minutes ago: resumed once.
    quiet = utcnow() - timedelta(minutes=5)
    job_store.heartbeat(store.engine, job.id, now=quiet)
    recorder = Recorder()
    assert recover_stale_jobs(settings, recorder) == [(job.id, "resumed")]
    assert recorder.submitted == [job.id]
    # It went quiet again after its second run: out of attempts, failed with a refund.
    job_store.heartbeat(store.engine, job.id, now=quiet)
    assert recover_stale_jobs(settings, recorder) == [(job.id, "failed")]
    failed = job_store.get_job_any(store.engine, job.id)
    assert failed.status == "failed" and failed.credits_refunded == 1


def test_chunking_bounds_task_runs():
    groups = [HostGroup(hosts=(), domains={f"d{i}": ["x"] * (i % 7 + 1)}) for i in range(5000)]
    chunks = chunk_groups(groups)
    assert 1 <= len(chunks) <= 100
    assert sum(len(c) for c in chunks) == 5000
    sizes = [sum(g.size for g in c) for c in chunks]
    assert max(sizes) - min(sizes) <= 8


def test_csv_module_reads_results(setup):
    """The results CSV stays a valid CSV whose rows line up with the upload."""
    _, settings, store, account = setup
    job = _job_for(settings, store, account, UPLOAD, reserve=6)
    with using_settings(settings):
        asyncio.run(bulk_verify(job_id=job.id))
    done = job_store.get_job_any(store.engine, job.id)
    with open(done.result_path, newline="", encoding="utf-8") as fh:
        rows = list(csv.reader(fh))
    assert rows[0] == ["name", "Email", "note", "Safe to Send"]
    assert rows[1] == ["Smith, Alice", "alice@acme.test", 'says "hi"', "Yes"]


def test_run_started_from_the_ui_creates_its_job_and_progress_artifact(setup, tmp_path):
    """A data team triggers bulk-verify with a file path and an account: the API sees it."""
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.filters import (
        ArtifactFilter,
        ArtifactFilterFlowRunId,
        ArtifactFilterKey,
    )

    _, settings, store, account = setup
    upload = tmp_path / "from-ui.csv"
    upload.write_text("email\nalice@acme.test\nnobody@acme.test\n")
    before = balance(store.engine, account.id).total
    with using_settings(settings):
        summary = asyncio.run(bulk_verify(file_path=str(upload), account_id=account.id))
    job = job_store.get_job(store.engine, account.id, summary["job_id"])
    assert job is not None and job.status == "completed"
    assert (job.valid_count, job.invalid_count) == (1, 1)
    assert balance(store.engine, account.id).total == before - 2

    async def progress() -> list:
        async with get_client() as client:
            return await client.read_artifacts(
                # (this run's: other tests' databases have a job with this id too, and the
                # Prefect server is the session's)
                artifact_filter=ArtifactFilter(
                    key=ArtifactFilterKey(
                        any_=[artifact_key(settings, f"bulk-job-{job.id}-progress")]
                    ),
                    flow_run_id=ArtifactFilterFlowRunId(any_=[job.flow_run_id]),
                )
            )

    artifacts = asyncio.run(progress())
    assert artifacts and artifacts[0].type == "progress"
    assert float(artifacts[0].data) == 100.0


async def test_heartbeat_beats_through_a_blocked_loop_and_a_failed_beat(setup, monkeypatch):
    """The run's heartbeat must not depend on its event loop (parsing a million addresses
    holds the loop for minutes) nor die of one failed beat (database briefly unreachable):
    either way a live run would look dead and recovery would start it again beside itself.
    Here the loop is held by a blocking wait for the beats themselves, and the first beat
    fails: the beats after it still land."""
    _, settings, store, account = setup
    job = _job_for(settings, store, account, "email\nalice@acme.test\n", reserve=1)
    job_store.mark_processing(store.engine, job.id)
    quiet = utcnow() - timedelta(minutes=5)
    job_store.heartbeat(store.engine, job.id, now=quiet)
    real = job_store.beat_run
    calls: list[int] = []
    landed = threading.Event()

    def flaky(engine, job_id, attempt, **kwargs):
        calls.append(job_id)
        if len(calls) == 1:
            raise OperationalError("UPDATE jobs", {}, Exception("database is locked"))
        beat = real(engine, job_id, attempt, **kwargs)
        if len(calls) >= 3:
            landed.set()
        return beat

    monkeypatch.setattr(job_store, "beat_run", flaky)
    with heartbeat_module.RunHeartbeat(store, job.id, 0.2) as heartbeat:
        assert landed.wait(timeout=PATIENCE)  # blocks this loop: the beats cannot use it
    assert job_store.get_job_any(store.engine, job.id).heartbeat_at > quiet
    assert not heartbeat.lost
    assert not heartbeat._thread.is_alive()  # it stops with the run


def _live(cls: type) -> int:
    return sum(1 for obj in gc.get_objects() if type(obj) is cls)


def test_bulk_flow_holds_one_part_of_results_at_a_time(
    testbed_factory, testbed_settings, tmp_path, monkeypatch
):
    """800 addresses on 8 hosts (4 chunks): each chunk's results go to Parquet parts of 50
    and are forgotten, so the records alive at each progress update stay under a part and
    a host group (the run used to keep every record until it wrote the files)."""
    hosts = [HostSpec(f"mx{h}.many.test", HostBehaviour()) for h in range(8)]
    domains, lines = [], ["email"]
    for h, host in enumerate(hosts):
        domains.append(DomainSpec(f"d{h}.many.test", mx=[(10, host.name)]))
        for i in range(100):
            if i % 4:
                host.behaviour.mailboxes.add(f"user{i}@d{h}.many.test")
            lines.append(f"user{i}@d{h}.many.test")
    tb = testbed_factory(World.of(hosts, domains))
    settings = testbed_settings(tb, tmp_path)
    store = store_for(settings)
    account = accounts.create_account(store.engine, settings, plan="enterprise")
    grant(store.engine, account.id, 1000)
    job = _job_for(settings, store, account, "\n".join(lines) + "\n", reserve=800)
    monkeypatch.setattr(bulk_io, "PART_ROWS", 50)
    alive: list[int] = []
    real = job_store.update_progress

    def watched(*args, **kwargs):
        gc.collect()
        alive.append(_live(VerificationResult))
        return real(*args, **kwargs)

    monkeypatch.setattr(job_store, "update_progress", watched)
    try:
        with using_settings(settings):
            summary = asyncio.run(bulk_verify(job_id=job.id))
    finally:
        forget(settings)
    assert summary["valid_count"] == 600 and summary["invalid_count"] == 200
    assert len(alive) >= 2 and max(alive) <= 150, alive  # the start, then as chunks end
    frame = pl.read_parquet(job_dir(settings.data_dir, job.id) / "results.parquet")
    assert frame.height == 800 and frame.get_column("status").null_count() == 0
    assert not (job_dir(settings.data_dir, job.id) / bulk_io.RESULT_PARTS).exists()


def _record(email: str, **extra) -> VerificationResult:
    base = {
        "email": email,
        "safe_to_send": False,
        "status": "unknown",
        "confidence_score": 0.5,
        "reason": "test",
        "domain": email.rpartition("@")[2],
        "is_disposable": False,
        "is_role_based": False,
        "is_free": False,
        "is_catch_all": False,
        "mx_records": [],
        "smtp_response": None,
        "verification_time_ms": None,
        "sub_status": "greylisted",
    }
    return VerificationResult(**{**base, **extra})


def test_result_sink_writes_each_batch_as_it_comes(tmp_path, monkeypatch):
    """A run's results reach its parts batch by batch, however few and however soon: one
    held back until the next batch (which a slow server kept from coming) was lost to a
    stop — progress showed 231 of 633, the partial file had none (issue 44)."""
    monkeypatch.setattr(bulk_io, "PART_SECONDS", 3600.0)  # (no time has passed)
    sink = bulk_io.ResultSink(tmp_path, part_rows=1000)
    sink.add([("a@x.test", _record("a@x.test"))])
    assert sink.parts == 1 and not sink.pending  # (fewer than part_rows, at once)
    sink.add([("b@x.test", _record("b@x.test"))])
    assert sink.parts == 2 and not sink.pending
    assert sorted(bulk_io.read_parts(sink.directory)["normalised"]) == ["a@x.test", "b@x.test"]


def test_result_sink_parts_read_back_as_one_table(tmp_path):
    """Parts written apart share one schema (a part whose optional fields are all null is
    not a table of its own kind), and a new sink starts from nothing."""
    sink = bulk_io.ResultSink(tmp_path, part_rows=2)
    sink.add([("a@x.test", _record("a@x.test")), ("b@x.test", _record("b@x.test"))])
    sink.add(
        [
            (
                "c@y.test",
                _record("c@y.test", did_you_mean="c@y.com", catch_all_score=80, mx_records=["m"]),
            )
        ]
    )
    assert sink.parts == 2 and not sink.pending
    frame = sink.frame()
    assert sink.parts == 2 and frame.schema == bulk_io.RESULT_SCHEMA
    assert frame.sort("normalised").get_column("did_you_mean").to_list() == [None, None, "c@y.com"]
    assert bulk_io.ResultSink(tmp_path).frame().is_empty()


def _slow_job(testbed_factory, testbed_settings, tmp_path, domain: str, delay: float, stale: float):
    """A bulk job of 40 addresses on ``domain``, whose host ``mx.<domain>`` answers after
    ``delay``; with its testbed, settings and store."""
    tb = testbed_factory(
        World.of(
            [HostSpec(f"mx.{domain}", HostBehaviour(mailboxes={"u0", "u2"}, reply_delay=delay))],
            [DomainSpec(domain, mx=[(10, f"mx.{domain}")])],
        )
    )
    settings = testbed_settings(tb, tmp_path, job_stale_after=stale)
    store = store_for(settings)
    account = accounts.create_account(store.engine, settings, plan="enterprise")
    lines = ["email", *(f"u{i}@{domain}" for i in range(40))]
    job = _job_for(settings, store, account, "\n".join(lines) + "\n", reserve=40)
    return tb, settings, store, job


@pytest.mark.parametrize("recovery", ["resumed", "failed"])
def test_a_run_taken_for_dead_stops_when_recovery_has_the_job(
    testbed_factory, testbed_settings, tmp_path, recovery
):
    """Recovery can take a live run for dead (a frozen process, a cut to the database) and
    resume the job as run 2, or, with its runs used up, fail it (with its refund). Either
    way run 1's next beat sees it and it stops — quietly: no second stream of SMTP sessions
    (a failed job's run went on probing its whole list), and when the job was resumed it
    neither fails it nor refunds what run 2 will do."""
    slow = "mx.tortoise.test"
    tb, settings, store, job = _slow_job(
        testbed_factory, testbed_settings, tmp_path, "tortoise.test", 0.1, stale=0.4
    )
    outcome: dict = {}

    def run_one() -> None:
        with using_settings(settings):
            outcome.update(asyncio.run(bulk_verify(job_id=job.id)))

    first = threading.Thread(target=run_one)
    try:
        first.start()
        assert tb.wait_until(lambda t: t.host_stats(slow).active >= 1)
        assert take_for_dead(store, job.id) == 2
        if recovery == "failed":  # (what recovery does after claiming a job with no runs left)
            assert job_store.mark_failed(store.engine, job.id, "stopped", job_store.UNVERIFIED)
        first.join(timeout=PATIENCE)
        assert not first.is_alive()
    finally:
        forget(settings)
    assert outcome == {"job_id": job.id, "status": "superseded", "run": 1}
    # Its sessions hung up, one cancelled while still connecting too (session._dial).
    assert tb.wait_until(lambda t: t.host_stats(slow).active == 0), tb.host_stats(slow)
    assert len(tb.host_stats(slow).rcpts) < 40  # it stopped before the end of the list
    after = job_store.get_job_any(store.engine, job.id)
    if recovery == "failed":
        assert after.status == "failed" and after.credits_refunded == 40
    else:
        assert after.status == "processing" and after.attempt == 2
        assert after.credits_refunded == 0 and after.failed_reason is None


def _completed_by_run_2(store, job, directory: Path) -> None:
    assert take_for_dead(store, job.id) == 2
    directory.mkdir(parents=True, exist_ok=True)
    (directory / "results.csv").write_text("run 2's results\n")
    assert job_store.mark_completed(
        store.engine, job.id, {}, str(directory / "results.csv"), 40, attempt=2
    )


def _run_2_started(store, job, directory: Path) -> None:
    assert take_for_dead(store, job.id) == 2
    bulk_io.ResultSink(directory, run=2)  # clears run 1's parts, as run 2's start does


def _run_2_not_at_its_parts_yet(store, job, directory: Path) -> None:
    assert take_for_dead(store, job.id) == 2


def test_a_run_frozen_before_its_parts_began_leaves_the_later_runs_parts_alone(
    testbed_factory, testbed_settings, tmp_path, monkeypatch
):
    """Run 1 freezes while it reads its list; recovery resumes the job as run 2, which starts
    writing its parts. When run 1 wakes (before its next beat) it must neither remove run
    2's parts (run 2 then failed the job, every row charged and nothing to download) nor
    verify again: it finds the job taken and stops."""
    tb, settings, store, job = _slow_job(
        testbed_factory, testbed_settings, tmp_path, "dozy.test", 0.1, stale=120
    )
    real_read = job_files.read_job_input
    frozen, wake = threading.Event(), threading.Event()
    reads: list[int] = []

    def read_job_input(*args, **kwargs):
        reads.append(1)
        if len(reads) == 1:  # run 1 freezes in its read; run 2 does not
            frozen.set()
            wake.wait(60)
        return real_read(*args, **kwargs)

    monkeypatch.setattr(job_files, "read_job_input", read_job_input)
    outcomes: dict[int, object] = {}

    def run(attempt: int) -> None:
        try:
            with using_settings(settings):
                outcomes[attempt] = asyncio.run(bulk_verify(job_id=job.id, attempt=attempt))
        except Exception as exc:
            outcomes[attempt] = exc

    first = threading.Thread(target=run, args=(1,))
    second = threading.Thread(target=run, args=(2,))
    try:
        first.start()
        assert frozen.wait(60)
        assert take_for_dead(store, job.id) == 2
        second.start()
        assert tb.wait_until(lambda t: t.host_stats("mx.dozy.test").active >= 1)
        wake.set()
        first.join(timeout=120)
        second.join(timeout=120)
        assert not first.is_alive() and not second.is_alive()
        after = job_store.get_job_any(store.engine, job.id)
    finally:
        forget(settings)
    assert outcomes[1] == {"job_id": job.id, "status": "superseded", "run": 1}, outcomes
    assert after.status == "completed" and after.attempt == 2, (after.status, outcomes)
    assert after.credits_refunded == 0 and after.processed_emails == 40


def test_a_run_frozen_while_writing_its_files_cannot_replace_the_later_runs(
    testbed_factory, testbed_settings, tmp_path, monkeypatch
):
    """Run 1 has checked that the job is still its own and starts writing its files; it
    freezes there, recovery resumes the job as run 2, and run 2 completes it with its own
    results. When run 1 wakes and finishes writing, run 2's files must still be the job's:
    run 1's are staged under names of its own and never put in place, and removed."""
    _tb, settings, store, job = _slow_job(
        testbed_factory, testbed_settings, tmp_path, "frozen.test", 0.0, stale=120
    )
    directory = job_dir(settings.data_dir, job.id)
    real_write = job_files.write_job_results

    def frozen_while_writing(*args, **kwargs):
        _completed_by_run_2(store, job, directory)  # (what happened while run 1 was frozen)
        return real_write(*args, **kwargs)

    monkeypatch.setattr(job_files, "write_job_results", frozen_while_writing)
    try:
        with using_settings(settings):
            outcome = asyncio.run(bulk_verify(job_id=job.id))
        after = job_store.get_job_any(store.engine, job.id)
    finally:
        forget(settings)
    assert outcome == {"job_id": job.id, "status": "superseded", "run": 1}
    assert after.status == "completed" and after.attempt == 2
    assert (directory / "results.csv").read_text() == "run 2's results\n"
    assert not (directory / "results.parquet").exists()
    assert not list(directory.glob(".run-*"))  # run 1's staged files are gone


@pytest.mark.parametrize(
    "meanwhile", [_completed_by_run_2, _run_2_started, _run_2_not_at_its_parts_yet]
)
def test_a_run_that_wakes_after_a_later_run_took_over_writes_nothing(
    testbed_factory, testbed_settings, tmp_path, meanwhile
):
    """Run 1 is frozen (no beat reaches the database, job_stale_after is long here so its
    own beats do not come) while recovery resumes the job as run 2; then it wakes and
    finishes its list. Whatever run 2 did meanwhile — completed the job, started its own
    parts, not got that far — run 1 writes no results or history over run 2's, and neither
    completes nor fails the job: it stops (or crashes) and leaves the job to run 2."""
    slow = "mx.sloth.test"  # (no beat of its own comes during the test:)
    tb, settings, store, job = _slow_job(
        testbed_factory, testbed_settings, tmp_path, "sloth.test", 0.05, stale=120
    )
    directory = job_dir(settings.data_dir, job.id)
    ended: dict = {}

    def run_one() -> None:
        try:
            with using_settings(settings):
                ended["outcome"] = asyncio.run(bulk_verify(job_id=job.id))
        except Exception as exc:
            ended["error"] = exc

    first = threading.Thread(target=run_one)
    try:
        first.start()
        assert tb.wait_until(lambda t: t.host_stats(slow).active >= 1)
        meanwhile(store, job, directory)
        first.join(timeout=120)
        assert not first.is_alive()
        after = job_store.get_job_any(store.engine, job.id)
    finally:
        forget(settings)
    assert len(tb.host_stats(slow).rcpts) >= 40  # it did wake and finish its list
    if meanwhile is _run_2_started:  # its own parts were cleared: it crashed writing them
        assert "error" in ended, ended
        assert not any((directory / bulk_io.RESULT_PARTS / "run-2").iterdir())  # none in 2's
    else:
        assert ended == {"outcome": {"job_id": job.id, "status": "superseded", "run": 1}}
    assert after is not None and after.attempt == 2 and after.failed_reason is None
    if meanwhile is _completed_by_run_2:
        assert after.status == "completed"
        assert (directory / "results.csv").read_text() == "run 2's results\n"
    else:
        assert (after.status, after.processed_emails, after.credits_refunded) == (
            "processing",
            0,
            0,
        )
        assert not (directory / "results.csv").exists()
    assert not (directory / "results.parquet").exists()
    assert not (settings.data_dir / "history").exists()


def test_a_big_host_group_is_cut_into_pieces_that_keep_their_domains_facts():
    """split_groups cuts a group of more than `limit` recipients in order; a domain across
    pieces keeps its DNS facts and catch-all answer until its last piece is settled."""
    big = HostGroup(
        hosts=(), domains={"a.test": ["1", "2", "3", "4"], "b.test": ["5", "6"], "c.test": []}
    )
    small = HostGroup(hosts=(), domains={"d.test": ["7"]})
    prepared = Prepared(
        parsed={}, facts={}, groups=[big, small], decided={}, started=0.0, stats=EngineStats()
    )
    prepared.split_groups(2)
    assert [g.domains for g in prepared.groups] == [
        {"a.test": ["1", "2"]},
        {"a.test": ["3", "4"]},  # full: b.test starts the next piece, not an empty entry
        {"b.test": ["5", "6"], "c.test": []},
        {"d.test": ["7"]},
    ]
    assert all(g.probe_catch_all for g in prepared.groups)
    prepared.facts.update({"a.test": "facts of a", "b.test": "facts of b"})  # type: ignore[dict-item]
    prepared.catch_all["a.test"] = False
    prepared.forget([], prepared.groups[0])
    assert prepared.facts["a.test"] == "facts of a" and "a.test" in prepared.catch_all
    prepared.forget([], prepared.groups[1])
    assert "a.test" not in prepared.facts and prepared.facts["b.test"] == "facts of b"
    prepared.forget([], prepared.groups[2])
    assert prepared.facts == {} and prepared.catch_all == {}


def test_a_list_on_one_big_domain_shows_progress_piece_by_piece(
    testbed_factory, testbed_settings, tmp_path, monkeypatch
):
    """40 addresses on one slow host, verified in pieces of 10: the job's processed count
    moves while it runs (not only at the end), every piece probes the domain for catch-all,
    and the results are those of one piece."""
    monkeypatch.setattr(pipeline, "PIECE_ADDRESSES", 10)
    monkeypatch.setattr(verify_tasks, "MIN_CHUNK_ADDRESSES", 5)
    tb, settings, store, job = _slow_job(
        testbed_factory, testbed_settings, tmp_path, "bigco.test", 0.02, stale=120
    )
    seen: list[int] = []
    outcome: dict = {}

    def run() -> None:
        with using_settings(settings):
            outcome.update(asyncio.run(bulk_verify(job_id=job.id)))

    worker = threading.Thread(target=run)
    try:
        worker.start()
        while worker.is_alive():
            now = job_store.get_job_any(store.engine, job.id)
            if now.status == "processing":
                seen.append(now.processed_emails)
            worker.join(0.02)
        done = job_store.get_job_any(store.engine, job.id)
    finally:
        forget(settings)
    assert outcome["status"] == "completed" and done.status == "completed"
    assert any(0 < n < 40 for n in seen), seen
    assert (done.processed_emails, done.valid_count, done.invalid_count) == (40, 2, 38)
    probes = [r for r in tb.host_stats("mx.bigco.test").rcpts if r.startswith("vm-probe")]
    assert len(probes) == 4


def test_a_run_that_waited_in_the_queue_while_its_job_was_resumed_does_not_start(
    testbed_factory, testbed_settings, tmp_path
):
    """The local runner's one worker is busy; job B waits in its queue. Meanwhile another
    process's reaper takes B for dead and resumes it as run 2. When the queued run 1 of B
    gets the worker it stops at once — no SMTP, no failure, no refund — for its number was
    fixed when it was submitted, not read from B's row when it started (it would have read
    2, and two runs would both have owned the job)."""
    tb, settings, store, busy = _slow_job(
        testbed_factory, testbed_settings, tmp_path, "busy.test", 0.05, stale=120
    )
    settings = settings.model_copy(update={"local_runner_workers": 1})
    account = accounts.create_account(store.engine, settings, plan="enterprise")
    queued = _job_for(settings, store, account, "email\nzed@busy.test\n", reserve=1)
    runner = LocalRunner(settings)
    try:
        runner.submit("bulk", busy.id)
        runner.submit("bulk", queued.id)
        assert take_for_dead(store, queued.id) == 2  # the other process's claim
        runner.wait(120)
        after = job_store.get_job_any(store.engine, queued.id)
    finally:
        runner.shutdown()
        forget(settings)
    assert job_store.get_job_any(store.engine, busy.id).status == "completed"
    assert (after.attempt, after.status, after.failed_reason, after.credits_refunded) == (
        2,
        "pending",
        None,
        0,
    )
    assert "zed@busy.test" not in tb.host_stats("mx.busy.test").rcpts  # B never probed


def test_a_run_for_a_job_its_database_lacks_names_that_database(setup):
    """A worker without the API's VERIMAIL_DATABASE_URL looked in a SQLite file of its own
    and said only "no job 7"."""
    _, settings, store, _ = setup
    with using_settings(settings), pytest.raises(ValueError) as caught:
        asyncio.run(bulk_verify(job_id=987654))
    message = str(caught.value)
    assert message.startswith("no job 987654 in ") and "VERIMAIL_DATABASE_URL" in message
    assert store.engine.url.database in message


def test_a_failed_runs_reference_is_in_its_prefect_run_log(setup):
    """The reference a failed job shows its customer was logged only to the process's own
    output: an operator using the Prefect UI could not find it."""
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.filters import LogFilter, LogFilterFlowRunId

    _, settings, store, account = setup
    job = _job_for(settings, store, account, UPLOAD, reserve=6)
    Path(job.upload_path).unlink()  # the run cannot read its upload: it fails
    with using_settings(settings), pytest.raises(FileNotFoundError):
        asyncio.run(bulk_verify(job_id=job.id))
    failed = job_store.get_job_any(store.engine, job.id)
    reference = failed.failed_reason.split("(reference ")[1].split(")")[0]

    async def logged() -> list[str]:
        flow_run = LogFilter(flow_run_id=LogFilterFlowRunId(any_=[failed.flow_run_id]))
        async with get_client() as client:
            return [entry.message for entry in await client.read_logs(log_filter=flow_run)]

    deadline = time.monotonic() + PATIENCE
    while not any(reference in message for message in asyncio.run(logged())):
        assert time.monotonic() < deadline, "the reference never reached the run's log"
        time.sleep(0.2)


def test_the_local_runner_leaves_a_stopped_run_to_the_reaper_too(setup, monkeypatch):
    """The local runner settles a run that ended without finishing its job; a run stopped
    from outside (here the SystemExit of a broken stdout) is the reaper's to resume."""
    _, settings, store, account = setup
    job = _job_for(settings, store, account, UPLOAD, reserve=6)

    def stopped(*args, **kwargs):
        raise SystemExit(1)

    monkeypatch.setattr(job_files, "read_job_input", stopped)
    _run_locally(settings, job.id)
    left = job_store.get_job_any(store.engine, job.id)
    assert (left.status, left.credits_refunded, left.failed_reason) == ("processing", 0, None)
