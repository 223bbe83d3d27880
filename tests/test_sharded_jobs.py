"""Big jobs cut into shards (issue 37) on the local runner: shards by domain, the same
download, history and charges as one piece, progress as the sum of the shards, deferred
retries after the merge, and a shard whose run died run again alone. (Shards on Prefect
workers: tests/test_deployment_shards.py.)"""

from __future__ import annotations

import asyncio
import io
import shutil
from datetime import timedelta

import polars as pl
import pytest
from api_helpers import (
    STALE_AFTER,
    host_per_domain,
    poll_job,
    poll_until,
    running_app,
    total_balance,
)
from rich.console import Console
from sqlalchemy import update

from verimail.api.dashboard.progress import progress_fields
from verimail.cli.progress import JobProgress
from verimail.config import using_settings
from verimail.engine.smtp.findings import probe_address
from verimail.files.bulk_io import job_dir
from verimail.files.shards import SHARDS_DIR, read_shard_input
from verimail.flows.bulk import bulk_verify
from verimail.jobs import retries
from verimail.jobs.context import forget, store_for
from verimail.jobs.recovery import recover_stale_jobs
from verimail.runners.local import LocalRunner
from verimail.schemas.jobs import BulkJob
from verimail.store import accounts, job_shards, tables
from verimail.store import jobs as job_store
from verimail.store.billing.movements import grant
from verimail.store.db import utcnow
from verimail.store.job_retries import claim_for_resume
from verimail.tasks.shards import pack
from verimail.testbed.world import DomainSpec, HostBehaviour, HostSpec, World

pytestmark = pytest.mark.usefixtures("prefect_harness")


def test_pack_keeps_domains_whole_and_groups_together_where_they_fit():
    sizes = {"a": 4, "b": 3, "c": 2, "d": 2, "big": 9, "e": 1}
    # a+b share mail hosts (a group of 7), c and d another (4); big alone is over the limit.
    shards = pack([["a", "b"], ["c", "d"], ["big"], ["e"]], sizes, limit=8)
    assert sorted(map(sorted, shards)) == [["a", "b"], ["big"], ["c", "d", "e"]]  # (e: emptiest)
    # A group too big for one shard is dealt domain by domain, each domain whole.
    split = pack([["a", "b", "c", "d"]], sizes, limit=5)
    assert sorted(d for shard in split for d in shard) == ["a", "b", "c", "d"]
    assert all(sum(sizes[d] for d in shard) <= 5 for shard in split)
    assert len(split) == 3  # 11 addresses: at least 3 shards of 5


def _world() -> World:
    """Five domains on four servers; ``two.test`` and ``deux.test`` share one server under
    two MX names (``mx.deux.test`` resolves to ``mx.shared.test``'s address)."""
    return World.of(
        [
            HostSpec("mx.acme.test", HostBehaviour(mailboxes={"alice", "bob", "carol"})),
            HostSpec("mx.catchall.test", HostBehaviour(accept_all=True)),
            HostSpec("mx.shared.test", HostBehaviour(mailboxes={"ann", "ben"})),
            HostSpec("mx.beta.test", HostBehaviour(mailboxes={"x1", "x2", "x3"})),
        ],
        [
            DomainSpec("acme.test", mx=[(10, "mx.acme.test")]),
            DomainSpec("catchall.test", mx=[(10, "mx.catchall.test")]),
            DomainSpec("two.test", mx=[(10, "mx.shared.test")]),
            DomainSpec("deux.test", mx=[(10, "mx.deux.test")]),
            DomainSpec("mx.deux.test", a=["mx.shared.test"]),
            DomainSpec("beta.test", mx=[(10, "mx.beta.test")]),
        ],
    )


ROWS = [
    "alice@acme.test",
    "BOB@ACME.TEST",
    "nobody@acme.test",
    "jörg.x@catchall.test",
    "",
    "ann@two.test",
    "zed@two.test",
    "ben@deux.test",
    "alice@acme.test",  # (a duplicate row)
    "x1@beta.test",
    "x2@beta.test",
    "x9@beta.test",
    "not-an-address",
    "someone@nodomain.invalid",
]
UPLOAD = "name,Email\r\n" + "".join(f"row{i},{e}\r\n" for i, e in enumerate(ROWS))
TIME_COLUMNS = ("verification_time_ms",)


def _run_job(settings, store, account) -> job_store.Job:
    upload = settings.data_dir / f"upload-{settings.job_shard_size}.csv"
    upload.write_bytes(UPLOAD.encode("utf-8"))
    rows = sum(1 for e in ROWS if e)
    job = job_store.create_job(
        store.engine, account.id, "bulk_csv", rows, reserve=rows, upload_path=str(upload)
    )
    with using_settings(settings):
        asyncio.run(bulk_verify(job_id=job.id))
    return job_store.get_job_any(store.engine, job.id)


def test_a_sharded_job_answers_as_one_piece(testbed_factory, testbed_settings, tmp_path):
    """The same upload in one piece and in shards of at most 3 addresses: the same results
    file byte for byte, the same Parquet results (but their timings), counts, charges and
    history; the job says how many shards it had, and each domain was in one shard."""
    tb = testbed_factory(_world())
    whole = testbed_settings(tb, tmp_path, job_shard_size=0)
    sharded = whole.model_copy(update={"job_shard_size": 3})
    store = store_for(whole)
    account = accounts.create_account(store.engine, whole, plan="enterprise")
    grant(store.engine, account.id, 100)
    seen: list[list[str]] = []
    real_read = read_shard_input

    def reading(directory, shard):  # (what each shard verifies, as its run reads it)
        frame = real_read(directory, shard)
        seen.append(frame.get_column("normalised").to_list())
        return frame

    import verimail.flows.shard as shard_module

    shard_module.read_shard_input = reading
    try:
        one = _run_job(whole, store, account)
        many = _run_job(sharded, store, account)
    finally:
        shard_module.read_shard_input = real_read
        forget(whole)
        forget(sharded)
    assert one.status == many.status == "completed", (one.failed_reason, many.failed_reason)
    body = BulkJob.of(many)
    assert body.shards_total == len(seen) >= 3 and body.shards_done == body.shards_total
    assert BulkJob.of(one).shards_total is None
    shown = progress_fields(many, BulkJob.of(many).model_dump(mode="json"))["shards_text"]
    assert shown == f"shards {len(seen)} of {len(seen)} done"  # (the dashboard's job page)
    out = io.StringIO()
    JobProgress(Console(file=out, width=60), many.total_emails).update(many, final=True)
    assert f"shards {len(seen)}/{len(seen)}" in out.getvalue().replace("\n", "")  # (the CLI)
    domains = [{a.rpartition("@")[2] for a in shard} for shard in seen]
    for domain in ("acme.test", "two.test", "beta.test"):
        assert sum(domain in d for d in domains) == 1, (domain, seen)
    assert any({"two.test", "deux.test"} <= d for d in domains), seen  # one mail server
    results = pl.read_parquet(job_dir(whole.data_dir, one.id) / "results.parquet")
    addresses = set(results.get_column("normalised").drop_nulls())
    assert sorted(a for shard in seen for a in shard) == sorted(addresses)  # each once
    for column in (*job_store.COUNT_COLUMNS, "processed_emails", "credits_used"):
        assert getattr(one, column) == getattr(many, column), column
    assert (many.credits_reserved, many.credits_refunded) == (one.credits_reserved, 0)
    files = [job_dir(whole.data_dir, j.id) for j in (one, many)]
    assert (files[0] / "results.csv").read_bytes() == (files[1] / "results.csv").read_bytes()
    frames = [pl.read_parquet(f / "results.parquet").drop(TIME_COLUMNS) for f in files]
    assert frames[0].equals(frames[1])
    assert not (files[1] / SHARDS_DIR).exists()  # (the shards' files go once merged)
    history = sorted(p.name for p in (whole.data_dir / "history").rglob("*.parquet"))
    assert history == sorted([f"bulk-{one.id}.parquet", f"bulk-{many.id}.parquet"])
    rcpts = tb.host_stats("mx.acme.test").rcpts
    assert rcpts.count("alice@acme.test") == 2  # once per job, whatever its duplicates
    probe = probe_address("acme.test", whole.smtp_mail_from)
    assert rcpts.count(probe) == 2  # the catch-all probe: once per job, shards or not


GREY_EMAILS = [
    "alice@ok.test",
    "nobody@ok.test",
    "alice@grey.test",
    "bob@grey.test",
    "nobody@grey.test",
    "alice@grey.test",
]


async def test_the_merge_parks_what_the_shards_were_put_off_by(
    testbed_factory, testbed_settings, tmp_path
):
    """Deferred retries of a sharded job: each shard verifies once, with no in-pass
    greylisting retry (``job_greylist_retries``); the merge collects what the servers put
    off and parks the job, and a retry pass of the job settles it (the
    parent collects: one retry pass, not one per shard — docs/deployment.md)."""
    hosts = {
        "ok.test": HostBehaviour(mailboxes={"alice"}),
        "grey.test": HostBehaviour(mailboxes={"alice", "bob"}, greylist_delay=1.5),
    }
    tb = testbed_factory(host_per_domain(hosts))
    settings = testbed_settings(
        tb,
        tmp_path,
        smtp_greylist_retries=3,  # (a single's; a job pass a deferred one follows waits none)
        job_retry_delay=2.0,
        job_retry_passes=2,
        job_retry_max_wait=10.0,
        job_stale_after=STALE_AFTER,
        job_shard_size=2,
    )
    async with running_app(settings) as app:
        customer = app.customer(credits=100)
        created = await app.client.post(
            "/api/verify/bulk", json={"emails": GREY_EMAILS}, headers=customer.headers
        )
        url = f"/api/verify/bulk/{created.json()['job_id']}"
        waiting = await poll_until(
            app.client, url, customer.headers, lambda b: b.get("phase") == "waiting_to_retry"
        )
        assert waiting["shards_total"] == waiting["shards_done"] == 2
        assert waiting["retry_waiting"] == 3
        done = await poll_job(app.client, url, customer.headers)
        assert done["status"] == "completed", done
        got = {r["email"]: r["status"] for r in done["results"]}
        assert got == {
            "alice@ok.test": "valid",
            "nobody@ok.test": "invalid",
            "alice@grey.test": "valid",
            "bob@grey.test": "valid",
            "nobody@grey.test": "invalid",
        }
        assert (done["valid_count"], done["invalid_count"], done["unknown_count"]) == (4, 2, 0)
        assert total_balance(app.store, customer.account_id) == 94
        rcpts = tb.host_stats("mx.grey.test").rcpts
        assert rcpts.count("alice@grey.test") == 2 and rcpts.count("bob@grey.test") == 2


def test_a_second_merge_of_a_sharded_job_changes_nothing(
    testbed_factory, testbed_settings, tmp_path
):
    """A sharded job's merge can start twice (its own run's, and the one the run of its
    last shard starts when the reaper gave that shard a run of its own): the second finds
    the shards' results gone, or the job parked, and stops. Before, it completed the job
    with no results at all (seen on a busy CI machine)."""
    hosts = {
        "ok.test": HostBehaviour(mailboxes={"alice"}),
        "grey.test": HostBehaviour(mailboxes={"alice", "bob"}, greylist_delay=60),
    }
    tb = testbed_factory(host_per_domain(hosts))
    settings = testbed_settings(
        tb, tmp_path, smtp_greylist_retries=0, job_retry_delay=60.0, job_shard_size=2
    )
    store = store_for(settings)
    account = accounts.create_account(store.engine, settings, plan="enterprise")
    grant(store.engine, account.id, 100)
    upload = tmp_path / "grey.csv"
    upload.write_text("email\n" + "\n".join(GREY_EMAILS) + "\n")
    rows = len(GREY_EMAILS)
    job = job_store.create_job(
        store.engine, account.id, "bulk_csv", rows, reserve=rows, upload_path=str(upload)
    )
    directory = job_dir(settings.data_dir, job.id)
    import verimail.flows.bulk as bulk_module

    real_merge = bulk_module.merged_results

    def dying(*args: object) -> None:
        raise SystemExit("the process went away before the merge")

    bulk_module.merged_results = dying  # (every shard verified, nothing merged yet)
    try:
        with using_settings(settings), pytest.raises(SystemExit):
            asyncio.run(bulk_verify(job_id=job.id))
    finally:
        bulk_module.merged_results = real_merge
    assert all(s.status == "done" for s in job_shards.shards_of(store.engine, job.id))
    kept = tmp_path / "kept-shards"
    shutil.copytree(directory / SHARDS_DIR, kept)
    shutil.rmtree(directory / SHARDS_DIR)  # (as a merge that went first leaves them)
    try:
        with using_settings(settings):
            late = asyncio.run(bulk_verify(job_id=job.id, attempt=1))
            assert late["status"] == "superseded"
            assert job_store.get_job_any(store.engine, job.id).status == "processing"
            assert not (directory / "results.parquet").exists()

            shutil.copytree(kept, directory / SHARDS_DIR)
            first = asyncio.run(bulk_verify(job_id=job.id, attempt=1))
            assert (first["status"], first["retry_waiting"]) == ("waiting_to_retry", 3)
            parked = job_store.get_job_any(store.engine, job.id)
            state = retries.state_path(directory).read_bytes()

            second = asyncio.run(bulk_verify(job_id=job.id, attempt=1))
            assert second["status"] == "superseded"
    finally:
        forget(settings)
    again = job_store.get_job_any(store.engine, job.id)
    assert (again.status, again.retry, again.heartbeat_at) == (
        "processing",
        parked.retry,
        parked.heartbeat_at,
    )
    assert retries.state_path(directory).read_bytes() == state
    assert not (directory / "results.parquet").exists()


def test_shards_being_handed_to_the_pool_are_not_taken_for_dead(testbed_settings, tmp_path, tb):
    """While the job's run beats, its shards not handed to a run yet are its own (each
    hand-over is a Prefect call, slow on a busy server: they were "resumed" while the run
    was still handing them out, and the runs it handed over were superseded one by one);
    once that run is quiet, they are the reaper's. A flow run handed over for an earlier
    run of a shard, or of the job, never replaces the flow run of its later one."""
    settings = testbed_settings(tb, tmp_path)
    store = store_for(settings)
    account = accounts.create_account(store.engine, settings, plan="enterprise")
    job = job_store.create_job(store.engine, account.id, "bulk_json", 4, reserve=4)
    job_store.mark_processing(store.engine, job.id)
    assert job_shards.create_shards(store.engine, job.id, 1, [(2, 2), (2, 2)])
    later = utcnow() + timedelta(seconds=10)  # (the shards' last beat: 10 s ago by then)
    with store.engine.begin() as conn:
        conn.execute(
            update(tables.jobs).where(tables.jobs.c.id == job.id).values(heartbeat_at=later)
        )
    quiet = timedelta(seconds=5)
    assert job_shards.stale_shards(store.engine, quiet, now=later) == []
    job_shards.set_flow_run(store.engine, job.id, 0, "run-of-shard-0", 1)
    handed = job_shards.stale_shards(store.engine, quiet, now=later)
    assert [s.shard for s in handed] == [0]  # (its run's heartbeat is its own now)
    job_quiet = later + timedelta(seconds=10)
    assert [s.shard for s in job_shards.stale_shards(store.engine, quiet, now=job_quiet)] == [0, 1]

    assert job_shards.assign(store.engine, job.id, 1) == 2
    job_shards.set_flow_run(store.engine, job.id, 1, "run-for-attempt-1", 1)  # (too late)
    assert job_shards.shards_of(store.engine, job.id)[1].flow_run_id is None
    job_shards.set_flow_run(store.engine, job.id, 1, "run-for-attempt-2", 2)
    assert job_shards.shards_of(store.engine, job.id)[1].flow_run_id == "run-for-attempt-2"

    # The same for the job: its merge handed to the pool after the reaper resumed the job.
    seen = job_store.get_job_any(store.engine, job.id).heartbeat_at
    assert claim_for_resume(store.engine, job.id, seen) == 2
    assert job_store.set_flow_run_id(store.engine, job.id, "resumed-run", attempt=2)
    assert not job_store.set_flow_run_id(store.engine, job.id, "late-merge", attempt=1)
    assert job_store.get_job_any(store.engine, job.id).flow_run_id == "resumed-run"
    forget(settings)


def _slow_world() -> World:
    """Three domains, each on its own host; ``slow.test`` answers after 0.1 s."""
    return World.of(
        [
            HostSpec("mx.quick.test", HostBehaviour(mailboxes={"a0", "a1"})),
            HostSpec("mx.other.test", HostBehaviour(mailboxes={"b0"})),
            HostSpec("mx.slow.test", HostBehaviour(mailboxes={"s0", "s2"}, reply_delay=0.1)),
        ],
        [
            DomainSpec("quick.test", mx=[(10, "mx.quick.test")]),
            DomainSpec("other.test", mx=[(10, "mx.other.test")]),
            DomainSpec("slow.test", mx=[(10, "mx.slow.test")]),
        ],
    )


def test_a_shard_whose_run_died_is_run_again_alone(testbed_factory, testbed_settings, tmp_path):
    """A job's process died while one of its shards ran (its run number 1 still says
    running, its heartbeat old) after it had saved part of its results; the other shards
    are done. The reaper gives that shard a second run, on its own: it verifies only what
    was not saved, the other shards are not touched, and the last shard's run has the job
    merged and completed — charged once."""
    tb = testbed_factory(_slow_world())
    settings = testbed_settings(tb, tmp_path, job_shard_size=4, job_stale_after=2.0)
    store = store_for(settings)
    account = accounts.create_account(store.engine, settings, plan="enterprise")
    grant(store.engine, account.id, 100)
    emails = ["a0@quick.test", "a1@quick.test", "b0@other.test", "b1@other.test"]
    emails += [f"s{i}@slow.test" for i in range(4)]
    upload = tmp_path / "list.csv"
    upload.write_text("email\n" + "\n".join(emails) + "\n")
    job = job_store.create_job(
        store.engine, account.id, "bulk_csv", 8, reserve=8, upload_path=str(upload)
    )
    # The job's run made its shards and verified all but the slow one (and two of its four
    # addresses, saved), then died: run the job with the slow shard's run stopped there.
    import verimail.flows.shard as shard_module

    real_verify = shard_module.verify_pass

    async def dying(addresses, *, what, **kwargs):
        slow = [a for a in addresses if a.endswith("@slow.test")]
        if not slow:
            async for batch in real_verify(addresses, what=what, **kwargs):
                yield batch
            return
        async for batch in real_verify(slow[:2], what=what, **kwargs):
            yield batch
        while True:  # (it dies once the other shard is done)
            shards = await asyncio.to_thread(job_shards.shards_of, store.engine, job.id)
            if sum(s.status == "done" for s in shards) == len(shards) - 1:
                raise SystemExit("the worker went away")  # (its process ended here)
            await asyncio.sleep(0.05)

    shard_module.verify_pass = dying
    try:
        with using_settings(settings), pytest.raises(SystemExit):
            asyncio.run(bulk_verify(job_id=job.id))
    finally:
        shard_module.verify_pass = real_verify
    shards = job_shards.shards_of(store.engine, job.id)
    slow = next(s for s in shards if s.status != "done")
    assert [s.status for s in shards].count("done") == len(shards) - 1
    assert slow.status == "running" and slow.attempt == 1
    with store.engine.begin() as conn:  # (its last beat, long ago)
        conn.execute(
            update(tables.job_shards)
            .where(tables.job_shards.c.job_id == job.id)
            .values(heartbeat_at=utcnow().replace(year=2000))
        )

    class StillHolding:
        """A process whose run of the job is alive (the local runner runs the job's shards
        inside that run): its shards are its own however long since their last beat."""

        def held_jobs(self) -> list[int]:
            return [job.id]

        def submit_shard(self, *args: object) -> None:
            raise AssertionError("a shard of a job its runner still holds was run again")

    assert recover_stale_jobs(settings, StillHolding()) == []
    beaten = [s for s in job_shards.shards_of(store.engine, job.id) if s.status != "done"]
    assert beaten and all(s.heartbeat_at.year > 2000 for s in beaten)
    with store.engine.begin() as conn:  # (the job's run is gone after all: its shards long quiet)
        conn.execute(
            update(tables.job_shards)
            .where(tables.job_shards.c.job_id == job.id)
            .values(heartbeat_at=utcnow().replace(year=2000))
        )
    rcpts_before = tb.host_stats("mx.slow.test").rcpts
    quick_before = tb.host_stats("mx.quick.test").rcpt_to
    runner = LocalRunner(settings)
    try:
        handled = recover_stale_jobs(settings, runner)
        assert handled == [(job.id, f"shard {slow.shard} resumed")]
        runner.wait(timeout=120)  # the shard's run, then the merge it starts
        runner.wait(timeout=120)
    finally:
        runner.shutdown()
        forget(settings)
    done = job_store.get_job_any(store.engine, job.id)
    assert done.status == "completed", done.failed_reason
    assert (done.valid_count, done.invalid_count, done.processed_emails) == (5, 3, 8)
    assert (done.credits_used, done.credits_refunded) == (8, 0)
    again = tb.host_stats("mx.slow.test").rcpts[len(rcpts_before) :]
    asked = sorted(a for a in again if not a.startswith("vm-probe-"))  # (+ its catch-all probe)
    assert asked == ["s2@slow.test", "s3@slow.test"]  # only what was not saved
    assert tb.host_stats("mx.quick.test").rcpt_to == quick_before  # the others untouched
    after = {s.shard: s.attempt for s in job_shards.shards_of(store.engine, job.id)}
    assert after[slow.shard] == 2 and all(a == 1 for n, a in after.items() if n != slow.shard)
    assert job_store.get_job_any(store.engine, job.id).options["shards"]["done"] == len(shards)
