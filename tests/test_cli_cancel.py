"""Issue 36 point 1: `verimail bulk` held by one address on a server answering 421. The
command says at the start how long retries may take, `--no-retry-unknowns` ends after one
pass, and Ctrl-C keeps what was verified: the job recorded as cancelled, the rest refunded,
the settled rows in a partial CSV and the history, exit 130. The installed command in a
subprocess, against the testbed, on the session's Prefect."""

from __future__ import annotations

import csv
import re
import signal
import subprocess

import httpx
import pytest
from api_helpers import clean_env, env_for_testbed
from cli_helpers import VERIMAIL_BIN, WIDTH_ENV, folded, run_verimail

from verimail.config import Settings
from verimail.store import jobs as job_store
from verimail.store.billing.ledger import ledger
from verimail.store.db import init_store
from verimail.testbed.world import DomainSpec, HostBehaviour, HostSpec, World

pytestmark = pytest.mark.usefixtures("prefect_harness")

LIST = (
    "Name,Email\n"
    "Alice,alice@acme.test\n"
    "Nobody,nobody@acme.test\n"
    "Busy,someone@busy.test\n"  # a server that answers 421 to every connection
)


def _world() -> World:
    return World.of(
        [
            HostSpec("mx.acme.test", HostBehaviour(mailboxes={"alice"})),
            HostSpec("mx.busy.test", HostBehaviour(greeting_421=True)),
        ],
        [
            DomainSpec("acme.test", mx=[(10, "mx.acme.test")]),
            DomainSpec("busy.test", mx=[(10, "mx.busy.test")]),
        ],
    )


def _env(tb, tmp_path) -> dict[str, str]:  # type: ignore[no-untyped-def]
    from prefect.settings import PREFECT_API_URL

    return clean_env(
        {
            **env_for_testbed(tb),
            "VERIMAIL_DATA_DIR": str(tmp_path / "data"),
            "VERIMAIL_PREFECT_WARM_UP": "false",
            "PREFECT_API_URL": str(PREFECT_API_URL.value()),
            # The production pace: a deferred pass after 15 min, then 30 (45 in all).
            "VERIMAIL_JOB_RETRY_DELAY": "900",
            "VERIMAIL_JOB_RETRY_MAX_WAIT": "2700",
            "VERIMAIL_SMTP_GREYLIST_RETRIES": "0",
        }
    )


def _ctrl_c_once_parked(args: list[str], env: dict[str, str]) -> tuple[int, str, str]:
    """Run ``verimail *args``, send SIGINT once its progress shows the job waiting for a
    retry pass (read from its output, no sleeps); (exit status, output before, all)."""
    process = subprocess.Popen(
        [str(VERIMAIL_BIN), *args],
        env={**env, **WIDTH_ENV},
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        lines = []
        assert process.stderr is not None
        for line in process.stderr:  # (plain progress lines: stderr is no terminal here)
            lines.append(line)
            if "waiting to retry 1 put off" in line:
                break
        else:
            raise AssertionError("".join(lines))
        process.send_signal(signal.SIGINT)
        _, rest = process.communicate(timeout=120)
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()
    before = folded("".join(lines))
    return process.returncode, before, folded("".join(lines) + rest)


def test_no_retry_unknowns_ends_after_one_pass_and_says_so(testbed_factory, tmp_path):
    env = _env(testbed_factory(_world()), tmp_path)
    env.pop("PREFECT_LOGGING_LEVEL", None)  # (as a user runs it: the command's own quiet)
    people = tmp_path / "list.csv"
    people.write_text(LIST)
    done = run_verimail(["bulk", str(people), "--no-retry-unknowns"], env, timeout=180)
    assert done.returncode == 0, done.stderr
    assert "retries: off" in folded(done.stderr)
    assert "| INFO" not in done.stderr  # (Prefect's INFO lines stay off the terminal...)
    with open(tmp_path / "list.results.csv", newline="") as fh:
        rows = list(csv.reader(fh))
    assert [row[-1] for row in rows] == ["Safe to Send", "Yes", "No", "No"]
    # ...but reach the run's Logs tab (issue 36.2: it was empty).
    job_id = re.search(r"^job (\d+):", done.stderr, re.MULTILINE).group(1)  # type: ignore[union-attr]
    newest = {"limit": 200, "sort": "TIMESTAMP_DESC"}
    logs = httpx.post(f"{env['PREFECT_API_URL']}/logs/filter", json=newest).json()
    messages = [entry["message"] for entry in logs]
    assert f"job {job_id}: 3 address rows, 3 unique" in messages, messages
    assert any(m.startswith(f"job {job_id} completed: valid 1") for m in messages), messages


def test_ctrl_c_keeps_the_settled_rows_refunds_the_rest_and_exits_130(testbed_factory, tmp_path):
    env = _env(testbed_factory(_world()), tmp_path)
    people = tmp_path / "list.csv"
    people.write_text(LIST)
    out = tmp_path / "out.csv"
    code, start, said = _ctrl_c_once_parked(["bulk", str(people), "--out", str(out)], env)
    assert "up to 2 later pass(es), which may add up to 45 min" in start, start
    assert "--no-retry-unknowns" in start and "greylisted" not in start
    assert code == 130, said
    partial = tmp_path / "out.partial.csv"
    assert f"partial results (2 rows): {partial}" in said, said
    assert "cancelled after 2 of 3 rows" in said and not out.exists()
    with open(partial, newline="") as fh:
        rows = list(csv.reader(fh))
    assert [row[:3] for row in rows] == [
        ["Name", "Email", "Safe to Send"],
        ["Alice", "alice@acme.test", "Yes"],
        ["Nobody", "nobody@acme.test", "No"],
    ]

    store = init_store(Settings(data_dir=tmp_path / "data"))
    try:
        job = job_store.get_job_any(store.engine, 1)
        assert job is not None and job.status == "failed"
        assert job.failed_reason == "cancelled by its owner after 2 of 3 rows"
        assert (job.credits_reserved, job.credits_used, job.credits_refunded) == (3, 2, 1)
        refunds = [e.delta for e in ledger(store.engine, job.account_id) if e.kind == "refund"]
        assert refunds == [1], ledger(store.engine, job.account_id)
    finally:
        store.close()
    history = run_verimail(
        ["history", "query", "SELECT email, status FROM latest ORDER BY email"], env
    )
    assert history.returncode == 0, history.stderr
    assert "alice@acme.test" in history.stdout and "nobody@acme.test" in history.stdout
    assert "busy.test" not in history.stdout


def test_ctrl_c_in_find_file_records_the_job_cancelled_and_exits_130(testbed_factory, tmp_path):
    """`verimail find --file` stopped while it waits on the 421 server: the finder job is
    recorded as cancelled by its owner (a failed finder job refunds its finds), not left
    for the reaper, and the command exits 130."""
    env = _env(testbed_factory(_world()), tmp_path)
    people = tmp_path / "people.csv"
    people.write_text("first_name,last_name,domain\nAlice,Smith,acme.test\nAnn,Lee,busy.test\n")
    code, start, said = _ctrl_c_once_parked(["find", "--file", str(people)], env)
    assert "up to 2 later pass(es)" in start
    assert code == 130, said
    assert "job 1 cancelled after 1 of 2 rows; its finds were refunded" in said, said
    store = init_store(Settings(data_dir=tmp_path / "data"))
    try:
        job = job_store.get_job_any(store.engine, 1)
        assert job is not None and job.status == "failed", job
        assert job.failed_reason == "cancelled by its owner after 1 of 2 rows"
        assert job.credits_used == 0  # (its finds refunded)
    finally:
        store.close()
