"""Issue 36 point 1: `verimail bulk` held by one address on a server answering 421. The
command says at the start how long retries may take, `--no-retry-unknowns` ends after one
pass, and Ctrl-C keeps what was verified: the job recorded as cancelled, the rest refunded,
the settled rows in a partial CSV and the history, exit 130; `verimail find --file` keeps
the rows it looked up in a partial CSV too, charged for the finds in it and no other. The
installed command in a subprocess, against the testbed, on the session's Prefect."""

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
from verimail.store.billing.prices import price
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
    return _ctrl_c_once_shown([*args, "--retry-unknowns"], env, "waiting to retry 1 put off")


def _ctrl_c_once_shown(args: list[str], env: dict[str, str], shown: str) -> tuple[int, str, str]:
    """Run ``verimail *args``, send SIGINT once a line of its output holds ``shown`` (no
    sleeps); (exit status, output before, all)."""
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
            if shown in line:
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
    assert [row[2:4] for row in rows] == [
        ["Safe to Send", "Status"],
        ["Yes", "valid"],
        ["No", "invalid"],
        ["No", "unknown"],
    ]
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


PEOPLE = (
    "first_name,last_name,domain,email,Note\n"  # (an "email" column: finder_* names)
    "Alice,Smith,acme.test,old@acme.test,first\n"
    "Ann,Lee,busy.test,,second\n"
)


def _finder_job(tmp_path) -> tuple[job_store.Job, int]:  # type: ignore[no-untyped-def]
    """Job 1 as the cancellation left it, and the credits its finds still owe the ledger
    (charges less refunds under its rows' references)."""
    store = init_store(Settings(data_dir=tmp_path / "data"))
    try:
        job = job_store.get_job_any(store.engine, 1)
        assert job is not None
        entries = [
            e
            for e in ledger(store.engine, job.account_id)
            if (e.reference or "").startswith("job:1:row:")
        ]
        return job, -sum(e.delta for e in entries)
    finally:
        store.close()


def _find_price() -> int:
    return price("find", 1, Settings())


def _rows(path) -> list[list[str]]:  # type: ignore[no-untyped-def]
    with open(path, newline="") as fh:
        return list(csv.reader(fh))


def test_ctrl_c_in_find_file_keeps_the_rows_looked_up_and_charges_their_finds(
    testbed_factory, tmp_path
):
    """`verimail find --file` stopped while it waits on the 421 server: the row looked up
    goes to the partial CSV (the upload's columns, then the finder's), the row parked for a
    retry pass does not; the job is recorded as cancelled by its owner, charged for the
    find it handed over and nothing else, and the command exits 130."""
    env = _env(testbed_factory(_world()), tmp_path)
    people = tmp_path / "people.csv"
    people.write_text(PEOPLE)
    code, start, said = _ctrl_c_once_parked(["find", "--file", str(people)], env)
    assert "up to 2 later pass(es)" in start
    assert code == 130, said
    partial = tmp_path / "people.found.partial.csv"
    assert "job 1 cancelled after 1 of 2 rows" in said, said
    charged = f"{_find_price()} credit(s) charged for the 1 address(es) found, in its partial"
    assert f"{charged} results; nothing else" in said, said
    assert f"partial results (1 rows): {partial}" in said, said
    assert not (tmp_path / "people.found.csv").exists()
    rows = _rows(partial)
    assert rows[0] == [
        "first_name", "last_name", "domain", "email", "Note",
        "finder_email", "finder_status", "finder_confidence",
    ]  # fmt: skip
    assert len(rows) == 2 and rows[1][:7] == [
        "Alice", "Smith", "acme.test", "old@acme.test", "first", "alice@acme.test", "found",
    ]  # fmt: skip
    assert float(rows[1][7]) > 0
    job, owed = _finder_job(tmp_path)
    assert job.status == "failed", job
    assert job.failed_reason == "cancelled by its owner after 1 of 2 rows"
    assert job.credits_used == owed == _find_price()  # (the find delivered; the ledger agrees)


def test_ctrl_c_mid_pass_in_find_file_keeps_the_rows_its_run_saved(testbed_factory, tmp_path):
    """Stopped while the run still waits for a slow server's greeting (the run in a thread
    of the command, its outcomes in its memory): the row it found is in the partial CSV,
    from the rows the run saved with its progress."""
    world = World.of(
        [
            HostSpec("mx.acme.test", HostBehaviour(mailboxes={"alice"})),
            HostSpec("mx.slow.test", HostBehaviour(mailboxes={"ann"}, greeting_delay=600)),
        ],
        [
            DomainSpec("acme.test", mx=[(10, "mx.acme.test")]),
            DomainSpec("slow.test", mx=[(10, "mx.slow.test")]),
        ],
    )
    env = {**_env(testbed_factory(world), tmp_path), "VERIMAIL_SMTP_CONNECT_TIMEOUT": "600"}
    people = tmp_path / "people.csv"
    people.write_text("first_name,last_name,domain\nAnn,Lee,slow.test\nAlice,Smith,acme.test\n")
    out = tmp_path / "found.csv"
    args = ["find", "--file", str(people), "--out", str(out)]
    code, _, said = _ctrl_c_once_shown(args, env, "progress 1/2:")
    assert code == 130, said
    partial = tmp_path / "found.partial.csv"
    assert f"partial results (1 rows): {partial}" in said, said
    rows = _rows(partial)
    assert [row[:5] for row in rows] == [
        ["first_name", "last_name", "domain", "email", "status"],
        ["Alice", "Smith", "acme.test", "alice@acme.test", "found"],
    ]
    job, owed = _finder_job(tmp_path)
    assert job.failed_reason == "cancelled by its owner after 1 of 2 rows"
    assert job.credits_used == owed == _find_price()


def test_ctrl_c_in_find_file_before_any_row_is_settled_writes_no_partial_file(
    testbed_factory, tmp_path
):
    """Its one row parked for a retry pass: nothing was looked up to the end, so there is
    no partial file, the command says so, and nothing is charged."""
    env = _env(testbed_factory(_world()), tmp_path)
    people = tmp_path / "people.csv"
    people.write_text("first_name,last_name,domain\nAnn,Lee,busy.test\n")
    code, _, said = _ctrl_c_once_parked(["find", "--file", str(people)], env)
    assert code == 130, said
    assert "job 1 cancelled after 0 of 1 rows" in said, said
    assert "no row was settled: no partial results file" in said, said
    assert "nothing was charged" in said, said
    assert not list(tmp_path.glob("people.found*"))
    job, owed = _finder_job(tmp_path)
    assert job.failed_reason == "cancelled by its owner after 0 of 1 rows"
    assert job.credits_used == owed == 0
