"""Re-verification and the DuckDB history, against a testbed world that changes."""

from __future__ import annotations

import asyncio

import polars as pl
import pytest

from verimail.config import using_settings
from verimail.files.history import history_dir, query
from verimail.flows.bulk import bulk_verify
from verimail.flows.reverify import reverify_stored
from verimail.jobs.context import forget, store_for
from verimail.store import accounts
from verimail.store import jobs as job_store
from verimail.testbed.world import DomainSpec, HostBehaviour, HostSpec, World

pytestmark = pytest.mark.usefixtures("prefect_harness")


def _world(mailboxes: set[str]) -> World:
    return World.of(
        [HostSpec("mx.acme.test", HostBehaviour(mailboxes=mailboxes))],
        [DomainSpec("acme.test", mx=[(10, "mx.acme.test")])],
    )


def test_reverify_reports_what_changed(testbed_factory, testbed_settings, tmp_path):
    tb = testbed_factory(_world({"alice", "bob"}))
    settings = testbed_settings(tb, tmp_path)
    store = store_for(settings)
    try:
        account = accounts.create_account(store.engine, settings, plan="enterprise")
        upload = tmp_path / "list.csv"
        upload.write_text("email\nalice@acme.test\nbob@acme.test\ncarl@acme.test\n")
        job = job_store.create_job(
            store.engine, account.id, "bulk_csv", 3, reserve=3, upload_path=str(upload)
        )
        with using_settings(settings):
            asyncio.run(bulk_verify(job_id=job.id))
            # Bob leaves the company; Carl joins.
            tb.replace_world(_world({"alice", "carl"}))
            summary = asyncio.run(reverify_stored(job_id=job.id))
        assert summary["addresses"] == 3
        assert summary["transitions"] == {"valid->invalid": 1, "invalid->valid": 1}
        report = pl.read_csv(summary["report"])
        assert sorted(report.get_column("email").to_list()) == ["bob@acme.test", "carl@acme.test"]
        bob = report.filter(pl.col("email") == "bob@acme.test").row(0, named=True)
        assert (bob["previous_status"], bob["status"]) == ("valid", "invalid")
        # The history answers "latest status per address" and "what changed".
        latest = query(settings.data_dir, "SELECT email, status FROM latest ORDER BY email")
        assert latest.rows() == [
            ("alice@acme.test", "valid"),
            ("bob@acme.test", "invalid"),
            ("carl@acme.test", "valid"),
        ]
        changes = query(settings.data_dir, "SELECT email FROM changes ORDER BY email")
        assert changes.get_column("email").to_list() == ["bob@acme.test", "carl@acme.test"]
        assert query(settings.data_dir, "SELECT count(*) AS n FROM history").item() == 6
        # The bulk run's file and the re-verification's share one schema, though every
        # suggestion in this world is null (no column of nulls of its own type).
        files = sorted(history_dir(settings.data_dir).glob("date=*/*.parquet"))
        schemas = {f.name.split("-")[0]: pl.read_parquet_schema(f) for f in files}
        assert set(schemas) == {"bulk", "reverify"}
        assert schemas["reverify"] == schemas["bulk"]
        assert schemas["reverify"]["did_you_mean"] == pl.String
    finally:
        forget(settings)


def test_history_is_empty_but_queryable(tmp_path):
    assert query(tmp_path, "SELECT count(*) FROM latest").item() == 0
    assert query(tmp_path, "SELECT count(*) FROM changes").item() == 0


def test_reverify_sees_changes_of_an_address_on_an_idn_domain(
    testbed_factory, testbed_settings, tmp_path
):
    """The history keys bob@bücher.test as its result spells it (bob@xn--bcher-kva.test):
    his previous status is found under that, so his change is reported like anyone's."""

    def world(mailboxes: set[str]) -> World:
        return World.of(
            [HostSpec("mx.acme.test", HostBehaviour(mailboxes=mailboxes))],
            [
                DomainSpec("acme.test", mx=[(10, "mx.acme.test")]),
                DomainSpec("xn--bcher-kva.test", mx=[(10, "mx.acme.test")]),
            ],
        )

    tb = testbed_factory(world({"bob"}))
    settings = testbed_settings(tb, tmp_path)
    store = store_for(settings)
    try:
        account = accounts.create_account(store.engine, settings, plan="enterprise")
        upload = tmp_path / "list.csv"
        upload.write_text("email\nbob@acme.test\nbob@bücher.test\n", encoding="utf-8")
        job = job_store.create_job(
            store.engine, account.id, "bulk_csv", 2, reserve=2, upload_path=str(upload)
        )
        with using_settings(settings):
            asyncio.run(bulk_verify(job_id=job.id))
            tb.replace_world(world(set()))  # bob leaves
            summary = asyncio.run(reverify_stored(job_id=job.id))
        assert summary["transitions"] == {"valid->invalid": 2}
        report = pl.read_csv(summary["report"])
        assert sorted(report.get_column("email").to_list()) == [
            "bob@acme.test",
            "bob@bücher.test",
        ]
    finally:
        forget(settings)


def test_a_jobs_results_are_in_the_history_once_however_often_they_are_written(tmp_path):
    """A run resumed after dying between writing the history and marking its job completed,
    or a run taken for dead that wakes after its successor, wrote the job's results again:
    every address twice. A bulk job's results are one file, which a later write replaces
    (even from another day's partition); re-verifications still add rows each time."""
    from datetime import UTC, datetime, timedelta

    from verimail.files.bulk_io import append_history

    results = _full(
        pl.DataFrame({"verified_email": ["a@x.test", "b@x.test"], "status": ["valid", "invalid"]})
    )
    day = datetime(2026, 11, 23, 23, 59, tzinfo=UTC)
    for minutes in (0, 2, 3):  # the later writes past midnight: another partition
        when = day + timedelta(minutes=minutes)
        bulk = {"job_id": 7, "account_id": 1, "source": "bulk", "once_per_job": True}
        append_history(tmp_path, results, now=when, **bulk)
    append_history(tmp_path, results, job_id=7, account_id=None, source="reverify")
    files = sorted(p.name for p in history_dir(tmp_path).rglob("*.parquet"))
    assert files[0] == "bulk-7.parquet" and len(files) == 2, files
    count = "SELECT source, count(*) AS n FROM history GROUP BY source ORDER BY source"
    assert query(tmp_path, count).rows() == [("bulk", 2), ("reverify", 2)]


def _full(results: pl.DataFrame) -> pl.DataFrame:
    """``results`` with every other result column, as results_frame makes them."""
    from verimail.files.bulk_io import RESULT_SCHEMA

    return pl.concat([RESULT_SCHEMA.to_frame(), results], how="diagonal_relaxed").with_columns(
        normalised=pl.col("verified_email")
    )


def test_history_is_read_under_a_data_dir_whose_path_looks_like_a_glob(tmp_path):
    """``/srv/verimail[prod]`` is a glob to DuckDB (it matched nothing: every query and the
    weekly re-verification failed); the history files are listed, not globbed."""
    from verimail.files.bulk_io import append_history

    data_dir = tmp_path / "verimail[prod]*"
    results = _full(pl.DataFrame({"verified_email": ["a@x.test"], "status": ["valid"]}))
    append_history(data_dir, results, job_id=1, account_id=1, source="bulk")
    assert query(data_dir, "SELECT email, status FROM latest").rows() == [("a@x.test", "valid")]


def test_history_query_prints_any_result(tmp_path):
    """`verimail history query` prints what DuckDB answers, also results a frame cannot
    hold (an INTERVAL, two columns of one name); a SQL error is a usage error."""
    import subprocess

    from api_helpers import clean_env
    from cli_helpers import folded, run_verimail

    from verimail.files.bulk_io import append_history

    results = _full(pl.DataFrame({"verified_email": ["a@x.test"], "status": ["valid"]}))
    append_history(tmp_path, results, job_id=1, account_id=1, source="bulk")
    env = clean_env({"VERIMAIL_DATA_DIR": str(tmp_path)})

    def run(sql: str, *more: str) -> subprocess.CompletedProcess[str]:
        return run_verimail(["history", "query", sql, *more], env)

    for sql in ("SELECT email, now() - verified_at AS age FROM latest", "SELECT 1 AS a, 2 AS a"):
        out = run(sql)
        assert out.returncode == 0 and "Traceback" not in out.stderr, out.stderr
    assert "a@x.test" in run("SELECT email, now() - verified_at AS age FROM latest").stdout
    many = run("SELECT * FROM range(10)", "--limit", "3")
    assert many.returncode == 0 and "more rows" in folded(many.stderr)
    assert [line for line in many.stdout.splitlines() if line.strip("│ ").isdigit()] != []
    bad = run("SELECT nope FROM latest")
    assert bad.returncode == 2 and "Traceback" not in bad.stderr


def test_reverifying_a_finder_job_is_refused_with_the_flows_reason(
    testbed_factory, testbed_settings, tmp_path
):
    """A completed finder job has no verification results to re-verify: the flow says so
    (before, it passed the check and failed with FileNotFoundError on results.parquet)."""
    tb = testbed_factory(_world({"alice"}))
    settings = testbed_settings(tb, tmp_path)
    store = store_for(settings)
    try:
        account = accounts.create_account(store.engine, settings, plan="enterprise")
        job = job_store.create_job(store.engine, account.id, "finder_csv", 1, reserve=0)
        assert job_store.mark_processing(store.engine, job.id)
        assert job_store.mark_completed(store.engine, job.id, {}, str(tmp_path / "r.csv"), 0)
        with using_settings(settings), pytest.raises(ValueError, match="verification job"):
            asyncio.run(reverify_stored(job_id=job.id))
    finally:
        forget(settings)
